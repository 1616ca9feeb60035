"""NVLink through NVML: which links exist (asked once, at open), their state, and their error counters.

The counters of every link come from one batched ``nvmlDeviceGetFieldValues`` call per GPU (the GPU
source makes it, together with the other components' field values): 18 links x 8 counters as separate
``nvmlDeviceGetNvLinkErrorCounter`` calls would be ~150 driver round trips per GPU per slow tick. The
per-link fields take the link as their scope id. NVML answers per value, so a counter this GPU does not
have (the data-link CRC/replay/recovery counters on Blackwell, symbol errors before it) answers
NOT_SUPPORTED once and is not asked again.
"""

from __future__ import annotations

from typing import Any, Final

import pynvml

from sentinel.components.nvlink.record import NvLink
from sentinel.components.nvml_read import FieldAnswers, FieldRequest, Get, GpuLostError

MAX_LINKS = int(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18))
_NOT_SUPPORTED = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)


def _fi(name: str, default: int) -> int:
    return int(getattr(pynvml, name, default))


#: record attribute → NVML field id, scoped per link (scope id = link)
SCOPED: Final[dict[str, int]] = {
    "crc_errors": _fi("NVML_FI_DEV_NVLINK_ERROR_DL_CRC", 163),
    "replay_errors": _fi("NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY", 161),
    "recovery_errors": _fi("NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY", 162),
    "symbol_errors": _fi("NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS", 221),
    "effective_errors": _fi("NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS", 219),
    "recovery_failed": _fi("NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS", 214),
    "symbol_ber": _fi("NVML_FI_DEV_NVLINK_COUNT_SYMBOL_BER", 222),
    "effective_ber": _fi("NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_BER", 220),
}
#: the data CRC counter exists only as one field id per link, for links 0-11 (NVML has none for 12-17)
CRC_DATA: Final[tuple[int, ...]] = tuple(
    _fi(f"NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L{link}", default)
    for link, default in enumerate((39, 40, 41, 42, 43, 44, 102, 103, 104, 105, 106, 107))
)
_BER = frozenset({"symbol_ber", "effective_ber"})
#: the BER fields pack ``mantissa * 10^-exponent`` (NVML_NVLINK_BER_MANTISSA_* / _EXP_* in nvml.h)
BER_MANTISSA_SHIFT, BER_MANTISSA_MASK = 8, 0xF
BER_EXP_SHIFT, BER_EXP_MASK = 0, 0xFF


def decode_ber(raw: int) -> float:
    mantissa = (raw >> BER_MANTISSA_SHIFT) & BER_MANTISSA_MASK
    exponent = (raw >> BER_EXP_SHIFT) & BER_EXP_MASK
    return float(mantissa) * 10.0 ** (-exponent)


def probe_links(index: int, handle: Any, max_links: int = MAX_LINKS) -> list[int]:
    """Links that exist: NVML answers NOT_SUPPORTED / INVALID_ARGUMENT for the others (asked once, at open)."""
    links: list[int] = []
    for link in range(max_links):
        try:
            pynvml.nvmlDeviceGetNvLinkState(handle, link)
        except pynvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == pynvml.NVML_ERROR_GPU_IS_LOST:
                raise GpuLostError(f"GPU {index}: GPU is lost") from None
            if code in _NOT_SUPPORTED and link == 0:
                break
            continue
        links.append(link)
    return links


def field_requests(links: list[int]) -> list[FieldRequest]:
    """Every counter of every link, for the GPU's one field-values call."""
    out: list[FieldRequest] = []
    for link in links:
        out.extend((f"nvlink{link}.{attr}", field, link) for attr, field in SCOPED.items())
        if link < len(CRC_DATA):
            out.append((f"nvlink{link}.crc_data_errors", CRC_DATA[link], 0))
    return out


def read(get: Get, gpu: int, h: Any, links: list[int], values: FieldAnswers) -> list[NvLink] | None:
    """Each link's state (its own call: the field-values state field is not on every driver) and its
    counters from ``values``, the answers to :func:`field_requests`."""
    if not links:
        return None
    out: list[NvLink] = []
    for link in links:
        state = get(gpu, f"nvlink{link}_state", pynvml.nvmlDeviceGetNvLinkState, h, link)
        counters: dict[str, Any] = {}
        prefix = f"nvlink{link}."
        for attr in (*SCOPED, "crc_data_errors"):
            value = values.get(prefix + attr)
            if value is None or value < 0:
                continue
            counters[attr] = decode_ber(int(value)) if attr in _BER else int(value)
        out.append(NvLink(link=link, active=bool(state) if state is not None else False, **counters))
    return out
