"""The rowremap signal's memory in the aggregator's store: a restored pending remap is judged again, and
closes on the reading after the reset."""

from __future__ import annotations

from pathlib import Path

from sentinel.wire import Hello, RowRemap
from tests.aggregator.durable import Node
from tests.aggregator.helpers import hello, sample


def test_a_reboot_seen_after_the_restart_is_evidence_and_closes_the_restored_verdict(tmp_path: Path) -> None:
    first = Node(tmp_path, 0.0)
    first.hello(hello("h0"), 0.0)
    remap = RowRemap(pending=True, correctable=0, uncorrectable=1)
    first.send("h0", 2.0, samples=[sample(i, 2.0, remap=remap if i == 1 else None) for i in range(8)])
    assert [r for *_, r, _ in first.open()] == ["row_remap_pending_uncorrectable"]
    first.persist()
    first.crash()

    second = Node(tmp_path, 50.0)
    assert [r for *_, r, _ in second.open()] == ["row_remap_pending_uncorrectable"]
    second.engine.tick(51.0)
    # evaluated again on the restored readings, not on an empty GPU
    assert [r for *_, r, _ in second.open()] == ["row_remap_pending_uncorrectable"]
    rebooted = Hello(host="h0", boot_id="boot-2", gpus=hello("h0").gpus, started_at=52.0)
    second.hello(rebooted, 52.0)
    assert second.open() != []  # the reboot alone: the remap reading is still the pending one
    remapped = RowRemap(pending=False, correctable=0, uncorrectable=1)  # the reset applied the remap
    second.send("h0", 53.0, samples=[sample(i, 53.0, remap=remapped if i == 1 else None) for i in range(8)])
    assert second.open() == []
