"""The fleet's latched hardware facts as state-store records: what a restart must not forget.

An agent reports an Xid, a pending row remap or a rise of uncorrectable ECC errors once; the aggregator acks
it and the agent never sends it again. The hardware detector decides from each GPU signal's memory (the Xid
latch and repeat history, the ECC and row-remap readings with the ones before them, the NVLink/PCIe counter
histories — stored as each signal's own msgspec struct) and the boot id that says whether a later Hello is
a reboot. Those are kept here, one record per host, written when the host's inventory or a GPU's hardware facts changed — a few
records per second on a healthy fleet, not 49,152.

Live readings (utilisation, clocks, moving averages), jobs and ranks are not kept: the agents resend them
every second and the detectors that use them hold their restored verdicts while they gather them again
(:attr:`sentinel.aggregator.verdicts.VerdictBook.restore_hold_s`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import msgspec

from sentinel.aggregator.state import DEDUP_WINDOW, FleetState, HostView
from sentinel.components.gpu_view import GpuView
from sentinel.components.registry import MEMORY_TYPES


class GpuRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One GPU's latched facts (see :class:`sentinel.components.gpu_view.GpuView` for their meaning)."""

    index: int
    uuid: str = ""
    pci_bus: str = ""
    name: str = ""
    state: str = "ok"
    state_t: float = 0.0
    t: float | None = None
    #: each GPU signal's memory by signal name, decoded with the registry's type for it
    memory: dict[str, msgspec.Raw] = {}
    reset_t: float | None = None
    last_job: str | None = None
    last_rank: int | None = None


class HostRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One host: identity (boot id: a different one in a later Hello is a reboot) and its GPUs."""

    name: str
    cluster: str = "default"
    boot_id: str = ""
    tick_s: float = 1.0
    gpus: list[GpuRecord] = []


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(HostRecord)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _gpu_record(gpu: GpuView) -> GpuRecord:
    return GpuRecord(
        index=gpu.index,
        uuid=gpu.uuid,
        pci_bus=gpu.pci_bus,
        name=gpu.name,
        state=gpu.state,
        state_t=gpu.state_t,
        t=_finite(gpu.t),
        memory={name: msgspec.Raw(_encoder.encode(kept)) for name, kept in gpu.memory.items()},
        reset_t=_finite(gpu.reset_t),
        last_job=gpu.last_job,
        last_rank=gpu.last_rank,
    )


def _gpu_view(host: str, record: GpuRecord) -> GpuView:
    view = GpuView(host=host, index=record.index, uuid=record.uuid, pci_bus=record.pci_bus, name=record.name)
    view.state, view.state_t = record.state, record.state_t
    view.t = record.t if record.t is not None else -math.inf
    for name, raw in record.memory.items():
        kind = MEMORY_TYPES.get(name)
        if kind is None:
            continue  # a signal this version does not have
        try:
            view.memory[name] = msgspec.msgpack.decode(raw, type=kind)
        except msgspec.ValidationError:
            continue  # an older shape of its memory: the signal starts afresh from the next reading
    view.reset_t = record.reset_t if record.reset_t is not None else -math.inf
    view.last_job, view.last_rank = record.last_job, record.last_rank
    return view


class HostRecords:
    """The hosts a holder has a record of in the store, and the records of those that changed."""

    def __init__(self) -> None:
        self.kept: set[str] = set()  # hosts with a record in the store
        self._forgotten_seen = -1  # FleetState.forgotten_hosts when kept was last checked against the fleet

    def changes(
        self, fleet: FleetState, names: set[str], encode: Callable[[HostView], bytes]
    ) -> dict[str, bytes | None]:
        """One record per named host still in the fleet, and a deletion for each kept host the fleet forgot
        (looked for only when a host was forgotten since, or records were restored: the ack path flushes
        up to 20 times a second, and a pass over every kept host cost 1 ms at 6,144 hosts)."""
        out: dict[str, bytes | None] = {}
        kept = self.kept
        for name in names:
            host = fleet.hosts.get(name)
            if host is not None:
                out[name] = encode(host)
                kept.add(name)
        if fleet.forgotten_hosts != self._forgotten_seen:
            self._forgotten_seen = fleet.forgotten_hosts
            for name in [name for name in kept if name not in fleet.hosts]:
                out[name] = None
                kept.discard(name)
        return out


class FleetLatches:
    """State-store holder over a :class:`FleetState`: one record per host whose latched facts changed."""

    state_name = "fleet_hosts"

    def __init__(self, fleet: FleetState) -> None:
        self.fleet = fleet
        self._records = HostRecords()

    def snapshot(self, full: bool = False) -> dict[str, bytes | None]:
        """Changed hosts' records; hosts the fleet forgot (retention, eviction) are deleted."""
        fleet = self.fleet
        names, fleet.changed_hosts = (set(fleet.hosts) if full else fleet.changed_hosts), set()
        return self._records.changes(fleet, names, lambda host: _encoder.encode(self._record(host)))

    @staticmethod
    def _record(host: HostView) -> HostRecord:
        return HostRecord(
            name=host.name,
            cluster=host.cluster,
            boot_id=host.boot_id,
            tick_s=host.tick_s,
            gpus=[_gpu_record(gpu) for gpu in host.gpus],
        )

    def restore(self, records: dict[str, bytes], now: float) -> None:
        """Hosts come back disconnected and seen ``now``: each gets the full silence threshold to reconnect."""
        fleet = self.fleet
        for data in records.values():
            record = _decoder.decode(data)
            if record.name in fleet.hosts:
                continue
            host = HostView(
                name=record.name,
                cluster=record.cluster,
                boot_id=record.boot_id,
                tick_s=record.tick_s,
                last_seen=now,
            )
            gpus = sorted(record.gpus[: fleet.max_gpus_per_host], key=lambda g: g.index)
            for gpu in gpus:
                while len(host.gpus) < gpu.index:
                    host.gpus.append(GpuView(host=host.name, index=len(host.gpus)))
                if gpu.index == len(host.gpus):
                    host.gpus.append(_gpu_view(host.name, gpu))
            fleet.hosts[host.name] = host
            self._records.kept.add(host.name)


class SeqWindowRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One host's dedup window: the boot id and agent instance its numbering belongs to, the high-water
    mark, seqs above it."""

    boot_id: str = ""
    hw: int = -1
    above: list[int] = []
    instance: str = ""


_window_decoder = msgspec.msgpack.Decoder(SeqWindowRecord)


def _window_record(host: HostView) -> bytes:
    return _encoder.encode(
        SeqWindowRecord(
            boot_id=host.boot_id, hw=host.seq_hw, above=sorted(host.seq_above), instance=host.instance_id
        )
    )


class FleetSeqWindows:
    """State-store holder over each host's dedup window, so that a resend after a crash is not applied twice.

    Why: the agent deletes a batch from its spool only when it is acked and resends everything else after a
    reconnect. A batch the aggregator applied but had not acked when it was killed comes back; with the
    window lost it would be applied a second time (an Xid counted twice turns one Xid 13 into a "repeats
    across processes" suspect).

    Crash-safety is by *same transaction* and *acks after commit*: :meth:`StateStore.flush` takes every
    holder's snapshot in one synchronous pass on the event loop (no batch is applied in between) and the
    writer commits them in one SQLite transaction, so the window that comes back is exactly the one that
    covers the restored latches and verdicts; a batch is acked only once a commit covers it
    (:mod:`sentinel.aggregator.acks`). A batch applied after the last commit is missing from both and was not
    acked: the agent's resend applies it once. Detector memory (``BuiltinsHolder``, every 10 s) may be older
    than the window; it is a warm start, so a batch it missed is under-counted there, never doubled.

    Cost: one small record per host that sent a batch since the last flush (about 20 bytes when the window
    is contiguous; at most ``DEDUP_WINDOW`` seqs), measured in ``bench/state_store.py``.
    Registered after :class:`FleetLatches`, whose restore creates the hosts.
    """

    state_name = "fleet_seqs"

    def __init__(self, fleet: FleetState) -> None:
        self.fleet = fleet
        self._records = HostRecords()

    def snapshot(self, full: bool = False) -> dict[str, bytes | None]:
        fleet = self.fleet
        names, fleet.window_changed = (set(fleet.hosts) if full else fleet.window_changed), set()
        return self._records.changes(fleet, names, _window_record)

    def restore(self, records: dict[str, bytes], now: float) -> None:
        """A window comes back only onto a restored host of the same boot (another boot restarts numbering)."""
        fleet = self.fleet
        for name, data in records.items():
            record = _window_decoder.decode(data)
            host = fleet.hosts.get(name)
            self._records.kept.add(name)  # deleted on the next snapshot if the host is not there
            if host is None or host.boot_id != record.boot_id:
                continue
            host.seq_hw = record.hw
            host.seq_above = {seq for seq in record.above[-DEDUP_WINDOW:] if seq > record.hw}
            host.instance_id = record.instance
