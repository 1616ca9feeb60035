"""A real Prometheus + Alertmanager + webhook receiver on 127.0.0.1 for end-to-end tests.

Everything binds free ports on 127.0.0.1 and lives in a tmp directory; ``async with Stack(...)`` starts the
pieces and stops them (and removes nothing the caller did not give it) whatever happens. Prometheus scrapes
every second and evaluates a test copy of the rules whose ``for:`` durations are scaled down
(:func:`fast_rules`), so alerts that need minutes in production fire within seconds.

The scrape configuration is the one docs/operations.md prescribes: scrape jobs ``sentinel-agent`` and
``sentinel-aggregator``, and sentinel's training-job label kept as ``job`` on sentinel series.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import yaml
from aiohttp import web

T = TypeVar("T")

SCRAPE_INTERVAL = "1s"
#: The relabelling docs/operations.md asks for: Prometheus renames sentinel's `job` (the training job) to
#: `exported_job` to keep its own scrape-job label; move it back on sentinel's series (`up` keeps its job).
METRIC_RELABEL = [
    {"source_labels": ["exported_job"], "target_label": "job"},
    {"regex": "exported_job", "action": "labeldrop"},
]
DURATION_PART = re.compile(r"(\d+)(ms|s|m|h|d)")
UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def alertmanager_binary() -> str | None:
    """Debian installs Alertmanager as prometheus-alertmanager; upstream tarballs as alertmanager."""
    return shutil.which("alertmanager") or shutil.which("prometheus-alertmanager")


def duration_s(text: str) -> float:
    return sum(int(n) * UNIT_S[unit] for n, unit in DURATION_PART.findall(text))


#: Prometheus hands static targets to its scrapers up to 5 s after start, while rules are evaluated at once:
#: until the first scrape, `absent(up{...})` holds. A production `for:` of minutes covers that; the scaled
#: test copy must too.
FOR_FLOOR_S = 6


def fast_rules(
    source: Path, target: Path, *, factor: float = 1 / 30, floor_s: int = FOR_FLOOR_S
) -> dict[str, int]:
    """Copy a rule file with every ``for:`` scaled by ``factor`` (at least ``floor_s`` when it was > 0).

    Returns alert name → test ``for:`` in seconds. Range windows stay as they are: they only need enough
    samples, which a 1 s scrape interval gives.
    """
    data = yaml.safe_load(source.read_text(encoding="utf-8"))
    scaled: dict[str, int] = {}
    for group in data["groups"]:
        group["interval"] = SCRAPE_INTERVAL
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            seconds = duration_s(str(rule.get("for", "0s")))
            new = 0 if seconds == 0 else max(floor_s, round(seconds * factor))
            rule["for"] = f"{new}s"
            scaled[rule["alert"]] = new
    target.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return scaled


async def eventually(
    probe: Callable[[], Awaitable[T]], *, timeout: float, interval: float = 0.25, what: str = "condition"
) -> T:
    """Await ``probe()`` until it returns something truthy; fail with the last value after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = await probe()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")
        await asyncio.sleep(interval)


@dataclass
class WebhookReceiver:
    """An Alertmanager webhook receiver: keeps every notification it is sent."""

    notifications: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0
    _runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/alerts", self._receive)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/alerts"

    async def _receive(self, request: web.Request) -> web.Response:
        self.notifications.append(await request.json())
        return web.Response(text="ok")

    def alerts(self, status: str = "firing") -> list[dict[str, Any]]:
        """Every alert delivered with ``status``, across all notifications."""
        return [
            alert
            for note in self.notifications
            for alert in note.get("alerts", [])
            if alert.get("status") == status
        ]


class _Process:
    """A server subprocess with its log in the work directory, ready when ``ready_path`` answers 200."""

    name = "process"
    ready_path = "/-/ready"

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.log = workdir / f"{self.name}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    async def start(self, session: aiohttp.ClientSession, timeout: float = 20.0) -> None:
        with self.log.open("wb") as log:
            self._proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir
            )

        async def ready() -> bool:
            if self._proc is not None and self._proc.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self._proc.returncode}:\n{self.log_tail()}")
            try:
                async with session.get(self.url + self.ready_path) as response:
                    return response.status == 200
            except aiohttp.ClientError:
                return False

        await eventually(ready, timeout=timeout, what=f"{self.name} ready")

    def stop(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=5)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class Alertmanager(_Process):
    name = "alertmanager"

    def __init__(self, workdir: Path, binary: str, webhook_url: str) -> None:
        super().__init__(workdir)
        self.binary = binary
        config = {
            "route": {
                "receiver": "webhook",
                "group_by": ["alertname", "cluster", "host", "gpu", "job"],
                "group_wait": "0s",
                "group_interval": "1s",
                "repeat_interval": "1h",
            },
            "receivers": [
                {"name": "webhook", "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}
            ],
        }
        self.config = workdir / "alertmanager.yml"
        self.config.write_text(yaml.safe_dump(config), encoding="utf-8")

    def command(self) -> list[str]:
        return [
            self.binary,
            f"--config.file={self.config}",
            f"--storage.path={self.workdir / 'alertmanager-data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address=",  # no HA gossip port
            "--log.level=warn",
        ]


class Prometheus(_Process):
    name = "prometheus"

    def __init__(
        self,
        workdir: Path,
        binary: str,
        *,
        agent_targets: Sequence[str],
        aggregator_targets: Sequence[str],
        rule_files: Sequence[Path],
        alertmanager_port: int | None,
    ) -> None:
        super().__init__(workdir)
        self.binary = binary
        config: dict[str, Any] = {
            "global": {
                "scrape_interval": SCRAPE_INTERVAL,
                "scrape_timeout": SCRAPE_INTERVAL,
                "evaluation_interval": SCRAPE_INTERVAL,
                "external_labels": {"environment": "e2e"},
            },
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": [
                {
                    "job_name": "sentinel-agent",
                    "static_configs": [{"targets": list(agent_targets)}],
                    "metric_relabel_configs": METRIC_RELABEL,
                },
                {
                    "job_name": "sentinel-aggregator",
                    "static_configs": [{"targets": list(aggregator_targets)}],
                    "metric_relabel_configs": METRIC_RELABEL,
                },
            ],
        }
        if alertmanager_port is not None:
            config["alerting"] = {
                "alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{alertmanager_port}"]}]}]
            }
        self.config = workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")

    def command(self) -> list[str]:
        return [
            self.binary,
            f"--config.file={self.config}",
            f"--storage.tsdb.path={self.workdir / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--rules.alert.resend-delay=1s",
            "--log.level=warn",
        ]


