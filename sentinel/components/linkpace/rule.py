"""The link-pace judgement: which of a job's links stands out, and whether the job pays for it.

Pure. Inputs are each link's load over a window (throughput and its wait / congestion / retransmission
rates) for the links serving one job, and the job's pace (its step time against its own baseline, split into
compute and communication). A link stands out when its throughput falls below the median of its peers or a
wait counter rises far above theirs — leave-one-out medians and MADs (:mod:`sentinel.stats`), so neither the
link itself nor a minority of lying links move the yardstick. A finding needs both: a link that stands out
and a job that is slower with the extra time in communication. A job uniformly slower (a smaller input, a
checkpoint: compute or all links alike) and links idle between jobs give nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import msgspec

from sentinel.stats import MAD_SCALE, median_mad, median_without

#: wait, congestion and retransmission counters, judged as rates per second against the job's other links:
#: IB ``port_xmit_wait`` (ticks a port had data and no credit), RoCE CNPs / ECN marks / out-of-sequence /
#: sequence errors / ACK timeouts (mlx5 ``hw_counters``), pause frames where a driver exposes them, and the
#: root qdisc of a plain interface (``overlimits``: waited for a shaper; ``drops``)
WAIT_COUNTERS: tuple[str, ...] = (
    "port_xmit_wait",
    "np_cnp_sent",
    "rp_cnp_handled",
    "np_ecn_marked_roce_packets",
    "out_of_sequence",
    "packet_seq_err",
    "local_ack_timeout_err",
    "implied_nak_seq_err",
    "rx_pause",
    "tx_pause",
    "symbol_error",
    "port_rcv_errors",
    "qdisc_overlimits",
    "qdisc_drops",
    "tx_dropped",
    "rx_dropped",
)


class LinkPaceConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Communication fail-slow (docs/network.md "Link pace" gives the reason behind each default)."""

    enabled: Annotated[bool, msgspec.Meta(description="name the link that slows a job")] = True
    min_slowdown: Annotated[
        float,
        msgspec.Meta(
            ge=0.01,
            le=10,
            description="the job's step time must exceed its own baseline by this share (0.15: 15%); a "
            "healthy job's step time wanders by a few percent",
        ),
    ] = 0.15
    comm_share: Annotated[
        float,
        msgspec.Meta(
            ge=0,
            le=1,
            description="at least this share of the extra step time must be communication (not compute): "
            "a job slower because it computes more is no link's fault",
        ),
    ] = 0.6
    throughput_drop: Annotated[
        float,
        msgspec.Meta(
            gt=0, lt=1, description="a link below its peers' median throughput by this share stands out"
        ),
    ] = 0.3
    wait_ratio: Annotated[
        float,
        msgspec.Meta(
            ge=1, description="a wait counter this many times its peers' median rate (and above it by z MADs)"
        ),
    ] = 4.0
    z: Annotated[float, msgspec.Meta(gt=0, description="robust z (MADs from the peers' median)")] = 4.0
    min_wait_per_s: Annotated[
        float, msgspec.Meta(ge=0, description="a wait counter slower than this per second never stands out")
    ] = 1.0
    idle_bytes_per_s: Annotated[
        float,
        msgspec.Meta(
            ge=0, description="a link carrying less than this is idle: no throughput comparison (1 MB/s)"
        ),
    ] = 1e6
    window_s: Annotated[
        float, msgspec.Meta(ge=4, le=3600, description="links' rates and the job's pace averaged over this")
    ] = 20.0
    baseline_s: Annotated[
        float,
        msgspec.Meta(
            ge=10,
            le=86400,
            description="the job's baseline pace: the median over this much of its history before the window",
        ),
    ] = 300.0
    persistence: Annotated[
        int, msgspec.Meta(ge=1, le=100, description="evaluations in a row before a verdict opens or closes")
    ] = 2
    eval_interval_s: Annotated[float, msgspec.Meta(ge=0.5, le=600, description="evaluation interval")] = 5.0


class LinkLoad(msgspec.Struct, frozen=True, kw_only=True):
    """One link serving the job, averaged over the window."""

    host: str
    link: str  # mlx5_3/1 (an IB port) or netdev:eth2
    bytes_per_s: float  # sent + received
    waits: dict[str, float] = {}  # WAIT_COUNTERS by name, per second
    gpus: tuple[int, ...] = ()
    ranks: tuple[int, ...] = ()

    @property
    def label(self) -> str:
        kind, _, name = self.link.partition(":")
        return f"interface {name}" if kind == "netdev" else f"port {self.link}"


class JobPace(msgspec.Struct, frozen=True, kw_only=True):
    """The job's step time now (the window) and at its baseline, each split into compute and the rest."""

    job: str
    step_s: float
    baseline_step_s: float
    compute_s: float | None = None  # the ranks' median compute per step (None: not measured)
    baseline_compute_s: float | None = None

    @property
    def slowdown(self) -> float:
        """Extra step time as a share of the baseline (0.31: 31% slower)."""
        return self.step_s / self.baseline_step_s - 1.0 if self.baseline_step_s > 0 else 0.0

    @property
    def comm_share(self) -> float | None:
        """Share of the extra step time that is communication / wait (None: compute not measured)."""
        if self.compute_s is None or self.baseline_compute_s is None:
            return None
        extra = self.step_s - self.baseline_step_s
        if extra <= 0:
            return None
        return max(0.0, min(1.0, 1.0 - (self.compute_s - self.baseline_compute_s) / extra))


