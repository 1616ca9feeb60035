"""Scenario files for ``sentinel sim`` and ``sentinel demo`` (contract section 4), loaded and validated.

A scenario is operator input: every problem becomes one :class:`ScenarioError` line naming the file, the
field (``faults[2].host``) and what is wrong, never a traceback and never a silently ignored key.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

FaultKind = Literal[
    "xid",
    "gpu_lost",
    "nvml_hang",
    "row_remap_pending",
    "row_remap_failure",
    "ecc_uncorrectable",
    "nvlink_errors",
    "thermal_throttle",
    "straggler",
    "hang",
    "nccl_net_error",
    "host_down",
    "link_flap",
    "link_degraded",
    "port_down",
    "link_slow",
    "nic_lost",
    "sxid_fatal",
    "xid_storm",
    "xid_recurring",
]
FAULT_KINDS: tuple[str, ...] = FaultKind.__args__  # type: ignore[attr-defined]

#: Faults that concern the whole host (``gpu`` must be omitted).
HOST_FAULTS = frozenset({"host_down", "sxid_fatal"})
#: Faults that hit one GPU, or every GPU of the host when ``gpu`` is omitted (a slow host).
HOST_OR_GPU_FAULTS = frozenset({"straggler"})
#: Faults that name a list of hosts (``hosts``) instead of one ``host``; every GPU of them is hit.
MULTI_HOST_FAULTS = frozenset({"xid_storm"})
#: Parameters each kind requires; any other kind-specific parameter is refused.
REQUIRED_PARAMS: dict[str, tuple[str, ...]] = {
    "xid": ("xid",),
    "ecc_uncorrectable": ("count",),
    "nvlink_errors": ("rate_per_s",),
    "thermal_throttle": ("clock_mhz",),
    "straggler": ("slowdown",),
    "link_degraded": ("rate_gbps",),
    "link_slow": ("slowdown",),
    "sxid_fatal": ("sxid",),
    "xid_storm": ("xid",),
    "xid_recurring": ("xid", "every_s"),
}
PARAMS = ("xid", "count", "rate_per_s", "clock_mhz", "slowdown", "rate_gbps", "sxid", "every_s")
MAX_HOSTS = 16384
MAX_GPUS_PER_HOST = 16
MAX_DURATION_S = 7 * 86400.0
MAX_FAULTS = 10000
MAX_FILE_BYTES = 4 * 1024 * 1024


class ScenarioError(Exception):
    """One line: ``FILE: FIELD: what is wrong``."""

    def __init__(self, source: str, field: str | None, problem: str) -> None:
        problem = " ".join(problem.split())  # one line, whatever the parser said
        if field is not None and not field.isprintable():
            field = field.encode("unicode_escape").decode("ascii")
        self.source = source
        self.field = field
        self.problem = problem
        super().__init__(f"{source}: {field}: {problem}" if field else f"{source}: {problem}")


class ClusterSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    hosts: Annotated[int, msgspec.Meta(ge=1, le=MAX_HOSTS)] = 16
    gpus_per_host: Annotated[int, msgspec.Meta(ge=1, le=MAX_GPUS_PER_HOST)] = 8
    gpu_name: str = "NVIDIA H100 80GB HBM3"


class JobSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    id: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    hosts: list[str] | None = None
    compute_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 0.8
    tp: Annotated[int, msgspec.Meta(ge=1, le=MAX_GPUS_PER_HOST)] | None = None  # default: gpus_per_host
    start_s: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    #: extra symmetric compute jitter per rank and step (0.2: each step takes 80-120 % of the base)
    jitter: Annotated[float, msgspec.Meta(ge=0, le=0.5)] = 0.0
    #: mean seconds between one rank's pauses (GC, data loader); 0: ranks never pause
    pause_every_s: Annotated[float, msgspec.Meta(ge=0, le=1e6)] = 0.0
    #: how long a pause lasts (each one 80-120 % of this)
    pause_s: Annotated[float, msgspec.Meta(gt=0, le=60)] = 2.5
    #: seconds of the step's data-parallel collective across hosts (the part a slow link stretches); unset:
    #: the latency-bound model's few tens of milliseconds
    comm_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] | None = None


class FaultSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    at_s: Annotated[float, msgspec.Meta(ge=0)]
    kind: FaultKind
    #: the host faulted (every kind but ``xid_storm``, which names ``hosts``)
    host: str = ""
    hosts: Annotated[list[str], msgspec.Meta(max_length=MAX_HOSTS)] | None = None
    gpu: Annotated[int, msgspec.Meta(ge=0)] | None = None
    xid: Annotated[int, msgspec.Meta(ge=1, le=65535)] | None = None
    count: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] | None = None
    rate_per_s: Annotated[float, msgspec.Meta(gt=0, le=1e6)] | None = None
    clock_mhz: Annotated[float, msgspec.Meta(gt=0, le=5000)] | None = None
    slowdown: Annotated[float, msgspec.Meta(gt=1, le=100)] | None = None
    rate_gbps: Annotated[float, msgspec.Meta(gt=0, le=3200)] | None = None
    #: sxid_fatal: the NVSwitch SXid the switch driver logs
    sxid: Annotated[int, msgspec.Meta(ge=1, le=99999)] | None = None
    #: xid_recurring: seconds between one occurrence (and the GPU's reset after it) and the next
    every_s: Annotated[float, msgspec.Meta(ge=5, le=1e6)] | None = None
    #: link_slow only: the port's error and congestion counters stay flat (only its throughput tells)
    silent: bool = False


class Scenario(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    seed: int = 0
    duration_s: Annotated[float, msgspec.Meta(gt=0, le=MAX_DURATION_S)] = 300.0
    tick_s: Annotated[float, msgspec.Meta(ge=0.05, le=60)] = 1.0
    cluster: ClusterSpec = msgspec.field(default_factory=ClusterSpec)
    jobs: list[JobSpec] = []
    faults: list[FaultSpec] = []
    name: str = ""

    def host_names(self) -> list[str]:
        return [host_name(i) for i in range(self.cluster.hosts)]

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = msgspec.to_builtins(self)
        return data


#: every simulated host's name matches this glob (the demo binds its agent token to it)
HOST_GLOB = "host-*"


def host_name(index: int) -> str:
    return f"host-{index:03d}"


def fault_to_dict(fault: FaultSpec) -> dict[str, Any]:
    """The fault as injected, without the parameters it does not use (for reports)."""
    data: dict[str, Any] = {"at_s": fault.at_s, "host": fault.host, "gpu": fault.gpu, "kind": fault.kind}
    if fault.hosts is not None:  # a multi-host fault names its hosts instead of one host
        del data["host"]
        data["hosts"] = list(fault.hosts)
    for param in PARAMS:
        value = getattr(fault, param)
        if value is not None:
            data[param] = value
    if fault.silent:
        data["silent"] = True
    return data


def _field_of(error: msgspec.ValidationError) -> tuple[str | None, str]:
    text = str(error)
    marker = " - at `$"
    if marker in text:
        message, _, path = text.partition(marker)
        path = path.rstrip("`").lstrip(".")
    else:
        message, path = text, ""
    if message.startswith("Object contains unknown field `"):
        name = message.split("`")[1]
        return (f"{path}.{name}" if path else name), "unknown field"
    message = message.replace("Expected", "expected", 1).replace("`", "")
    return (path or None), message


def parse_scenario(data: dict[str, Any], source: str = "<scenario>") -> Scenario:
    """Validate a decoded TOML document; raises :class:`ScenarioError`."""
    try:
        scenario = msgspec.convert(data, Scenario, strict=True)
    except msgspec.ValidationError as exc:
        field, problem = _field_of(exc)
        raise ScenarioError(source, field, problem) from None
    _check(scenario, source)
    if not scenario.name:
        scenario.name = Path(source).stem if source != "<scenario>" else "scenario"
    return scenario


def _check(scenario: Scenario, source: str) -> None:
    names = scenario.host_names()
    known = set(names)
    gpus = scenario.cluster.gpus_per_host
    if not math.isfinite(scenario.duration_s):
        raise ScenarioError(source, "duration_s", "must be finite")
    if len(scenario.faults) > MAX_FAULTS:
        raise ScenarioError(source, "faults", f"at most {MAX_FAULTS} faults")
    seen_jobs: set[str] = set()
    host_owner: dict[str, str] = {}
    for j, job in enumerate(scenario.jobs):
        where = f"jobs[{j}]"
        if job.id in seen_jobs:
            raise ScenarioError(source, f"{where}.id", f"duplicate job id {job.id!r}")
        seen_jobs.add(job.id)
        job_hosts = names if job.hosts is None else job.hosts
        if not job_hosts:
            raise ScenarioError(source, f"{where}.hosts", "empty host list")
        if job.tp is not None and gpus % job.tp:
            raise ScenarioError(source, f"{where}.tp", f"must divide gpus_per_host ({gpus})")
        for h, name in enumerate(job_hosts):
            if name not in known:
                raise ScenarioError(
                    source,
                    f"{where}.hosts[{h}]",
                    f"unknown host {name!r} (cluster has {names[0]}..{names[-1]})",
                )
            if name in host_owner:
                raise ScenarioError(
                    source, f"{where}.hosts[{h}]", f"host {name!r} already runs job {host_owner[name]!r}"
                )
            host_owner[name] = job.id
    for i, fault in enumerate(scenario.faults):
        where = f"faults[{i}]"
        if not math.isfinite(fault.at_s):
            raise ScenarioError(source, f"{where}.at_s", "must be finite")
        if fault.kind in MULTI_HOST_FAULTS:
            _check_hosts(fault, where, source, names)
        elif fault.hosts is not None:
            raise ScenarioError(source, f"{where}.hosts", f"not a parameter of kind {fault.kind}: use host")
        elif fault.host not in known:
            raise ScenarioError(
                source,
                f"{where}.host",
                f"host {fault.host!r} out of range (cluster has {names[0]}..{names[-1]})",
            )
        if fault.kind in HOST_FAULTS or fault.kind in MULTI_HOST_FAULTS:
            if fault.gpu is not None:
                raise ScenarioError(source, f"{where}.gpu", f"{fault.kind} is a host fault: omit gpu")
        elif fault.gpu is None and fault.kind not in HOST_OR_GPU_FAULTS:
            raise ScenarioError(source, f"{where}.gpu", f"{fault.kind} needs a gpu index")
        elif fault.gpu is not None and fault.gpu >= gpus:
            raise ScenarioError(source, f"{where}.gpu", f"gpu {fault.gpu} out of range (0..{gpus - 1})")
        required = REQUIRED_PARAMS.get(fault.kind, ())
        for param in PARAMS:
            value = getattr(fault, param)
            if param in required and value is None:
                raise ScenarioError(source, f"{where}.{param}", f"required for kind {fault.kind}")
            if param not in required and value is not None:
                raise ScenarioError(source, f"{where}.{param}", f"not a parameter of kind {fault.kind}")
        if fault.silent and fault.kind != "link_slow":
            raise ScenarioError(source, f"{where}.silent", f"not a parameter of kind {fault.kind}")
        if fault.kind in ("hang", "straggler", "nccl_net_error") and fault.host not in host_owner:
            raise ScenarioError(source, f"{where}.host", f"{fault.kind} needs a job on {fault.host}")


def _check_hosts(fault: FaultSpec, where: str, source: str, names: list[str]) -> None:
    """A multi-host fault names ``hosts`` (known, each once) and neither ``host`` nor ``gpu``."""
    if fault.host:
        raise ScenarioError(source, f"{where}.host", f"{fault.kind} names hosts (a list), not host")
    if not fault.hosts:
        raise ScenarioError(source, f"{where}.hosts", f"required for kind {fault.kind}")
    known = set(names)
    seen: set[str] = set()
    for h, name in enumerate(fault.hosts):
        if name not in known:
            raise ScenarioError(
                source, f"{where}.hosts[{h}]", f"unknown host {name!r} (cluster has {names[0]}..{names[-1]})"
            )
        if name in seen:
            raise ScenarioError(source, f"{where}.hosts[{h}]", f"host {name!r} listed twice")
        seen.add(name)


def _parse_toml(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(source, None, f"invalid TOML: {exc}") from None


def load_scenario_text(text: str, source: str = "<scenario>") -> Scenario:
    return parse_scenario(_parse_toml(text, source), source)


def read_scenario_document(path: Path) -> dict[str, Any]:
    """A scenario file as a TOML document (bounded, UTF-8), before validation; raises ScenarioError."""
    source = str(path)
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ScenarioError(source, None, f"cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ScenarioError(source, None, f"larger than {MAX_FILE_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScenarioError(source, None, f"not UTF-8 text (byte {exc.start})") from None
    return _parse_toml(text, source)


def load_scenario(path: Path) -> Scenario:
    """Read and validate a scenario file; raises :class:`ScenarioError` with a one-line message."""
    return parse_scenario(read_scenario_document(path), str(path))
