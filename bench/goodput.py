"""Effective training time with and without sentinel, on the Llama 3 405B run's interruption mix.

    .venv/bin/python bench/goodput.py [--triage-s S] [--checkpoint-interval-s S] ...

The mix: the 419 unexpected interruptions of the 54-day Llama 3 405B pre-training on 16,384 H100 GPUs, by root
cause (Table 5 of "The Llama 3 Herd of Models", arXiv:2407.21783). Each cause is replayed as a fault of the
simulator (the real agents and the real engine on a virtual clock, ``sentinel sim``) in a 4-host x 8-GPU job:
detection is the first verdict after the fault, naming the first verdict on the faulty host. The rules are time
thresholds (an Xid is faulty as it arrives, a stall is stuck after its wait), not proportional to the job's
size, so the simulated times are used as they are at 16,384 GPUs. Causes sentinel does not see (silent data
corruption) get the same times as without it.

Every interruption stops the whole job; its cost is detection + naming + acting + restart (requeue wait, job
launch, checkpoint reload) + the work since the last checkpoint (half the interval on average). Without
sentinel: the PyTorch NCCL watchdog's default 600 s timeout, then a person triages and acts. The restart
parameters are stated below with their sources; override them with the flags.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgspec

from sentinel.log import setup_logging
from sentinel.sim.runner import run_scenario
from sentinel.sim.scenario import Scenario

DAYS = 54
GPUS = 16_384
INTERRUPTIONS = 419
FAULT_AT_S = 30.0
FAULT_HOST = "host-002"

#: Table 5 of arXiv:2407.21783: cause, interruptions, and the simulator fault that shows it (None: unseen)
CAUSES: list[tuple[str, int, dict[str, Any] | None]] = [
    ("Faulty GPU", 148, {"kind": "xid", "xid": 79, "gpu": 3}),
    ("GPU HBM3 memory", 72, {"kind": "ecc_uncorrectable", "count": 1, "gpu": 3}),
    ("Software bug", 54, {"kind": "hang", "gpu": 3}),
    ("Network switch/cable", 35, {"kind": "port_down", "gpu": 3}),
    ("Host maintenance", 32, {"kind": "host_down"}),
    ("GPU SRAM memory", 19, {"kind": "xid", "xid": 95, "gpu": 3}),
    ("GPU system processor", 17, {"kind": "xid", "xid": 119, "gpu": 3}),
    ("NIC", 7, {"kind": "port_down", "gpu": 3}),
    ("NCCL watchdog timeouts", 7, {"kind": "nccl_net_error", "gpu": 3}),
    ("Silent data corruption", 6, None),
    ("GPU thermal interface + sensor", 6, {"kind": "thermal_throttle", "clock_mhz": 1000, "gpu": 3}),
    ("SSD", 3, {"kind": "host_down"}),
    ("Power supply", 3, {"kind": "host_down"}),
    ("Server chassis", 2, {"kind": "host_down"}),
    ("IO expansion board", 2, {"kind": "host_down"}),
    ("Dependency", 2, {"kind": "hang", "gpu": 3}),
    ("CPU", 2, {"kind": "host_down"}),
    ("System memory", 2, {"kind": "host_down"}),
]


@dataclass(frozen=True)
class Costs:
    #: PyTorch's default collective timeout for NCCL process groups (torch.distributed.init_process_group)
    watchdog_s: float = 600.0
    #: a person finds the culprit from logs (assumption; L4, arXiv:2503.20263, finds 89.9% of diagnoses manual)
    triage_s: float = 1800.0
    #: a person drains the node and requeues the job (assumption)
    manual_action_s: float = 300.0
    #: sentinel's drain + requeue: scontrol round trips (tests/slurm/test_requeue_e2e.py times them)
    sentinel_action_s: float = 2.0
    #: a requeued job waits the credential lifetime before it starts again (slurm.conf cred_expire, default)
    requeue_wait_s: float = 120.0
    #: launch and NCCL initialisation at 16K GPUs (assumption; the Llama 3 paper reports work to cut it)
    launch_s: float = 300.0
    #: checkpoint reload (assumption)
    reload_s: float = 120.0
    #: checkpoint interval; on average half of it is recomputed (assumption)
    checkpoint_interval_s: float = 1800.0


PHASES = ("detect", "name", "act", "restart", "recompute")


def measure(fault: dict[str, Any]) -> tuple[float, float]:
    """(seconds from the fault to the first verdict, to the first verdict on the faulty host) in the sim."""
    scenario = msgspec.convert(
        {
            "seed": 1,
            "duration_s": 150,
            "tick_s": 1.0,
            "cluster": {"hosts": 4, "gpus_per_host": 8},
            "jobs": [{"id": "train", "jitter": 0.1}],
            "faults": [{"at_s": FAULT_AT_S, "host": FAULT_HOST, **fault}],
        },
        Scenario,
    )
    opened = [v for v in run_scenario(scenario).opened if v.opened_at >= FAULT_AT_S]
    if not opened:
        raise SystemExit(f"the simulator opened no verdict for {fault}")
    detected = min(v.opened_at for v in opened) - FAULT_AT_S
    named = min((v.opened_at for v in opened if v.host == FAULT_HOST), default=float("nan")) - FAULT_AT_S
    return detected, named


def phases(costs: Costs, detect: float, name: float, automated: bool) -> dict[str, float]:
    return {
        "detect": detect,
        "name": name,
        "act": costs.sentinel_action_s if automated else costs.manual_action_s,
        "restart": costs.requeue_wait_s + costs.launch_s + costs.reload_s,
        "recompute": costs.checkpoint_interval_s / 2,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, value in Costs().__dict__.items():
        parser.add_argument("--" + name.replace("_", "-"), type=float, default=value)
    args = parser.parse_args(argv)
    costs = Costs(**{name: getattr(args, name) for name in Costs().__dict__})
    setup_logging("sim", "error", stream=sys.stderr)  # each simulated host runs a real agent: keep it quiet
    started = time.process_time()
    measured: dict[str, tuple[float, float]] = {}
    totals = {"with": dict.fromkeys(PHASES, 0.0), "without": dict.fromkeys(PHASES, 0.0)}
    print("| cause | interruptions | sentinel: detect / name (s) | per interruption with / without (s) |")
    print("|---|---:|---|---|")
    for cause, count, fault in CAUSES:
        baseline = phases(costs, costs.watchdog_s, costs.triage_s, automated=False)
        if fault is None:
            ours, seen = baseline, "not seen: as without"
        else:
            key = repr(sorted(fault.items()))
            if key not in measured:
                measured[key] = measure(fault)
            detect, named = measured[key]
            ours = phases(costs, detect, max(0.0, named - detect), automated=True)
            seen = f"{detect:.0f} / {named:.0f}"
        for column, costs_of in (("with", ours), ("without", baseline)):
            for phase, seconds in costs_of.items():
                totals[column][phase] += count * seconds
        print(f"| {cause} | {count} | {seen} | {sum(ours.values()):.0f} / {sum(baseline.values()):.0f} |")
    assert sum(count for _, count, _ in CAUSES) == INTERRUPTIONS
    span = DAYS * 86400.0
    print()
    print(f"{INTERRUPTIONS} interruptions in {DAYS} days on {GPUS} GPUs; each stops the whole job.")
    print("| | effective training time | GPU-hours lost | " + " | ".join(PHASES) + " |")
    print("|---|---:|---:|" + "---:|" * len(PHASES))
    for column in ("with", "without"):
        lost = sum(totals[column].values())
        share = " | ".join(f"{totals[column][p] / lost:.0%}" for p in PHASES)
        print(f"| {column} sentinel | {1 - lost / span:.1%} | {lost * GPUS / 3600:,.0f} | {share} |")
    for column in ("with", "without"):
        worst = max(PHASES, key=lambda p: totals[column][p])
        print(
            f"{column} sentinel, the dominant phase: {worst} ({totals[column][worst] / 3600:.0f} h of the job)"
        )
    goal = 0.97
    print(
        f"{goal:.0%} leaves {(1 - goal) * span / INTERRUPTIONS:.0f} s per interruption for all phases; with sentinel "
        f"restart + recompute alone take {(totals['with']['restart'] + totals['with']['recompute']) / INTERRUPTIONS:.0f} s"
    )
    print(f"(simulated {len(measured)} faults in {time.process_time() - started:.1f} s of CPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
