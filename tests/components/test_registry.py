"""The one registry and everything derived from it: a signal, collector or detector named in one place and
missing (or different) in another fails here."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import msgspec

import sentinel.components
from sentinel.agent.metrics import AgentCounters
from sentinel.agent.registry import BUILDERS, COLLECTORS, BuildContext
from sentinel.agent.registry import OWN as OWN_BUILDERS
from sentinel.agent.sink import TickSink
from sentinel.agent.source import HostInputs
from sentinel.aggregator.engine import DETECTORS, Engine
from sentinel.cli.cmd_config import render_docs
from sentinel.components import registry
from sentinel.components.fabric.collector import FabricManagerBuild
from sentinel.components.fabric.manager_signal import SIGNAL as FABRIC_MANAGER
from sentinel.components.ib.collector import IbBuild
from sentinel.components.ib.signal import SIGNAL as IB
from sentinel.components.nccl_ras.collector import RasBuild
from sentinel.components.nccl_ras.signal import SIGNAL as NCCL_RAS
from sentinel.components.netdev.collector import NetdevBuild
from sentinel.components.netdev.signal import SIGNAL as NETDEV
from sentinel.components.signal import Signal
from sentinel.config.agent import AgentConfig
from sentinel.config.aggregator import AggregatorConfig
from sentinel.wire import EccCounters, FabricInfo, GpuSample, NvLink, PcieLink, RetiredPages, RowRemap

REPO = Path(__file__).resolve().parents[2]


def test_every_component_package_with_a_signal_is_registered() -> None:
    declared = set()
    for module in pkgutil.iter_modules(sentinel.components.__path__):
        if not module.ispkg:
            continue
        package = importlib.import_module(f"sentinel.components.{module.name}")
        for sub in pkgutil.iter_modules(package.__path__):
            found = importlib.import_module(f"sentinel.components.{module.name}.{sub.name}")
            if isinstance(getattr(found, "SIGNAL", None), Signal):
                declared.add(found.SIGNAL.name)
    assert declared == {s.name for s in registry.SIGNALS}
    for signal in registry.SIGNALS:
        importlib.import_module(signal.package)  # its component folder exists


def test_the_daemons_run_exactly_the_registry_collectors_and_detectors() -> None:
    assert [e.name for e in COLLECTORS] == list(registry.COLLECTORS)
    assert set(BUILDERS) == set(registry.COLLECTORS)
    assert [d.name for d in DETECTORS] == list(registry.DETECTORS)
    assert {s.collector for s in registry.SIGNALS} <= set(registry.COLLECTORS)
    assert {s.detector for s in registry.SIGNALS} <= set(registry.DETECTORS)


def test_a_host_level_source_s_collector_is_built_by_its_component_never_by_the_agent() -> None:
    from_signals = {s.collector for s in registry.SIGNALS if s.collect is not None}
    assert from_signals == {"ib", "netdev", "nccl_ras", "fabric_manager"}
    assert not from_signals & set(OWN_BUILDERS)
    assert set(BUILDERS) == set(OWN_BUILDERS) | from_signals


def fits(ctx: BuildContext) -> tuple[IbBuild, NetdevBuild, RasBuild, FabricManagerBuild]:
    """mypy checks here that the agent's build context is what each host-level builder reads."""
    return ctx, ctx, ctx, ctx


def test_the_agent_s_build_context_builds_every_host_level_collector(tmp_path: Path) -> None:
    config = AgentConfig()
    config.agent.state_dir = str(tmp_path)
    config.ib.sysfs_root = config.netdev.sysfs_root = str(tmp_path / "sys")
    sink = TickSink("h", AgentCounters())
    ctx = BuildContext(
        config=config,
        host="h",
        cluster="c",
        source=None,  # type: ignore[arg-type]  # no GPU collector is built here
        inputs=HostInputs(),
        sink=sink,
        counters=AgentCounters(),
        lines=None,  # type: ignore[arg-type]
        xids=None,  # type: ignore[arg-type]
    )
    ib, netdev, ras, fabric_manager = fits(ctx)
    built = [s.collect(c) for s, c in ((IB, ib), (NETDEV, netdev), (NCCL_RAS, ras)) if s.collect]
    assert [c.name for c in built if c is not None] == ["ib", "netdev", "nccl_ras"]
    manager = FABRIC_MANAGER.collect(fabric_manager) if FABRIC_MANAGER.collect else None
    assert manager is not None and manager.name == "fabric_manager" and manager.families()
    assert sink.port_tracker is not None  # the ib collector handed over its port history
    assert all(c is not None and c.families() for c in built)


