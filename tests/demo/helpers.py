"""Small builders shared by the demo tests."""

from __future__ import annotations

from pathlib import Path

from sentinel.config.aggregator import AggregatorConfig
from sentinel.demo.model import DemoInfo, JobView, Snapshot, ViewModel, build_view
from sentinel.demo.outcome import Fault, Verdict


def fault(index: int, at_s: float, host: str, gpu: int | None, kind: str, **params: object) -> Fault:
    return Fault(index=index, at_s=at_s, host=host, gpu=gpu, kind=kind, params=params)


def verdict(
    vid: str,
    kind: str,
    host: str | None,
    gpu: int | None,
    opened_s: float,
    *,
    job: str | None = None,
    rank: int | None = None,
    reason: str = "r",
    action: str = "none",
    evidence: tuple[str, ...] = (),
    state: str = "open",
) -> Verdict:
    return Verdict(
        id=vid,
        kind=kind,
        host=host,
        gpu=gpu,
        job=job,
        rank=rank,
        reason=reason,
        action=action,
        evidence=evidence,
        opened_s=opened_s,
        state=state,
    )


def hosts(n: int) -> list[str]:
    return [f"host-{i:03d}" for i in range(n)]


def view(
    faults: list[Fault],
    verdicts: list[Verdict],
    t_s: float,
    *,
    n_hosts: int = 4,
    gpus: int = 8,
    jobs: tuple[JobView, ...] = (),
    seen: int | None = None,
    down: frozenset[str] = frozenset(),
    gpu_raw: dict[tuple[str, int], str] | None = None,
) -> ViewModel:
    names = hosts(n_hosts)
    info = DemoInfo(
        scenario="test",
        hosts=names,
        gpus_per_host=gpus,
        duration_s=120.0,
        faults=faults,
        url="http://127.0.0.1:1/",
    )
    snap = Snapshot(
        t_s=t_s,
        jobs=jobs,
        hosts_seen=frozenset(names[: n_hosts if seen is None else seen]),
        hosts_down=down,
        gpu_raw=gpu_raw or {},
        verdicts=verdicts,
    )
    return build_view(info, snap)


#: The built-in scenario's four faults compressed into 12 s on 4 hosts (tests/demo/data/short.toml).
SHORT = Path(__file__).parent / "data" / "short.toml"


def tune_for_short_runs(config: AggregatorConfig) -> None:
    """The straggler detector's persistence is sized for minutes; a test of seconds needs it in seconds."""
    straggler = config.detect.straggler
    straggler.eval_interval_s = 1.0
    straggler.ema_window_s = 3.0
    straggler.persistence = 3
