"""Xid 159 (NVIDIA bucket CHECK_UVM): reset the GPU only where UVM/vGPU is in use, otherwise ignore. The
bucket table says sentinel's fleets run bare metal, so the classifier, the aggregator's verdict and
``sentinel health`` all read it as a warning with no action."""

from __future__ import annotations

from sentinel.agent.health import LocalHealth
from sentinel.components.xid.buckets import BUCKET_ACTIONS, Bucket, resolve
from sentinel.components.xid.parse import xid_record
from sentinel.signals import classify_line
from sentinel.wire import Batch, XidOccurred
from tests.aggregator.helpers import Fleet, hello

# Our own line, in the driver's format (address and pid chosen for this test).
LINE = "NVRM: Xid (PCI:0000:4c:00): 159, pid=40411, name=python3, CHI Non-Data Error"


def occurred(t: float, gpu: int = 2) -> XidOccurred:
    return XidOccurred(t=t, source="kmsg", gpu=gpu, text=LINE, record=xid_record(159, LINE, "0000:4c:00"))


def test_the_table_and_the_context_rule() -> None:
    rule = BUCKET_ACTIONS[Bucket.CHECK_UVM]
    assert (rule.severity, rule.action) == ("warning", "none") and "UVM" in rule.why
    assert resolve(159).bucket is Bucket.CHECK_UVM
    assert (resolve(159, uvm=True).action, resolve(159, uvm=True).severity) == ("reset_gpu", "critical")


def test_the_classifier_reads_it_as_the_table_says() -> None:
    event = classify_line(f"[ 812.004411] {LINE}")
    assert event is not None
    assert (event.kind, event.xid, event.severity, event.action) == ("xid", 159, "warning", "none")


def test_repeated_it_opens_no_verdict() -> None:
    f = Fleet(hosts=1)
    for t in range(0, 30):
        f.send("h0", float(t), events=[occurred(float(t))] if t % 3 == 1 else [])
        f.engine.tick(float(t))
    assert f.open() == []
    memory = f.views["h0"].gpus[2].memory["xid"]
    assert len(memory.events) == 10 and memory.state == "ok"


def test_sentinel_health_does_not_unfit_the_node() -> None:
    health = LocalHealth("h0")
    health.hello(hello("h0"), 0.0)
    health.apply(Batch(seq=0, t=1.0, events=[occurred(1.0)]), 1.0)
    assert [r for r in health.reasons(2.0) if r.kind == "faulty"] == []