class Stack:
    """Prometheus, Alertmanager and a webhook receiver; ``async with`` starts and stops all three."""

    def __init__(
        self,
        workdir: Path,
        *,
        prometheus: str,
        alertmanager: str,
        agent_targets: Sequence[str],
        aggregator_targets: Sequence[str],
        rule_files: Sequence[Path],
    ) -> None:
        self.workdir = workdir
        self.webhook = WebhookReceiver()
        self._binaries = (prometheus, alertmanager)
        self._targets = (list(agent_targets), list(aggregator_targets))
        self.test_for_s: dict[str, int] = {}
        self._rule_copies: list[Path] = []
        for index, path in enumerate(rule_files):
            copy = workdir / f"{index}-{path.name}"
            self.test_for_s.update(fast_rules(path, copy))
            self._rule_copies.append(copy)
        self.session: aiohttp.ClientSession | None = None
        self.alertmanager: Alertmanager | None = None
        self.prometheus: Prometheus | None = None

    async def __aenter__(self) -> Stack:
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        try:
            await self.webhook.start()
            self.alertmanager = Alertmanager(self.workdir, self._binaries[1], self.webhook.url)
            self.prometheus = Prometheus(
                self.workdir,
                self._binaries[0],
                agent_targets=self._targets[0],
                aggregator_targets=self._targets[1],
                rule_files=self._rule_copies,
                alertmanager_port=self.alertmanager.port,
            )
            await asyncio.gather(self.alertmanager.start(self.session), self.prometheus.start(self.session))
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *_: object) -> None:
        for process in (self.prometheus, self.alertmanager):
            if process is not None:
                process.stop()
        await self.webhook.stop()
        if self.session is not None:
            await self.session.close()

    # -- Prometheus API ------------------------------------------------------------------------------------

    async def _get(self, base: str, path: str, params: dict[str, str] | None = None) -> Any:
        assert self.session is not None
        async with self.session.get(base + path, params=params) as response:
            body = await response.text()
            if response.status != 200:
                raise AssertionError(f"GET {path} {params or ''}: HTTP {response.status}: {body[:500]}")
            return json.loads(body)

    async def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query; the result vector (or [] for an empty one)."""
        assert self.prometheus is not None
        data = await self._get(self.prometheus.url, "/api/v1/query", {"query": expr})
        result: list[dict[str, Any]] = data["data"]["result"]
        if data["data"]["resultType"] != "vector":
            return [{"metric": {}, "value": result}] if result else []
        return result

    async def label_values(self, label: str, match: str) -> list[str]:
        """What Grafana's ``label_values(match, label)`` variable query lists."""
        assert self.prometheus is not None
        data = await self._get(self.prometheus.url, f"/api/v1/label/{label}/values", {"match[]": match})
        values: list[str] = data["data"]
        return values

    async def targets_up(self) -> dict[str, list[str]]:
        """Scrape job → health of each of its active targets."""
        assert self.prometheus is not None
        data = await self._get(self.prometheus.url, "/api/v1/targets")
        health: dict[str, list[str]] = {}
        for target in data["data"]["activeTargets"]:
            health.setdefault(target["labels"]["job"], []).append(target["health"])
        return health

    async def rule_groups(self) -> list[dict[str, Any]]:
        assert self.prometheus is not None
        data = await self._get(self.prometheus.url, "/api/v1/rules")
        groups: list[dict[str, Any]] = data["data"]["groups"]
        return groups

    async def firing(self) -> list[dict[str, Any]]:
        """Alerts Prometheus has pending or firing."""
        assert self.prometheus is not None
        data = await self._get(self.prometheus.url, "/api/v1/alerts")
        alerts: list[dict[str, Any]] = data["data"]["alerts"]
        return alerts

    async def alertmanager_alerts(self) -> list[dict[str, Any]]:
        assert self.alertmanager is not None
        alerts: list[dict[str, Any]] = await self._get(self.alertmanager.url, "/api/v2/alerts")
        return alerts

    def logs(self) -> str:
        parts = []
        for process in (self.prometheus, self.alertmanager):
            if process is not None:
                parts.append(f"--- {process.name} ---\n{process.log_tail()}")
        return "\n".join(parts)


@contextlib.asynccontextmanager
async def metrics_server(render: Callable[[], str]) -> Any:
    """A tiny /metrics endpoint on 127.0.0.1 serving ``render()``; yields its ``host:port``."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=render(), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    finally:
        await runner.cleanup()