class Standout(msgspec.Struct, frozen=True, kw_only=True):
    link: LinkLoad
    evidence: tuple[str, ...]


class LinkFinding(msgspec.Struct, frozen=True, kw_only=True):
    """A link that slows its job: where, what it costs, and why."""

    host: str
    link: str
    job: str
    slowdown: float
    gpus: tuple[int, ...]
    ranks: tuple[int, ...]
    evidence: tuple[str, ...]


def _fmt(value: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.1f}{unit}"
    return f"{value:.1f}"


#: up to this many links each is measured against its peers' exact median and MAD; beyond, against the
#: median without it (O(1) on the sorted values) and the MAD of all, which one link cannot move
EXACT_PEERS = 32


class _Peers:
    """Each value's peers: every other value's median and median absolute deviation."""

    def __init__(self, values: Sequence[float]) -> None:
        self.values = values
        self.order = sorted(range(len(values)), key=values.__getitem__)
        self.rank = {i: k for k, i in enumerate(self.order)}
        self.ordered = [values[i] for i in self.order]
        self.mad_all = median_mad(values)[1] if len(values) > EXACT_PEERS else 0.0

    def of(self, i: int) -> tuple[float, float]:
        if len(self.values) <= EXACT_PEERS:
            return median_mad([v for j, v in enumerate(self.values) if j != i])
        return median_without(self.ordered, self.rank[i]), self.mad_all


def standouts(links: Sequence[LinkLoad], cfg: LinkPaceConfig) -> list[Standout]:
    """The links whose throughput falls below their peers' or whose wait counters stand out above them.

    Needs at least two links; at most a minority is named (more standing out is the job's pattern, not a
    link's fault), exactly one of two.
    """
    if len(links) < 2:
        return []
    found: dict[int, list[str]] = {}
    busy = [i for i, link in enumerate(links) if link.bytes_per_s >= cfg.idle_bytes_per_s]
    if len(busy) >= 2:
        rates = [links[i].bytes_per_s for i in busy]
        peers = _Peers(rates)
        for k, i in enumerate(busy):
            med, mad = peers.of(k)
            scale = max(MAD_SCALE * mad, 0.05 * med)
            if rates[k] < med * (1 - cfg.throughput_drop) and med - rates[k] >= cfg.z * scale:
                found.setdefault(i, []).append(
                    f"carries {_fmt(rates[k])}B/s, {1 - rates[k] / med:.0%} below its peers' median "
                    f"{_fmt(med)}B/s"
                )
    names = sorted({name for link in links for name in link.waits})
    for name in names:
        values = [link.waits.get(name, 0.0) for link in links]
        if max(values) < cfg.min_wait_per_s:
            continue  # the common case: no link waits on this counter at all
        peers = _Peers(values)
        for i, value in enumerate(values):
            if value < cfg.min_wait_per_s:
                continue
            med, mad = peers.of(i)
            if value >= cfg.wait_ratio * med and value - med >= cfg.z * MAD_SCALE * mad:
                found.setdefault(i, []).append(
                    f"{name} {_fmt(value)}/s against its peers' median {_fmt(med)}/s"
                )
    limit = 1 if len(links) == 2 else (len(links) - 1) // 2
    if not found or len(found) > limit:
        return []
    return [Standout(link=links[i], evidence=tuple(lines)) for i, lines in sorted(found.items())]


def pace_evidence(pace: JobPace, cfg: LinkPaceConfig) -> str | None:
    """The job's pace as evidence when it is slower with the extra time in communication, else None."""
    if pace.slowdown < cfg.min_slowdown:
        return None
    share = pace.comm_share
    if share is not None and share < cfg.comm_share:
        return None
    line = (
        f"job {pace.job} steps in {pace.step_s * 1000:.0f} ms against its baseline "
        f"{pace.baseline_step_s * 1000:.0f} ms ({pace.slowdown:+.0%})"
    )
    if share is not None and pace.compute_s is not None and pace.baseline_compute_s is not None:
        line += (
            f"; compute {pace.compute_s * 1000:.0f} ms against {pace.baseline_compute_s * 1000:.0f} ms: "
            f"{share:.0%} of the extra time is communication"
        )
    return line


def judge(pace: JobPace, links: Sequence[LinkLoad], cfg: LinkPaceConfig) -> list[LinkFinding]:
    """The links that slow ``pace.job``: standing out among its links while its communication time rose."""
    if not cfg.enabled:
        return []
    slower = pace_evidence(pace, cfg)
    if slower is None:
        return []
    out: list[LinkFinding] = []
    for s in standouts(links, cfg):
        link = s.link
        headline = f"{link.label} on {link.host} slows job {pace.job} by {pace.slowdown:.0%}"
        serves = []
        if link.gpus:
            serves.append(f"GPU {','.join(str(g) for g in link.gpus)}")
        if link.ranks:
            serves.append(f"rank(s) {','.join(str(r) for r in link.ranks)}")
        if serves:
            headline += f" (serves {', '.join(serves)})"
        out.append(
            LinkFinding(
                host=link.host,
                link=link.link,
                job=pace.job,
                slowdown=pace.slowdown,
                gpus=link.gpus,
                ranks=link.ranks,
                evidence=(headline, slower, *(f"{link.label}: {line}" for line in s.evidence)),
            )
        )
    return out
