"""The demo's scenario: the built-in default (``default.toml`` in this package) or a file, resized on request.

``--hosts N`` maps the scenario's hosts proportionally onto N hosts before validation: host i of H becomes
hosts ⌊i·N/H⌋ … ⌊(i+1)·N/H⌋-1 in job host lists (so a job keeps its share of the cluster) and host ⌊i·N/H⌋
for faults. When shrinking would leave a job without a host of its own, that is a one-line error saying how
many hosts the scenario needs. Validation itself is :mod:`sentinel.sim.scenario`'s (one line naming the file
and field).
"""

from __future__ import annotations

import re
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from sentinel.demo.outcome import Fault
from sentinel.sim.scenario import (
    PARAMS,
    Scenario,
    ScenarioError,
    host_name,
    parse_scenario,
    read_scenario_document,
)

DEFAULT_NAME = "default"
_HOST_RE = re.compile(r"^host-(\d+)$")


def default_text() -> str:
    """The built-in scenario's TOML text."""
    return (resources.files("sentinel.demo") / "default.toml").read_text(encoding="utf-8")


def read_document(path: Path | None) -> tuple[dict[str, Any], str]:
    """The scenario as a TOML document and its source name; raises :class:`ScenarioError`."""
    if path is None:
        source = f"<built-in {DEFAULT_NAME} scenario>"
        try:
            return tomllib.loads(default_text()), source
        except tomllib.TOMLDecodeError as exc:
            raise ScenarioError(source, None, f"invalid TOML: {exc}") from None
    return read_scenario_document(path), str(path)


def _index(name: Any, field: str, source: str, old: int) -> int:
    match = _HOST_RE.match(name) if isinstance(name, str) else None
    if match is None or int(match.group(1)) >= old:
        raise ScenarioError(
            source, field, f"cannot resize: {name!r} is not one of host-000..{host_name(old - 1)}"
        )
    return int(match.group(1))


def resize(doc: dict[str, Any], hosts: int, source: str) -> dict[str, Any]:
    """A copy of the TOML document with the cluster mapped onto ``hosts`` hosts (see the module doc)."""
    if hosts < 1:
        raise ScenarioError(source, "--hosts", "must be at least 1")
    cluster = doc.get("cluster", {})
    if not isinstance(cluster, dict):
        return doc  # let validation report it
    old = cluster.get("hosts", 16)
    if not isinstance(old, int) or old < 1 or old == hosts:
        return doc

    def start(i: int) -> int:  # first new host of old host i; old host i covers start(i)..start(i+1)-1
        return min(hosts - 1, (2 * i * hosts + old) // (2 * old))

    def span(i: int) -> range:
        return range(start(i), (2 * (i + 1) * hosts + old) // (2 * old))

    out = dict(doc)
    out["cluster"] = {**cluster, "hosts": hosts}
    explicit = [
        job
        for job in doc.get("jobs", []) or []
        if isinstance(job, dict) and isinstance(job.get("hosts"), list)
    ]
    if len(explicit) > hosts:
        raise ScenarioError(
            source,
            "--hosts",
            f"{hosts} hosts are too few: the scenario's {len(explicit)} jobs need a host each",
        )
    owner: dict[int, int] = {}  # new host -> job position
    old_owner: dict[int, int] = {}  # old host -> job position
    wanted: dict[int, list[int]] = {}
    for j, job in enumerate(doc.get("jobs", []) or []):
        if not isinstance(job, dict) or not isinstance(job.get("hosts"), list):
            continue
        mapped: list[int] = []
        for h, name in enumerate(job["hosts"]):
            i = _index(name, f"jobs[{j}].hosts[{h}]", source, old)
            old_owner[i] = j
            mapped.extend(n for n in span(i) if n not in owner and n not in mapped)
        for n in mapped:
            owner[n] = j
        wanted[j] = mapped
    for j, mapped in wanted.items():  # a job smaller than one new host's share takes the nearest free host
        if not mapped:
            first = start(_index(doc["jobs"][j]["hosts"][0], f"jobs[{j}].hosts[0]", source, old))
            free = [n for n in range(hosts) if n not in owner]
            if not free:  # every host is taken: the biggest job gives one up
                donor = max(wanted, key=lambda k: len(wanted[k]))
                free = [min(wanted[donor], key=lambda n: abs(n - first))]
                wanted[donor].remove(free[0])
            pick = min(free, key=lambda n: abs(n - first))
            owner[pick] = j
            mapped.append(pick)
    jobs: list[Any] = []
    for j, job in enumerate(doc.get("jobs", []) or []):
        jobs.append({**job, "hosts": [host_name(n) for n in sorted(wanted[j])]} if j in wanted else job)
    if "jobs" in doc:
        out["jobs"] = jobs
    faults: list[Any] = []
    for f, fault in enumerate(doc.get("faults", []) or []):
        if not (isinstance(fault, dict) and "host" in fault):
            faults.append(fault)
            continue
        i = _index(fault["host"], f"faults[{f}].host", source, old)
        target = start(i)
        if i in old_owner:  # stay on the same job: its new host nearest to where this host went
            target = min(wanted[old_owner[i]], key=lambda n: (abs(n - target), n))
        faults.append({**fault, "host": host_name(target)})
    if "faults" in doc:
        out["faults"] = faults
    return out


def load(path: Path | None, hosts: int | None = None, duration_s: float | None = None) -> Scenario:
    """Read, resize and validate the demo's scenario; raises :class:`ScenarioError` (one line)."""
    doc, source = read_document(path)
    if hosts is not None:
        doc = resize(doc, hosts, source)
    if duration_s is not None:
        doc = {**doc, "duration_s": duration_s}
    scenario = parse_scenario(doc, source)
    if path is None:
        scenario.name = DEFAULT_NAME
    return scenario


def faults_of(scenario: Scenario) -> list[Fault]:
    """The scenario's faults in injection order, as the demo's outcome model sees them."""
    ordered = sorted(scenario.faults, key=lambda f: f.at_s)
    return [
        Fault(
            index=i,
            at_s=f.at_s,
            host=f.host,
            gpu=f.gpu,
            kind=f.kind,
            params={p: getattr(f, p) for p in PARAMS if getattr(f, p) is not None},
        )
        for i, f in enumerate(ordered)
    ]
