"""The registry of GPU signal components: what the agent renders, what docs list, in one order.

Each component is a package ``sentinel/components/<name>/`` holding the signal's whole life — its record
(``record.py``, the type on the wire and in the rules), its NVML read (``nvml.py``) or text parser
(``parse.py``), its metric families (``metrics.py``) and its policy (``rule.py``); its tests are in
``tests/components/<name>/``. The agent's ``/metrics`` is the concatenation of every component's families
in this order; ``sentinel.agent.nvml`` runs the NVML reads; the aggregator's hardware detector runs the rules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from sentinel.components.clocks import metrics as clocks_metrics
from sentinel.components.device import metrics as device_metrics
from sentinel.components.ecc import metrics as ecc_metrics
from sentinel.components.exposition import MetricsView, Writer
from sentinel.components.fabric import metrics as fabric_metrics
from sentinel.components.nvlink import metrics as nvlink_metrics
from sentinel.components.pcie import metrics as pcie_metrics
from sentinel.components.rowremap import metrics as rowremap_metrics
from sentinel.components.xid import metrics as xid_metrics


@dataclass(frozen=True)
class Component:
    name: str
    #: one line for docs: what the signal is and what it can conclude
    summary: str
    render: Callable[[Writer, MetricsView], None]


COMPONENTS: Final[tuple[Component, ...]] = (
    Component(
        "device",
        "NVML device health: identity, lost / unresponsive / unavailable GPUs, GPU count vs expected",
        device_metrics.render,
    ),
    Component(
        "clocks",
        "clocks, clock-event (throttle) reasons, temperature, power: thermal and power stragglers",
        clocks_metrics.render,
    ),
    Component(
        "pcie",
        "PCIe throughput, replays, link generation / width now vs max: a flapping or mistrained link",
        pcie_metrics.render,
    ),
    Component(
        "ecc",
        "ECC counters and retired pages: uncorrectable errors, SRAM thresholds, worn-out boards",
        ecc_metrics.render,
    ),
    Component(
        "rowremap",
        "row remapping: pending remaps that need a reset, remap failures that need an RMA",
        rowremap_metrics.render,
    ),
    Component("nvlink", "NVLink state and error counters: links down, error rates", nvlink_metrics.render),
    Component(
        "fabric",
        "fabric-manager registration and clique (NVSwitch systems): an unregistered GPU hangs NCCL init",
        fabric_metrics.render,
    ),
    Component(
        "xid",
        "Xid events from NVML and the kernel log, merged; severity and action from the one catalog",
        xid_metrics.render,
    ),
)


def render_gpu_metrics(view: MetricsView) -> str:
    """Every component's families for one host, in registry order."""
    out = Writer()
    for component in COMPONENTS:
        component.render(out, view)
    return out.text()
