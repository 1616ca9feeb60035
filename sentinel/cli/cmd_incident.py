"""``sentinel incident list|show ID``: incident timelines gathered by the aggregator.

Reads the aggregator's API (``--api URL``, default http://127.0.0.1:9400) or, with ``--state-dir``, its state
directory directly (on the aggregator host, also when the aggregator is down).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import msgspec

from sentinel.aggregator.goodput import phases_of
from sentinel.aggregator.incidents import IncidentStore

MAX_RESPONSE_BYTES = 256 * 1024 * 1024


class IncidentError(Exception):
    """One line saying what went wrong."""


DESCRIPTION = """sentinel incident list|show ID: incident timelines gathered by the aggregator.

Reads the aggregator's API (--api URL, default http://127.0.0.1:9400) or, with --state-dir, its state
directory directly (on the aggregator host, also when the aggregator is down).
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "incident",
        help="list and show incident timelines gathered by the aggregator",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--api", default="http://127.0.0.1:9400", help="aggregator base URL (default %(default)s)"
    )
    source.add_argument(
        "--state-dir", type=Path, help="read the aggregator's state directory instead of its API"
    )
    sub = p.add_subparsers(dest="incident_command", metavar="SUBCOMMAND", required=True)
    ls = sub.add_parser(
        "list", help="one line per incident, newest first", description="one line per incident"
    )
    ls.add_argument("--json", action="store_true", help="print the list as JSON")
    ls.set_defaults(func=run)
    show = sub.add_parser(
        "show", help="print one incident's merged timeline", description="print one incident"
    )
    show.add_argument("id", help="incident id (from 'sentinel incident list')")
    show.add_argument("--json", action="store_true", help="print the whole incident document as JSON")
    show.add_argument(
        "--types", default="event,verdict,heads,procs,sample", help="entry types shown (comma list)"
    )
    show.add_argument(
        "--limit", type=int, default=2000, help="show at most this many timeline entries (latest)"
    )
    show.set_defaults(func=run)


def _get(api: str, path: str) -> Any:
    url = api.rstrip("/") + path
    if not url.startswith(("http://", "https://")):
        raise IncidentError(f"--api {api}: not an http(s) URL")
    try:
        with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 (scheme checked above)
            raw = response.read(MAX_RESPONSE_BYTES + 1)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise IncidentError(f"{url}: not found") from None
        raise IncidentError(f"{url}: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise IncidentError(f"{url}: cannot connect: {reason}") from None
    if len(raw) > MAX_RESPONSE_BYTES:
        raise IncidentError(f"{url}: response larger than {MAX_RESPONSE_BYTES} bytes")
    try:
        return json.loads(raw)
    except ValueError:
        raise IncidentError(f"{url}: response is not JSON") from None


def _store(path: Path) -> IncidentStore:
    if not (path / "incidents.sqlite3").is_file():
        raise IncidentError(f"{path}: no incidents database (incidents.sqlite3) in this directory")
    try:
        return IncidentStore(path)
    except Exception as exc:
        raise IncidentError(f"{path}: cannot open the incidents database: {exc}") from None


def _ts(t: Any) -> str:
    if not isinstance(t, int | float):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1000):03d}Z"


def _describe(entry: dict[str, Any]) -> str:
    data = entry.get("data") or {}
    kind = entry.get("type")
    if kind == "verdict":
        where = f"gpu {data.get('gpu')}" if data.get("gpu") is not None else ""
        rank = f" rank {data.get('rank')}" if data.get("rank") is not None else ""
        return (
            f"VERDICT {data.get('kind')} {data.get('reason')} -> {data.get('action')} {where}{rank}".rstrip()
        )
    if kind == "event":
        bits = [str(data.get("kind", "event"))]
        if data.get("line_kind"):
            bits.append(str(data["line_kind"]))
        if data.get("gpu") is not None:
            bits.append(f"gpu {data['gpu']}")
        record = data.get("record")
        xid = record.get("xid") if isinstance(record, dict) else data.get("xid")
        if xid is not None:
            bits.append(f"xid {xid}")
        text = str(data.get("text", ""))[:160]
        return " ".join(bits) + (f": {text}" if text else "")
    if kind == "sample":
        state = data.get("state", "ok")
        return (
            f"gpu {data.get('gpu')} {state} util {data.get('util_gpu_pct', '-')}% temp {data.get('temp_c', '-')}C "
            f"sm {data.get('sm_clock_mhz', '-')}MHz"
        )
    if kind == "heads":
        pgs = data.get("pgs") or []
        listed = [f for pg in pgs if isinstance(pg, dict) for f in pg.get("in_flight") or []]
        unconfirmed = sum(1 for f in listed if isinstance(f, dict) and f.get("unconfirmed"))
        done = [pg.get("last_completed_seq") for pg in pgs if isinstance(pg, dict)]
        tail = f" ({unconfirmed} unconfirmed)" if unconfirmed else ""
        return f"heads rank {data.get('rank')} completed {done} in flight {len(listed)}{tail}"
    if kind == "procs":
        return f"procs {json.dumps(data)[:160]}"
    return json.dumps(data)[:160]


