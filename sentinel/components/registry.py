"""The one registry: every signal once, and the collectors and detectors of the two daemons.

Each signal is a package ``sentinel/components/<name>/`` whose ``signal.py`` declares its
:class:`~sentinel.components.signal.Signal` (record, NVML read or parser, memory, judge, metric families);
its tests are in ``tests/components/<name>/``. Derived from here, never listed again: the agent's NVML
reads and ``/metrics`` (registry order), its collectors (:data:`COLLECTORS`, built by
``sentinel.agent.registry``), the aggregator's detectors (:data:`DETECTORS`, built by
``sentinel.aggregator.engine``) and the hardware judgement's loop over the GPU signals (``hardware.py``), the names
``collect.disabled`` and ``detect.disabled`` accept, and the component and metrics lists of the docs.
"""

from __future__ import annotations

import importlib
from typing import Any, Final

from sentinel.components.clocks.signal import SIGNAL as CLOCKS
from sentinel.components.device.signal import SIGNAL as DEVICE
from sentinel.components.ecc.retired import SIGNAL as RETIRED_PAGES
from sentinel.components.ecc.signal import SIGNAL as ECC
from sentinel.components.exposition import MetricsView, Writer
from sentinel.components.fabric.health import SIGNAL as FABRIC_HEALTH
from sentinel.components.fabric.manager_signal import SIGNAL as FABRIC_MANAGER
from sentinel.components.fabric.signal import SIGNAL as FABRIC
from sentinel.components.hbm.signal import SIGNAL as HBM
from sentinel.components.ib.signal import SIGNAL as IB
from sentinel.components.nccl_debug.signal import SIGNAL as NCCL_DEBUG
from sentinel.components.nccl_ras.signal import SIGNAL as NCCL_RAS
from sentinel.components.netdev.signal import SIGNAL as NETDEV
from sentinel.components.nvlink.signal import SIGNAL as NVLINK
from sentinel.components.pcie.signal import SIGNAL as PCIE
from sentinel.components.rowremap.signal import SIGNAL as ROWREMAP
from sentinel.components.signal import Signal
from sentinel.components.xid.signal import SIGNAL as XID

#: every signal, once, in the order the agent reads and renders them
SIGNALS: Final[tuple[Signal[Any], ...]] = (
    DEVICE,
    CLOCKS,
    PCIE,
    ECC,
    RETIRED_PAGES,
    ROWREMAP,
    NVLINK,
    FABRIC,
    FABRIC_HEALTH,
    XID,
    HBM,
    IB,
    NETDEV,
    FABRIC_MANAGER,
    NCCL_RAS,
    NCCL_DEBUG,
)

#: the agent's collectors in the order it builds and runs them (``nvml`` first: it opens the GPUs); the
#: signals name theirs, the others read the job's side (kernel log, job logs, processes, probe, dumps)
COLLECTORS: Final[tuple[str, ...]] = (
    "nvml",
    "xid",
    "ib",
    "netdev",
    "fabric_manager",
    "kmsg",
    "logs",
    "jobs",
    "nccl_ras",
    "probe",
    "fr_dumps",
)

#: the aggregator's detectors in the order a tick runs them (hardware first: a stall's culprit GPU may be
#: faulty); the signals name theirs, the others judge jobs and hosts
DETECTORS: Final[tuple[str, ...]] = (
    "hardware",
    "stuck",
    "straggler",
    "host_silent",
    "host_health",
    "inventory",
    "network",
    "link_pace",
)

#: the GPU signals (read per GPU through NVML), in registry order
GPU_SIGNALS: Final[tuple[Signal[Any], ...]] = tuple(s for s in SIGNALS if s.scope == "gpu")
#: the GPU signals the hardware detector judges, in precedence order (a tie of kind and action between
#: two findings of one GPU is named by the earlier)
JUDGED: Final[tuple[Signal[Any], ...]] = tuple(
    sorted((s for s in GPU_SIGNALS if s.judge is not None), key=lambda s: s.precedence)
)
#: signal name → its memory type, for the fleet's latches
MEMORY_TYPES: Final[dict[str, type[Any]]] = {
    s.name: s.memory_type for s in GPU_SIGNALS if s.memory_type is not None
}


def _check() -> None:
    names = [s.name for s in SIGNALS]
    if len(set(names)) != len(names):
        raise RuntimeError(f"a signal is registered twice: {names}")
    for signal in SIGNALS:
        if signal.collector not in COLLECTORS or signal.detector not in DETECTORS:
            raise RuntimeError(f"signal {signal.name}: unknown collector or detector")


_check()


def families(signal: Signal[Any]) -> list[tuple[str, str, str]]:
    """(name, type, help) of each family ``signal`` renders (what its ``render`` writes for no GPU)."""
    if signal.render is None:
        return []
    out = Writer()
    signal.render(out, MetricsView([]))
    found: list[tuple[str, str, str]] = []
    helps: dict[str, str] = {}
    for line in out.text().splitlines():
        if line.startswith("# HELP "):
            name, _, doc = line.removeprefix("# HELP ").partition(" ")
            helps[name] = doc
        elif line.startswith("# TYPE "):
            name, _, kind = line.removeprefix("# TYPE ").partition(" ")
            found.append((name, kind, helps.get(name, "")))
    return found


def components_table() -> str:
    """The table of signals: name, scope, collector, detector, summary (docs/components.md)."""
    rows = [
        "| signal | scope | collector | detector | what it reads and concludes |",
        "|---|---|---|---|---|",
    ]
    for s in SIGNALS:
        rows.append(f"| `{s.name}` | {s.scope} | `{s.collector}` | `{s.detector}` | {s.summary} |")
    return "\n".join(rows) + "\n"


SIGNALS_DOC_HEADER = """# Components

Every signal of the registry (`sentinel/components/registry.py`), each with its whole life in its folder
`sentinel/components/<name>/` (docs/architecture.md, "Signals and the registry"): which collector of the
agent reads it, which detector of the aggregator judges it, and the metric families it renders on the
agent's `/metrics` (docs/metrics.md describes the others).

This page is generated by `sentinel config components` from the registry; a test fails when it is out of date.
"""


def components_doc() -> str:
    """docs/components.md: the registry's table and each signal's metric families."""
    parts = [SIGNALS_DOC_HEADER, components_table()]
    for signal in SIGNALS:
        found = families(signal)
        if not found:
            continue
        rows = [f"## `{signal.name}`\n", "| metric | type | what it measures |", "|---|---|---|"]
        rows += [f"| `{name}` | {kind} | {doc.replace('|', '/')} |" for name, kind, doc in found]
        parts.append("\n".join(rows) + "\n")
    return "\n".join(parts)


def alerts(signal: Signal[Any], settings: Any) -> list[Any]:
    """The signal's alert rules for ``settings``: its ``alerts`` hook, else its component's ``alerts.py``
    (``def alerts(settings) -> list[AlertRule]``), else none."""
    hook = signal.alerts or _module_hook(signal, "alerts")
    return hook(settings) if hook is not None else []


def panels(signal: Signal[Any], settings: Any) -> list[Any]:
    """The signal's dashboard panels for ``settings``, found as :func:`alerts` finds its rules."""
    hook = signal.panels or _module_hook(signal, "panels")
    return hook(settings) if hook is not None else []


def _module_hook(signal: Signal[Any], name: str) -> Any:
    try:
        module = importlib.import_module(f"{signal.package}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name is None or not f"{signal.package}.{name}".startswith(exc.name):
            raise  # the module exists and something it imports is missing: a real error
        return None
    return getattr(module, name, None)