def test_every_judged_gpu_signal_has_a_memory_type_for_the_latches() -> None:
    for signal in registry.JUDGED:
        if signal.remember is not None or signal.on_event is not None:
            assert registry.MEMORY_TYPES[signal.name] is signal.memory_type


def test_the_configuration_docs_name_every_collector_and_detector() -> None:
    docs = render_docs()
    for name in (*registry.COLLECTORS, *registry.DETECTORS):
        assert f"`{name}`" in docs
    assert (REPO / "docs" / "configuration.md").read_text() == docs


def test_the_components_docs_are_generated_from_the_registry() -> None:
    assert (REPO / "docs" / "components.md").read_text() == registry.components_doc()


def test_the_components_docs_carry_the_table_and_every_family_a_signal_renders() -> None:
    documented = registry.components_doc()
    assert registry.components_table() in documented
    for signal in registry.GPU_SIGNALS:
        for name, _kind, _help in registry.families(signal):
            assert f"`{name}`" in documented, f"{signal.name}: {name} missing from docs/components.md"
    assert registry.families(registry.SIGNALS[0])  # the device signal renders families


def test_alert_rules_and_panels_come_from_the_hook_or_the_component_module() -> None:
    hooked = Signal[None](name="x", summary="", alerts=lambda settings: [("rule", settings)])
    assert registry.alerts(hooked, 7) == [("rule", 7)]
    absent = Signal[None](name="x", summary="", component="no_such_component")
    assert registry.alerts(absent, None) == [] and registry.panels(absent, None) == []


def test_every_registry_detector_can_be_switched_off_by_name_network_included() -> None:
    for name in registry.DETECTORS:
        config = msgspec.convert({"detect": {"disabled": [name]}}, AggregatorConfig)
        engine = Engine(config)
        assert name in engine.detectors and name not in {d.name for d in engine.enabled}


def test_a_signal_reads_only_the_sample_fields_it_declares() -> None:
    """The aggregator offers a fast sample (none of the slow signals' fields) to the every-tick signals only;
    a slow signal that read an undeclared field would miss its readings."""
    fields = {f.name for f in msgspec.structs.fields(GpuSample)}
    for signal in registry.GPU_SIGNALS:
        if signal.remember is None:
            continue
        assert signal.reads and set(signal.reads) <= fields, signal.name
        assert signal.remember(None, GpuSample(gpu=0, t=1.0)) is None, signal.name  # nothing it reads
        for name in signal.reads:  # any one of its fields is a reading it must be offered
            value = {
                "pcie_replay": 3,
                "recovery_action": "gpu_reset",
                "pcie_link": PcieLink(width=8, width_max=16),
                "fabric": FabricInfo(state="completed", health_mask=1),
                "ecc": EccCounters(volatile_corrected=1),
                "retired": RetiredPages(pending=True),
                "remap": RowRemap(correctable=1),
                "nvlink": [NvLink(link=0)],
                "mem_temp_c": 70.0,
                "readings": {"hbm.mem_temp_max_c": 95.0},
            }[name]
            offered = msgspec.structs.replace(GpuSample(gpu=0, t=1.0), **{name: value})
            if signal.name == "hbm" and name == "readings":
                continue  # the limit alone is no reading: it is kept with the next temperature
            assert signal.remember(None, offered) is not None, (signal.name, name)
