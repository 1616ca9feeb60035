"""The remediator: carries out the policy on verdicts through Slurm, one action at a time, off the event loop.

One worker task handles verdict changes in order, so two decisions never race. Each drain reads Slurm
first (already drained by sentinel: ``already``; by someone else: refused), then the circuit breaker, then
acts or, with ``dry_run``, says what it would do; resume is opt-in and needs real evidence. Every outcome
goes to the audit log, a counter and the verdict's ``remediation`` record. With an HA pair only the lease
holder acts. A verdict naming several hosts (an NVLink domain's) drains each of them, as its own piece of work
(``<verdict id>@<host>``), when ``drain_domains`` is on. A verdict resting on a yardstick learned from the fleet is refused ``learned_without_quorum``
unless ``learned_quorum`` hosts other than its own hold it (:func:`policy.backed`). See docs/remediation.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from sentinel.aggregator.remediation.audit import AuditLog
from sentinel.aggregator.remediation.flapping import Held, HoldDown
from sentinel.aggregator.remediation.lease import LeaseFile, LeaseState
from sentinel.aggregator.remediation.policy import backed, check_breaker, drain_reason_of, wants_drain
from sentinel.aggregator.remediation.requeue import Requeuer
from sentinel.aggregator.verdicts import Change, Verdict, VerdictBook
from sentinel.config.aggregator import RemediationConfig
from sentinel.log import get_logger
from sentinel.slurm import Slurm, run_command

#: per verdict, the remediation records kept on it (oldest dropped)
MAX_RECORDS_PER_VERDICT = 20
#: queued work items at most; beyond, new work is refused and counted (a flood of verdicts)
MAX_QUEUE = 10_000
#: verdicts remembered as handled or waiting for a retry
MAX_TRACKED = 100_000
BREAKER_REFUSALS = frozenset(
    {"breaker_sentinel_drains", "breaker_sentinel_fraction", "breaker_partition_unavailable"}
)


def log() -> Any:
    return get_logger(module="aggregator.remediation")


class RemediationMetrics:
    def __init__(self, cluster: str, registry: CollectorRegistry | None) -> None:
        r = registry
        self.registry = registry
        self.cluster = cluster
        self.actions = Counter(
            "sentinel_remediation_actions",
            "Remediation decisions carried out, by action (drain, resume, requeue) and outcome (done, dry_run, already, "
            "refused, failed) and reason of a refusal or failure",
            ["cluster", "action", "outcome", "reason"],
            registry=r,
        )
        self.breaker_open = Gauge(
            "sentinel_remediation_breaker_open",
            "1 while the circuit breaker refuses drains (until a drain passes it again)",
            ["cluster"],
            registry=r,
        ).labels(cluster)
        self.mode = Gauge(
            "sentinel_remediation_mode",
            "Remediation mode: 0 off, 1 dry run, 2 acting",
            ["cluster"],
            registry=r,
        ).labels(cluster)
        self.leader = Gauge(
            "sentinel_remediation_leader",
            "1 while this aggregator may act on Slurm (it holds the remediation lease, or needs none)",
            ["cluster"],
            registry=r,
        ).labels(cluster)
        self.lease_errors = Counter(
            "sentinel_remediation_lease_errors",
            "Renewals of the remediation lease that failed (file unreadable, unlockable or slow)",
            ["cluster"],
            registry=r,
        ).labels(cluster)
        self.lease_invalid = Gauge(
            "sentinel_remediation_lease_invalid",
            "1 while the remediation lease file holds another's record whose until lies beyond a term plus "
            "the skew allowance (a clock far ahead, a hand-edited file); taken over once unchanged for a term",
            ["cluster"],
            registry=r,
        ).labels(cluster)
        self.lease_invalid_seen = Counter(
            "sentinel_remediation_lease_invalid_reads",
            "Renewals that found an invalid remediation lease record",
            ["cluster"],
            registry=r,
        ).labels(cluster)
        self.held_down = Gauge(
            "sentinel_remediation_held_down_nodes",
            "Nodes held down: drained resume.hold_down_drains times for the same GPU and reason within "
            "resume.hold_down_window_s, so never resumed automatically",
            ["cluster"],
            registry=r,
        ).labels(cluster)
        self.audit_errors = Counter(
            "sentinel_remediation_audit_errors",
            "Audit log records that could not be written",
            ["cluster"],
            registry=r,
        ).labels(cluster)

    def count(self, action: str, outcome: str, reason: str) -> None:
        self.actions.labels(self.cluster, action, outcome, reason).inc()


class Remediator:
    def __init__(
        self,
        config: RemediationConfig,
        book: VerdictBook,
        *,
        state_dir: Path,
        cluster: str = "default",
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
        slurm: Slurm | None = None,
        env: dict[str, str] | None = None,
        before_drain: Callable[[Verdict], Awaitable[None]] | None = None,
    ) -> None:
        self.config = config
        #: awaited before each drain: the incident's evidence is attached first (aggregator/evidence.py)
        self.before_drain = before_drain
        self.book = book
        self.clock = clock
        self.env = env
        self.slurm = slurm or Slurm(
            scontrol=config.scontrol, sinfo=config.sinfo, timeout_s=config.command_timeout_s, env=env
        )
        self.audit = AuditLog(
            Path(config.audit_log) if config.audit_log else state_dir / "remediation.jsonl",
            config.audit_max_bytes,
        )
        self.metrics = RemediationMetrics(cluster, registry)
        self.metrics.mode.set(0 if not config.enabled else (1 if config.dry_run else 2))
        self.queue: asyncio.Queue[tuple[str, Verdict, str]] = asyncio.Queue(MAX_QUEUE)
        #: work id (:func:`work_id`) → last attempt time, for drains not done yet (retried every retry_s while
        #: open)
        self.retry: OrderedDict[str, float] = OrderedDict()
        #: work ids whose drain is settled (done, dry run, already drained): never queued again
        self.settled: OrderedDict[str, None] = OrderedDict()
        #: verdict id → the backing its drain was refused at for want of a quorum (refused once per backing)
        self.unbacked: OrderedDict[str, int | None] = OrderedDict()
        self._queued: set[str] = set()
        #: (node, time) of every drain this aggregator did, for the breaker (re-drains of a node included)
        self.drains_done: deque[tuple[str, float]] = deque(maxlen=MAX_TRACKED)
        self.hold_down = HoldDown(config.resume.hold_down_drains, config.resume.hold_down_window_s)
        self._worker: asyncio.Task[None] | None = None
        holder = config.lease_holder or f"{socket.gethostname()}:{state_dir}"
        self.lease = (
            LeaseFile(Path(config.lease_file), holder, config.lease_s, grace_s=config.command_timeout_s)
            if config.lease_file
            else None
        )
        #: our lease runs until then (clock time); no lease file: always
        self.lease_until = -math.inf if self.lease is not None else math.inf
        self.lease_holder = ""  # who holds it, as last read
        self.lease_invalid = ""  # why the lease record as last read is not believed ("": it is)
        self._lease_task: asyncio.Task[None] | None = None
        self._renewing: asyncio.Future[LeaseState] | None = None
        self.idle = asyncio.Event()
        self.idle.set()
        self.requeuer = Requeuer(
            config.requeue,
            self.slurm,
            self._record,
            clock=clock,
            dry_run=config.dry_run,
            leading=lambda: self.leading,
            audit_path=self.audit.path,
        )

    # -- lifecycle ------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self.config.enabled and self._worker is None:
            loop = asyncio.get_running_loop()
            self._worker = loop.create_task(self._work(), name="remediation")
            if self.lease is not None:
                await self.renew()  # a lone aggregator acts at once; the second one starts as follower
                self._lease_task = loop.create_task(self._lease_loop(), name="remediation-lease")
            else:
                self.metrics.leader.set(1)
                self._look_at_open()
            log().info(
                "remediation_started",
                dry_run=self.config.dry_run,
                partition=self.config.partition,
                audit_log=str(self.audit.path),
                lease_file=self.config.lease_file,
                leader=self.leading,
            )

    def _look_at_open(self) -> None:
        """Queue every open verdict the policy drains, once: at start (verdicts restored from durable state
        open no change) and on taking the lease over (the follower queued nothing). Slurm's state makes a
        drain that was already done an ``already``, never a second action."""
        for verdict in list(self.book.open.values()):
            self._drains(verdict)

    def _drains(self, verdict: Verdict, *, retrying: bool = False) -> None:
        """Queue the drain of each host ``verdict`` names that is not settled, queued or (``retrying``: the
        tick retries it) waiting for its retry, if the policy drains it and it is backed."""
        hosts = self._hosts_of(verdict)
        pending = [
            h
            for h in hosts
            if (wid := work_id(verdict, h)) not in self.settled
            and wid not in self._queued
            and (retrying or wid not in self.retry)
        ]
        if not pending:
            return
        if not wants_drain(self.config.rules, verdict.kind, verdict.action, verdict.reason):
            return
        if not self._backed(verdict):
            return
        for host in pending:
            self._enqueue("drain", verdict, host)

    def _hosts_of(self, verdict: Verdict) -> list[str]:
        """The hosts a drain of ``verdict`` takes: its host, or every host of its domain (``drain_domains``)."""
        if verdict.host:
            return [verdict.host]
        return list(verdict.hosts) if self.config.drain_domains else []

    async def stop(self, *, release: bool = True) -> None:
        """Stop acting; ``release``: hand the lease back so the other aggregator takes over at once (a crash
        hands nothing back: the other waits for the lease to run out)."""
        if self._lease_task is not None:
            self._lease_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._lease_task
            self._lease_task = None
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
            self._worker = None
        if self.lease is not None and self.leading and release:
            lease = self.lease
            with contextlib.suppress(Exception):  # a clean stop hands over at once instead of after lease_s
                await asyncio.wait_for(asyncio.to_thread(lease.release), self.config.command_timeout_s)
            self.lease_until = -math.inf
            self.metrics.leader.set(0)

    # -- the lease ------------------------------------------------------------------------------------

    @property
    def leading(self) -> bool:
        """May act now: no lease is configured, or ours has not run out."""
        return self.clock() < self.lease_until

    async def _lease_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.lease_s / 3)
            await self.renew()

    async def renew(self) -> bool:
        """Take or renew the lease (in a thread, with the command deadline); True while we hold it.

        A renewal that fails or hangs (storage gone) counts as not holding: this aggregator stops acting when
        its lease runs out, and a hung call is not started again until it returns.
        """
        if self.lease is None:
            return True
        was = self.leading
        now = self.clock()
        try:
            renewing = self._renewing
            if renewing is None or renewing.done():
                renewing = self._renewing = asyncio.ensure_future(asyncio.to_thread(self.lease.hold, now))
            state = await asyncio.wait_for(asyncio.shield(renewing), self.config.command_timeout_s)
        except (OSError, TimeoutError) as exc:
            self.metrics.lease_errors.inc()
            log().error(
                "remediation_lease_failed", path=str(self.lease.path), error=f"{type(exc).__name__}: {exc}"
            )
        else:
            self.lease_holder = state.holder
            if state.holder == self.lease.holder:
                self.lease_until = state.until
            self._lease_validity(state)
        now_leading = self.leading
        self.metrics.leader.set(1 if now_leading else 0)
        if now_leading and not was:
            log().warning("remediation_lease_taken", holder=self.lease.holder, path=str(self.lease.path))
            self._look_at_open()
        elif was and not now_leading:
            log().warning("remediation_lease_lost", holder=self.lease_holder, path=str(self.lease.path))
        return now_leading

    def _lease_validity(self, state: LeaseState) -> None:
        """An invalid record is counted on every renewal that sees it, logged when first seen and gauged."""
        was, self.lease_invalid = self.lease_invalid, state.invalid
        self.metrics.lease_invalid.set(1 if state.invalid else 0)
        if state.invalid:
            self.metrics.lease_invalid_seen.inc()
            if not was:
                assert self.lease is not None
                log().error(
                    "remediation_lease_invalid",
                    path=str(self.lease.path),
                    holder=state.holder[:80],
                    detail=state.invalid,
                    rule="taken over once unchanged for lease_s + grace_s",
                )

    # -- input ----------------------------------------------------------------------------------------

    def on_change(self, change: Change) -> None:
        """Engine listener (synchronous, on the loop): queue what the policy asks for."""
        if not self.config.enabled or not self.leading:
            return  # a follower queues nothing: it looks at every open verdict when it takes the lease
        v = change.verdict
        if change.what in ("opened", "updated"):
            self._drains(v)  # (one waiting for its retry time is the tick's)
        elif change.what == "closed":
            for host in v.hosts:
                self.retry.pop(work_id(v, host), None)
            self.retry.pop(v.id, None)
            self.unbacked.pop(v.id, None)
            resume = self.config.resume
            if resume.enabled and v.id in self.settled and v.host:
                self._enqueue("resume", v)

    def tick(self, now: float) -> None:
        """Retry refused or failed drains of verdicts still open, each at most every ``retry_s``; refresh the
        held-down gauge (a hold lapses with time)."""
        if self.config.enabled and self.config.resume.enabled:
            self.metrics.held_down.set(len(self.hold_down.held_nodes(now)))
        if not self.config.enabled or not self.retry or not self.leading:
            return
        for wid, tried in list(self.retry.items()):
            vid, _, host = wid.partition("@")
            verdict = self.book.by_id.get(vid)
            if verdict is None or verdict.state != "open":
                self.retry.pop(wid, None)
                continue
            if now - tried >= self.config.retry_s and wid not in self._queued:
                self._enqueue("drain", verdict, host or verdict.host or "")

    def _backed(self, verdict: Verdict) -> bool:
        """The verdict may be acted on (:func:`policy.backed`); if not, its refusal is recorded once per
        backing, so a verdict whose quorum grows is looked at again and one that stays is not re-audited."""
        if backed(verdict.learned_from, self.config.learned_quorum):
            self.unbacked.pop(verdict.id, None)
            return True
        if verdict.id not in self.unbacked or self.unbacked[verdict.id] != verdict.learned_from:
            self.unbacked[verdict.id] = verdict.learned_from
            self._bound(self.unbacked)
            self._record(
                verdict,
                "drain",
                "refused",
                "learned_without_quorum",
                node=self.node_of(verdict.host or ",".join(verdict.hosts)),
                detail=f"it rests on a yardstick learned from the fleet that {verdict.learned_from} hosts "
                f"other than {verdict.host} hold; remediation.learned_quorum is {self.config.learned_quorum}",
            )
        return False

    def _enqueue(self, op: str, verdict: Verdict, host: str | None = None) -> None:
        host = host if host is not None else verdict.host or ""
        try:
            self.queue.put_nowait((op, verdict, host))
        except asyncio.QueueFull:
            self._record(
                verdict, op, "refused", "queue_full", node="", detail=f"more than {MAX_QUEUE} actions queued"
            )
            return
        self._queued.add(work_id(verdict, host))
        self.idle.clear()

    # -- work -----------------------------------------------------------------------------------------

    async def _work(self) -> None:
        while True:
            op, verdict, host = await self.queue.get()
            try:
                if op == "drain":
                    if await self.drain(verdict, host) in ("done", "already", "dry_run"):
                        await self.requeuer.after_drain(verdict, self.node_of(host))
                else:
                    await self.resume(verdict)
            except Exception as exc:  # remediation must never stop over one verdict
                self._record(
                    verdict, op, "failed", "internal_error", node="", detail=f"{type(exc).__name__}: {exc}"
                )
            finally:
                self._queued.discard(work_id(verdict, host))
                if self.queue.empty():
                    self.idle.set()

    def node_of(self, host: str) -> str:
        return self.config.node_name.replace("{host}", host)

    def reason_of(self, verdict: Verdict) -> str:
        """The drain reason (:func:`policy.drain_reason_of`): the verdict id always survives Slurm's bound."""
        return drain_reason_of(verdict)

    async def drain(self, verdict: Verdict, host: str | None = None) -> str:
        """Drain ``host``'s node (default: the verdict's host) if the policy, Slurm's state and the breaker
        allow; returns the outcome."""
        host = host if host is not None else verdict.host or ""
        wid = work_id(verdict, host)
        if self.before_drain is not None and verdict.state == "open":
            await self.before_drain(verdict)  # the incident's evidence first (bounded wait)
        now = self.clock()
        node = self.node_of(host)
        if verdict.state != "open":
            return "skipped"
        if not self.leading:
            return "follower"  # not settled: looked at again if this aggregator takes the lease
        if not self._backed(verdict):  # its backing fell while it waited (a retry after the breaker)
            self.retry.pop(wid, None)
            return "refused"
        nodes, error = await self.slurm.nodes(self.config.partition)
        if error:
            return self._failed(
                verdict, "drain", "slurm_unreadable", node=node, detail=error, now=now, wid=wid
            )
        target = next((n for n in nodes if n.name == node), None)
        if target is None:
            where = f"partition {self.config.partition!r}" if self.config.partition else "Slurm"
            return self._failed(
                verdict,
                "drain",
                "unknown_node",
                node=node,
                detail=f"{where} has no node {node!r}",
                now=now,
                wid=wid,
            )
        if target.drained_by_sentinel:
            self._settle(wid)
            return self._record(
                verdict, "drain", "already", "", node=node, detail=f"already drained: {target.reason}"
            )
        if target.unavailable:
            self._settle(wid)  # someone else's drain or down: theirs to lift, not ours to overwrite
            return self._record(
                verdict,
                "drain",
                "refused",
                "not_ours",
                node=node,
                detail=f"node is {target.state}: {target.reason}",
            )
        check = check_breaker(self.config.breaker, nodes, node, now, self.drains_done)
        if not check.allowed:
            self.metrics.breaker_open.set(1)
            self.retry[wid] = now
            self._bound(self.retry)
            log().error("remediation_breaker_open", node=node, verdict=verdict.id, detail=check.detail)
            return self._record(verdict, "drain", "refused", check.refusal, node=node, detail=check.detail)
        self.metrics.breaker_open.set(0)
        reason = self.reason_of(verdict)
        if self.config.dry_run:
            self._settle(wid)
            return self._record(
                verdict, "drain", "dry_run", "", node=node, detail=f"would drain with reason {reason!r}"
            )
        if not self.leading:  # the lease ran out while Slurm was read: the other one may be acting now
            return "follower"
        done = await self.slurm.drain(node, reason)
        if not done.ok:
            return self._failed(
                verdict, "drain", "scontrol_failed", node=node, detail=done.output, now=now, wid=wid
            )
        self._settle(wid)
        self.drains_done.append((node, now))
        held = self.hold_down.drained(node, verdict.gpu, verdict.reason, now)
        outcome = self._record(verdict, "drain", "done", "", node=node, detail=reason)
        if held is not None:
            self._held_down(verdict, held)
        return outcome

    async def resume(self, verdict: Verdict) -> str:
        cfg = self.config.resume
        node = self.node_of(verdict.host or "")
        if verdict.detector not in cfg.detectors or verdict.close_reason not in cfg.close_reasons:
            return self._record(
                verdict,
                "resume",
                "refused",
                "not_repaired",
                node=node,
                detail=f"closed by {verdict.detector} with {verdict.close_reason!r}: not evidence of a repair",
            )
        others = [
            v.id
            for v in self.book.open.values()
            if v.host == verdict.host
            and wants_drain(self.config.rules, v.kind, v.action, v.reason)
            and backed(v.learned_from, self.config.learned_quorum)
        ]
        if others:
            return self._record(
                verdict,
                "resume",
                "refused",
                "still_unfit",
                node=node,
                detail=f"open verdicts drain it: {', '.join(others)}",
            )
        held = self.hold_down.held(node, self.clock())
        if held is not None:
            self._held_down(verdict, held)
            return self._record(verdict, "resume", "refused", "held_down", node=node, detail=held.detail())
        target, error = await self.slurm.node(node)
        if target is None:
            return self._record(verdict, "resume", "failed", "slurm_unreadable", node=node, detail=error)
        words = target.reason.split()
        if not target.drained_by_sentinel or not words or words[-1] != verdict.id:
            return self._record(
                verdict,
                "resume",
                "refused",
                "not_ours",
                node=node,
                detail=f"node is {target.state}: {target.reason!r}",
            )
        if not cfg.validation_command:
            return self._record(
                verdict,
                "resume",
                "refused",
                "no_validation",
                node=node,
                detail="resume.validation_command is empty",
            )
        argv = [part.replace("{node}", node) for part in cfg.validation_command]
        checked = await run_command(argv, cfg.validation_timeout_s, self.env)
        if not checked.ok:
            return self._record(
                verdict, "resume", "refused", "validation_failed", node=node, detail=checked.output[-500:]
            )
        if self.config.dry_run:
            return self._record(
                verdict, "resume", "dry_run", "", node=node, detail="validation passed; would resume"
            )
        if not self.leading:
            return "follower"
        done = await self.slurm.resume(node)
        if not done.ok:
            return self._record(verdict, "resume", "failed", "scontrol_failed", node=node, detail=done.output)
        return self._record(verdict, "resume", "done", "", node=node, detail="validation passed; resumed")

    def _held_down(self, verdict: Verdict, held: Held) -> None:
        """Say on the verdict (evidence and ``held_down``), in the log and in the gauge that its node stays
        drained."""
        detail = held.detail()
        if "held_down" not in verdict.extra:
            verdict.evidence.append(f"remediation: node {held.node} {detail}")
        verdict.extra["held_down"] = {
            "node": held.node,
            "gpu": held.gpu,
            "reason": held.reason,
            "drains": held.drains,
            "since": held.first_t,
            "window_s": held.window_s,
        }
        self.metrics.held_down.set(len(self.hold_down.held_nodes(self.clock())))
        log().error(
            "remediation_node_held_down",
            node=held.node,
            gpu=held.gpu,
            reason=held.reason,
            drains=held.drains,
            window_s=held.window_s,
            verdict=verdict.id,
        )

    # -- bookkeeping ----------------------------------------------------------------------------------

    def _failed(
        self,
        verdict: Verdict,
        action: str,
        reason: str,
        *,
        node: str,
        detail: str,
        now: float,
        wid: str | None = None,
    ) -> str:
        self.retry[wid or verdict.id] = now
        self._bound(self.retry)
        return self._record(verdict, action, "failed", reason, node=node, detail=detail)

    def _settle(self, vid: str) -> None:
        self.retry.pop(vid, None)
        self.settled[vid] = None
        self._bound(self.settled)

    @staticmethod
    def _bound(items: OrderedDict[str, Any]) -> None:
        while len(items) > MAX_TRACKED:
            items.popitem(last=False)

    def _record(
        self, verdict: Verdict, action: str, outcome: str, reason: str, *, node: str, detail: str
    ) -> str:
        now = self.clock()
        record = {
            "t": now,
            "action": action,
            "outcome": outcome,
            "reason": reason,
            "node": node,
            "detail": detail[:1000],
            "dry_run": self.config.dry_run,
        }
        entries: list[dict[str, Any]] = verdict.extra.setdefault("remediation", [])
        entries.append(record)
        del entries[:-MAX_RECORDS_PER_VERDICT]
        self.metrics.count(action, outcome, reason)
        audit = record | {
            "verdict": verdict.id,
            "kind": verdict.kind,
            "verdict_reason": verdict.reason,
            "verdict_action": verdict.action,
            "host": verdict.host,
            "gpu": verdict.gpu,
            "job": verdict.job,
        }
        if not self.audit.write(audit):
            self.metrics.audit_errors.inc()
            log().error("remediation_audit_failed", error=self.audit.last_error)
        event = "remediation_" + outcome
        level = log().warning if outcome in ("refused", "failed") else log().info
        level(event, action=action, node=node, verdict=verdict.id, reason=reason, detail=detail[:300])
        return outcome


def work_id(verdict: Verdict, host: str) -> str:
    """One drain's identity: the verdict id for its own host, ``<verdict id>@<host>`` for each host of a
    verdict that names several (verdict ids hold no ``@``)."""
    return verdict.id if not host or host == verdict.host else f"{verdict.id}@{host}"