def _print_list(items: list[dict[str, Any]]) -> None:
    if not items:
        print("no incidents")
        return
    for item in items:
        where = item.get("job") or f"{item.get('host')}/gpu{item.get('gpu')}"
        missing = item.get("missing_hosts") or []
        print(
            f"{item['id']}  {_ts(item.get('created_at'))}  {item.get('kind')}/{item.get('reason')}  {where}  "
            f"{len(item.get('hosts') or [])} host(s), {item.get('entries')} entries"
            + (f", {len(missing)} host(s) did not answer" if missing else "")
        )


def _print_fr_dump(fr: Any) -> None:
    """The job-wide flight-recorder dump and its analysis (stuck incidents)."""
    if not isinstance(fr, dict):
        return
    ranks = fr.get("ranks") or []
    line = f"  flight recorder: {fr.get('state')}, dumps of {len(ranks)} rank(s)"
    missing = fr.get("missing_hosts") or []
    if missing:
        line += f"; no answer from {', '.join(str(h) for h in missing)}"
    print(line)
    if fr.get("error"):
        print(f"    error: {fr['error']}")
    analysis = fr.get("analysis")
    if not isinstance(analysis, dict):
        return
    culprits = ",".join(str(r) for r in analysis.get("culprit_ranks") or []) or "none"
    print(
        f"    analysis: {analysis.get('verdict')}, culprit rank(s) {culprits}: {analysis.get('summary', '')}"
    )
    coll = analysis.get("collective")
    if isinstance(coll, dict):
        print(
            f"    collective: {coll.get('op')} pg {coll.get('pg_name')} ({coll.get('pg_desc')}) seq {coll.get('seq')}"
        )
    for finding in (analysis.get("findings") or [])[:20]:
        print(f"    - {finding}")


PHASES = (
    ("fault_at", "fault"),
    ("detected_at", "detected"),
    ("named_at", "named"),
    ("drained_at", "drained"),
    ("requeued_at", "requeued"),
    ("resumed_at", "resumed"),
)


def phases_line(incident: dict[str, Any]) -> str | None:
    """Each phase the incident went through, timed from the one before, and the GPU time it cost."""
    phases = incident.get("phases")
    if not isinstance(phases, dict):
        return None
    parts: list[str] = []
    previous: float | None = None
    for key, name in PHASES:
        t = phases.get(key)
        if not isinstance(t, int | float):
            continue
        parts.append(f"{name} {_ts(t)}" if previous is None else f"{name} +{t - previous:.1f} s")
        previous = float(t)
    if not parts:
        return None
    open_ = "" if isinstance(phases.get("resumed_at"), int | float) else " (not resumed)"
    lost = incident.get("gpu_seconds_lost")
    hours = f"; {lost / 3600:.2f} GPU-hours lost" if isinstance(lost, int | float) else ""
    return "phases: " + " -> ".join(parts) + open_ + hours


def _print_incident(incident: dict[str, Any], types: set[str], limit: int) -> None:
    print(
        f"incident {incident.get('id')}  created {_ts(incident.get('created_at'))}  job {incident.get('job') or '-'}"
    )
    for v in incident.get("verdicts") or []:
        print(
            f"  verdict {v.get('id')}: {v.get('kind')} {v.get('reason')} -> {v.get('action')} on {v.get('host')} gpu {v.get('gpu')} rank {v.get('rank')}"
        )
        for line in v.get("evidence") or []:
            print(f"    - {line}")
    line = phases_line(incident)
    if line:
        print(f"  {line}")
    hosts = incident.get("hosts") or []
    print(f"  hosts asked: {len(hosts)}; missing: {', '.join(incident.get('missing_hosts') or []) or 'none'}")
    for problem in incident.get("problems") or []:
        print(f"  note: {problem}")
    _print_fr_dump(incident.get("fr_dump"))
    timeline = [e for e in incident.get("timeline") or [] if isinstance(e, dict) and e.get("type") in types]
    if len(timeline) > limit:
        print(f"  (showing the last {limit} of {len(timeline)} entries)")
        timeline = timeline[-limit:]
    print("  timeline:")
    for entry in timeline:
        print(f"  {_ts(entry.get('t'))}  {entry.get('host') or ''!s:<14} {_describe(entry)}")


def run(args: argparse.Namespace) -> int:
    try:
        if args.incident_command == "list":
            if args.state_dir is not None:
                items = _store(args.state_dir).list()
            else:
                items = _get(args.api, "/api/v1/incidents").get("incidents", [])
            if args.json:
                print(json.dumps(items, indent=2))
            else:
                _print_list(items)
            return 0
        incident_id = args.id
        found: dict[str, Any]
        if args.state_dir is not None:
            stored = _store(args.state_dir).get(incident_id)
            if stored is None:
                raise IncidentError(f"{args.state_dir}: no incident {incident_id!r}")
            # the document the API serves; the ledger lives in the aggregator: phases from the verdicts
            found = msgspec.to_builtins(msgspec.structs.replace(stored, phases=phases_of(stored.verdicts)))
        else:
            found = _get(args.api, "/api/v1/incidents/" + urllib.parse.quote(incident_id, safe=""))
        if args.json:
            print(json.dumps(found, indent=2))
        else:
            types = {t.strip() for t in args.types.split(",") if t.strip()}
            _print_incident(found, types, max(1, args.limit))
        return 0
    except IncidentError as exc:
        print(f"sentinel incident: {exc}", file=sys.stderr)
        return 2
