"""Host signals: parsers and policies shared by the agent, the aggregator and the CLI.

Pure code (no I/O, no clock): log text in, typed records and decisions out. See ``docs/signals.md``.
"""

from __future__ import annotations

from sentinel.signals.classify import classify_line, classify_text, is_noise, text_events
from sentinel.signals.ecc import (
    EccCounter,
    EccCounts,
    EccThresholds,
    RetiredPages,
    evaluate_ecc,
    evaluate_retired_pages,
    parse_ecc,
    parse_retired_pages,
)
from sentinel.signals.health import GpuState, MemoryFinding
from sentinel.signals.nccl_log import nccl_events, torch_events, torch_rank
from sentinel.signals.record import KINDS, Classified, Kind, most_severe
from sentinel.signals.rowremap import (
    BankAvailability,
    RemappedRows,
    RowRemapStatus,
    evaluate_row_remap,
    parse_row_remap,
)
from sentinel.signals.scan import LogScanner, scan_bytes
from sentinel.signals.xid import SXidRecord, XidRecord, parse_sxid, parse_xid
from sentinel.signals.xid_catalog import XID_TABLE, XidInfo, xid_info
from sentinel.signals.xid_policy import XidDecision, XidPolicy, XidPolicyConfig

__all__ = [
    "KINDS",
    "XID_TABLE",
    "BankAvailability",
    "Classified",
    "EccCounter",
    "EccCounts",
    "EccThresholds",
    "GpuState",
    "Kind",
    "LogScanner",
    "MemoryFinding",
    "RemappedRows",
    "RetiredPages",
    "RowRemapStatus",
    "SXidRecord",
    "XidDecision",
    "XidInfo",
    "XidPolicy",
    "XidPolicyConfig",
    "XidRecord",
    "classify_line",
    "classify_text",
    "evaluate_ecc",
    "evaluate_retired_pages",
    "evaluate_row_remap",
    "is_noise",
    "most_severe",
    "nccl_events",
    "parse_ecc",
    "parse_retired_pages",
    "parse_row_remap",
    "parse_sxid",
    "parse_xid",
    "scan_bytes",
    "text_events",
    "torch_events",
    "torch_rank",
    "xid_info",
]
