"""What an Xid code means for the GPU that raised it — the narrow question the hardware detector asks.

The signals package owns the Xid catalog and its policy; :func:`xid_rule` asks it when it is importable and
falls back to the short table below otherwise (kept deliberately small: the codes a fleet actually sees,
judged from NVIDIA's public Xid catalog). Either way the answer is the same shape, so the detector does not
care where it came from. Application-caused codes (13, 31, 43, 45, ...) never make a GPU faulty.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True, slots=True)
class XidRule:
    xid: int
    kind: str | None  # faulty | degraded | None (no verdict by itself)
    action: str
    cause: str  # hardware | driver | application | unknown
    meaning: str


APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 69})

_FALLBACK: dict[int, tuple[str | None, str, str, str]] = {
    13: (None, "restart_app", "application", "graphics engine exception"),
    31: (None, "restart_app", "application", "GPU memory page fault"),
    43: (None, "none", "application", "GPU stopped processing (reset channel)"),
    45: (None, "none", "application", "preemptive cleanup after another error or a killed process"),
    48: ("faulty", "reset_gpu", "hardware", "double-bit ECC error"),
    61: ("degraded", "reset_gpu", "driver", "internal micro-controller breakpoint"),
    62: ("faulty", "reset_gpu", "hardware", "internal micro-controller halt"),
    63: ("degraded", "reset_gpu", "hardware", "row remapping / page retirement event"),
    64: ("faulty", "reset_gpu", "hardware", "row remapping / page retirement failure"),
    74: ("faulty", "reset_gpu", "hardware", "NVLink error"),
    79: ("faulty", "reboot", "hardware", "GPU has fallen off the bus"),
    92: ("degraded", "none", "hardware", "high single-bit ECC error rate"),
    94: ("degraded", "restart_app", "hardware", "contained ECC error"),
    95: ("faulty", "reset_gpu", "hardware", "uncontained ECC error"),
    109: ("faulty", "reset_gpu", "driver", "context switch timeout"),
    119: ("faulty", "reset_gpu", "driver", "GSP RPC timeout"),
    120: ("faulty", "reset_gpu", "driver", "GSP error"),
    136: ("faulty", "reset_gpu", "hardware", "link training failure"),
    140: ("faulty", "reset_gpu", "hardware", "unrecoverable ECC error escape"),
    143: ("faulty", "reset_gpu", "hardware", "GPU initialization failure"),
    144: ("faulty", "reset_gpu", "hardware", "NVLink SAW error"),
    145: ("faulty", "reset_gpu", "hardware", "NVLink RLW error"),
    146: ("faulty", "reset_gpu", "hardware", "NVLink TLW error"),
    147: ("faulty", "reset_gpu", "hardware", "NVLink NETIR error"),
    148: ("faulty", "reset_gpu", "hardware", "NVLink MSE error"),
    149: ("faulty", "reset_gpu", "hardware", "NVLink error"),
    150: ("faulty", "reset_gpu", "hardware", "NVLink error"),
    154: ("faulty", "reset_gpu", "hardware", "GPU recovery action changed"),
    155: ("faulty", "reset_gpu", "hardware", "NVLink software-defined error"),
}


@lru_cache(maxsize=4096)
def xid_rule(xid: int) -> XidRule:
    """The verdict an Xid implies by itself (``kind`` None: evidence only, no verdict)."""
    fallback = _FALLBACK.get(xid)
    if fallback is None:
        return XidRule(xid=xid, kind=None, action="none", cause="unknown", meaning="unknown Xid")
    kind, action, cause, meaning = fallback
    if xid in APPLICATION_XIDS:
        kind = None
    return XidRule(xid=xid, kind=kind, action=action, cause=cause, meaning=meaning)
