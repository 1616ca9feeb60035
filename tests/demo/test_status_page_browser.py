"""The status page's JavaScript in headless Chromium against a canned API (no aggregator needed).

Checks what the page makes of the contract's JSON: open verdicts as rows, problem GPUs only (a silent host
as one row), jobs, incidents with a timeline, and that text from the API is never interpreted as HTML.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from sentinel.web import add_status_page
from tests.demo.chromium import dump_dom
from tests.support import need_binary

NOW = 1_800_000_000.0


def canned_app(
    n_hosts: int, jobs: list[dict[str, Any]] | None = None, more_verdicts: list[dict[str, Any]] | None = None
) -> web.Application:
    hosts = [
        {
            "host": f"host-{i:04d}",
            "cluster": f"cl{i % 2}",
            "connected": i != 5,
            "gpus": [{"index": g, "state": "lost" if (i, g) == (9, 3) else "ok"} for g in range(8)],
        }
        for i in range(n_hosts)
    ]
    verdicts = [
        {
            "id": "v1",
            "kind": "stuck",
            "host": "host-0013",
            "gpu": 2,
            "job": "ft",
            "rank": 10,
            "reason": "not_entered_collective",
            "action": "restart_app",
            "evidence": ["rank 10 never entered"],
            "opened_at": NOW,
            "state": "open",
        },
        {
            "id": "v2",
            "kind": "faulty",
            "host": "host-0010",
            "gpu": 6,
            "job": None,
            "rank": None,
            "reason": "xid_79",
            "action": "reboot",
            "evidence": ["<img src=x onerror=alert(1)>"],
            "opened_at": NOW,
            "state": "open",
        },
        {
            "id": "v3",
            "kind": "degraded",
            "host": "host-0007",
            "gpu": 1,
            "reason": "row_remap_pending",
            "action": "reset_gpu",
            "evidence": [],
            "opened_at": NOW,
            "state": "closed",
        },
    ]
    verdicts += more_verdicts or []
    if jobs is None:
        jobs = [
            {"id": "ft", "state": "stalled", "ranks": 32, "hosts": [f"host-{i:04d}" for i in range(12, 16)]}
        ]
    incidents = [{"id": "i1", "job": "ft", "opened_at": NOW, "kind": "stuck"}]
    incident = {  # the shape of sentinel.aggregator.incidents: entries {t, host, type, data}
        "id": "i1",
        "job": "ft",
        "hosts": ["host-0013"],
        "missing_hosts": [],
        "verdicts": [verdicts[0]],
        "phases": {
            "fault_at": NOW - 10,
            "detected_at": NOW - 6,
            "named_at": NOW - 6,
            "drained_at": NOW - 5,
            "requeued_at": None,
            "resumed_at": None,
        },
        "gpu_seconds_lost": 324.0,
        "evidence": {  # the shape of sentinel.aggregator.evidence.EvidenceReport
            "state": "done",
            "finished_at": NOW - 1,
            "missing_hosts": [],
            "problems": [],
            "hosts": {
                "host-0013": {
                    "host": "host-0013",
                    "t": NOW - 1,
                    "stacks": [
                        {
                            "pid": 4242,
                            "gpu": 2,
                            "job": "ft",
                            "rank": 10,
                            "threads": [
                                {
                                    "thread_id": 4242,
                                    "name": "MainThread",
                                    "frames": [
                                        {
                                            "name": "all_reduce",
                                            "file": "torch/distributed/c10d.py",
                                            "line": 2501,
                                        },
                                        {"name": "train_step", "file": "train.py", "line": 129},
                                    ],
                                }
                            ],
                        }
                    ],
                    "refused": {"99": "not a rank of a job on this host's GPUs"},
                    "kernel": [{"t": NOW - 7, "text": "NVRM: <b>Xid</b> 79"}],
                    "gpus": [{"gpu": 2, "xml": "<nvidia_smi_log></nvidia_smi_log>", "read_at": NOW - 2}],
                    "cut": [],
                }
            },
        },
        "timeline": [
            {
                "t": NOW - 6,
                "host": "host-0013",
                "type": "sample",
                "data": {
                    "gpu": 2,
                    "util_gpu_pct": 0.0,
                    "temp_c": 35.2,
                    "sm_clock_mhz": 345.0,
                    "throttle": ["gpu_idle"],
                },
            },
            {
                "t": NOW - 5,
                "host": "host-0013",
                "type": "heads",
                "data": {
                    "rank": 10,
                    "pgs": [{"pg_name": "ft:tp1", "last_completed_seq": 40, "in_flight": []}],
                },
            },
            {
                "t": NOW - 4,
                "host": "host-0013",
                "type": "event",
                "data": {"kind": "log", "gpu": 2, "severity": "warning", "text": "NCCL WARN <b>bold</b>"},
            },
            {"t": NOW, "host": "host-0013", "type": "verdict", "data": verdicts[0]},
        ],
    }

    def route(data: Any) -> Any:
        async def handler(_: web.Request) -> web.Response:
            return web.json_response(data)

        return handler

    app = web.Application()
    add_status_page(app)
    app.router.add_get("/api/v1/hosts", route(hosts))
    app.router.add_get("/api/v1/verdicts", route(verdicts))
    app.router.add_get("/api/v1/jobs", route({"jobs": jobs}))  # the page takes a list or an envelope
    app.router.add_get("/api/v1/incidents", route(incidents))
    app.router.add_get("/api/v1/incidents/i1", route(incident))
    return app


def rows(dom: str, cls: str) -> list[dict[str, str]]:
    out = []
    for tag in re.findall(r"<tr\b[^>]*>", dom):
        attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', tag))
        if attrs.get("class") == cls:
            out.append({k.removeprefix("data-"): v for k, v in attrs.items()})
    return out


async def test_page_renders_the_api(tmp_path: Path) -> None:
    chromium = need_binary("chromium")
    server = TestServer(canned_app(16), host="127.0.0.1")
    await server.start_server()
    try:
        dom = await dump_dom(chromium, str(server.make_url("/")), tmp_path / "profile")
        searches = {
            q: await dump_dom(chromium, str(server.make_url("/").with_query(q=q)), tmp_path / f"p{i}")
            for i, q in enumerate(("host-0013/2", "xid_79", "gpu 3"))
        }
    finally:
        await server.close()
    # search narrows every table: host/gpu, a reason, a GPU index
    assert [(r["host"], r["gpu"]) for r in rows(searches["host-0013/2"], "verdict")] == [("host-0013", "2")]
    assert [(r["host"], r["gpu"]) for r in rows(searches["host-0013/2"], "problem")] == [("host-0013", "2")]
    assert [r["job"] for r in rows(searches["host-0013/2"], "job")] == ["ft"]
    assert [r["reason"] for r in rows(searches["xid_79"], "verdict")] == ["xid_79"]
    # (a silent host's row stands for all its GPUs, GPU 3 included)
    assert [(r["host"], r["gpu"]) for r in rows(searches["gpu 3"], "problem")] == [
        ("host-0009", "3"),
        ("host-0005", "all"),
    ]
    verdicts = {(r["kind"], r["host"], r["gpu"]) for r in rows(dom, "verdict")}
    assert verdicts == {("stuck", "host-0013", "2"), ("faulty", "host-0010", "6")}  # closed v3 not shown
    problems = {(r["host"], r["gpu"], r["state"]) for r in rows(dom, "problem")}
    assert problems == {
        ("host-0009", "3", "faulty"),  # lost GPU without a verdict
        ("host-0010", "6", "faulty"),
        ("host-0013", "2", "stuck"),
        ("host-0005", "all", "silent"),  # a silent host is one row
    }
    assert [(r["job"], r["state"]) for r in rows(dom, "job")] == [("ft", "stalled")]
    assert "16 hosts · 128 GPUs" in dom
    # the newest incident's timeline is shown, each entry type in words
    timeline = re.search(r'<div id="timeline"[^>]*>(.*?)</div>', dom, re.S)
    assert timeline is not None
    text = timeline.group(1)
    assert "incident i1 — job ft" in text and "4 entries from 1 hosts" in text
    # the incident's phases, each from the one before, and the GPU time it cost so far
    assert "→ detected +4.0 s → named +0.0 s → drained +1.0 s (not resumed); 0.09 GPU-hours lost" in text
    assert "host-0013 gpu 2  sample   0% 35°C 345 MHz gpu_idle" in text
    assert "rank 10: ft:tp1 done 40" in text
    assert "NCCL WARN &lt;b&gt;bold&lt;/b&gt;" in text
    assert "VERDICT stuck not_entered_collective → restart_app (rank 10 never entered)" in text
    assert "&lt;img src=x onerror=alert(1)&gt;" in dom and "<img src=x" not in dom
    # and its evidence before action: each rank's innermost frames, refusals, kernel lines, GPU snapshots
    evidence = re.search(r'<div id="evidence"[^>]*>(.*?)</div>', dom, re.S)
    assert evidence is not None
    text = evidence.group(1)
    assert "evidence before action: done" in text
    assert (
        "rank 10 pid 4242 gpu 2\n    thread MainThread\n      all_reduce (torch/distributed/c10d.py:2501)"
        in text
    )
    assert "train_step (train.py:129)" in text
    assert "rank 99 refused: not a rank of a job on this host's GPUs" in text
    assert "kernel NVRM: &lt;b&gt;Xid&lt;/b&gt; 79" in text
    assert "GPU 2: nvidia-smi snapshot, 33 chars" in text
    # each open verdict links its runbook, and the runbook exists in the repository
    links = re.findall(r'<a href="([^"]*)"[^>]*>runbook</a>', dom)
    assert sorted(links) == ["docs/runbooks/SentinelGpuCriticalXid.md", "docs/runbooks/SentinelJobStalled.md"]
    assert all((Path(__file__).resolve().parents[2] / link).is_file() for link in links)
    assert re.search(r'<span id="conn"[^>]*data-state="ok"[^>]*>live<', dom)  # the page says it is live


async def test_page_copes_with_a_49152_gpu_fleet(tmp_path: Path) -> None:
    chromium = need_binary("chromium")
    server = TestServer(canned_app(6144), host="127.0.0.1")
    await server.start_server()
    try:
        dom = await dump_dom(
            chromium, str(server.make_url("/?group=cluster")), tmp_path / "profile", budget_ms=8000
        )
        by_state = await dump_dom(
            chromium, str(server.make_url("/?group=state")), tmp_path / "p2", budget_ms=8000
        )
    finally:
        await server.close()
    # grouped by state, the few problem hosts come first, in their own (big, named) groups
    assert re.findall(r"<h3>([^<]*)</h3>", by_state) == [
        "hosts with faulty GPUs — 2 hosts, 16 GPUs",
        "hosts with stuck GPUs — 1 host, 8 GPUs",
        "hosts with silent GPUs — 1 host, 8 GPUs",
        "healthy hosts — 6,140 hosts, 49,120 GPUs",
    ]
    assert "6,144 hosts · 49,152 GPUs" in dom
    # only problem GPUs get rows; the grid is two canvases (one per cluster), not 49,152 elements
    assert len(rows(dom, "problem")) == 4
    assert dom.count("<canvas") == 2
    assert len(dom) < 200_000


def real_jobs() -> list[dict[str, Any]]:
    """Two jobs as the aggregator's ``/api/v1/jobs`` answers them (``views.job_summary`` of a real engine):
    "pretrain" on host-0001 and host-0002, "eval" on host-0003."""
    from sentinel.aggregator.engine import Engine
    from sentinel.aggregator.views import job_summary
    from sentinel.wire import Batch, ProcInfo
    from tests.aggregator.helpers import hello

    engine = Engine()
    placement = {"host-0001": ("pretrain", 0), "host-0002": ("pretrain", 8), "host-0003": ("eval", 0)}
    for name, (job, first_rank) in placement.items():
        view = engine.hello(hello(name, 8), NOW)
        procs = [ProcInfo(gpu=g, pid=100 + g, job_id=job, rank=first_rank + g) for g in range(8)]
        engine.ingest(view, Batch(seq=0, t=NOW, procs=procs), NOW)
    return [job_summary(engine, job) for job in engine.fleet.jobs.values()]


def test_job_summary_names_the_hosts_of_a_job() -> None:
    jobs = {j["id"]: j for j in real_jobs()}
    assert jobs["pretrain"]["host_names"] == ["host-0001", "host-0002"] and jobs["pretrain"]["hosts"] == 2
    assert jobs["eval"]["host_names"] == ["host-0003"]


async def test_a_host_search_keeps_the_jobs_on_that_host(tmp_path: Path) -> None:
    """Searching a host narrows the host tables and keeps the jobs running on it in the Jobs table (it
    used to empty the Jobs table: the page had no host names for a job)."""
    chromium = need_binary("chromium")
    app = canned_app(16, jobs=real_jobs())
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        doms = {
            q: await dump_dom(chromium, str(server.make_url("/").with_query(q=q)), tmp_path / f"p{i}")
            for i, q in enumerate(("host-0002", "host-0003/4", "host-0009", ""))
        }
    finally:
        await server.close()
    assert [r["job"] for r in rows(doms["host-0002"], "job")] == ["pretrain"]
    assert [r["job"] for r in rows(doms["host-0003/4"], "job")] == ["eval"]
    assert rows(doms["host-0009"], "job") == []  # no job runs there; its lost GPU is still found
    assert [(r["host"], r["gpu"]) for r in rows(doms["host-0009"], "problem")] == [("host-0009", "3")]
    assert sorted(r["job"] for r in rows(doms[""], "job")) == ["eval", "pretrain"]


async def test_a_domain_verdict_paints_every_host_of_the_domain(tmp_path: Path) -> None:
    """An NVLink domain's verdict (no host, ``hosts`` every host of the domain): one row naming them, every
    GPU of each of those hosts faulty, and a search for one of them finds it."""
    chromium = need_binary("chromium")
    domain = {
        "id": "v9",
        "kind": "faulty",
        "host": None,
        "gpu": None,
        "hosts": ["host-0001", "host-0002", "host-0003", "host-0004"],
        "reason": "fabric_domain_down",
        "action": "drain",
        "evidence": ["NVLink domain cluster c clique 7: 12 GPUs on 3 hosts lost their fabric together"],
        "opened_at": NOW,
        "state": "open",
    }
    server = TestServer(canned_app(16, more_verdicts=[domain]), host="127.0.0.1")
    await server.start_server()
    try:
        dom = await dump_dom(chromium, str(server.make_url("/")), tmp_path / "profile")
        found = await dump_dom(chromium, str(server.make_url("/").with_query(q="host-0003")), tmp_path / "q")
    finally:
        await server.close()
    assert "4 hosts: host-0001, host-0002, host-0003, …" in dom
    problems = {(r["host"], r["gpu"], r["state"]) for r in rows(dom, "problem")}
    assert {("host-0003", str(g), "faulty") for g in range(8)} <= problems
    assert ("host-0005", "all", "silent") in problems and ("host-0006", "0", "faulty") not in problems
    assert [r["reason"] for r in rows(found, "verdict")] == ["fabric_domain_down"]
    assert re.search(r'<a href="docs/runbooks/SentinelNvlinkDomainDown.md"[^>]*>runbook</a>', dom)
