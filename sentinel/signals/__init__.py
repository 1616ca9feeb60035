"""Log-line classification: NCCL / PyTorch / kernel text in, contract records out (``logs classify``).

Pure code (no I/O, no clock). GPU signals — the Xid kernel-line parser and catalog, row remapping, ECC —
live in their components (:mod:`sentinel.components`); classification imports their parsers from there.
See ``docs/signals.md``.
"""

from __future__ import annotations

from sentinel.signals.classify import classify_line, classify_text, is_noise, text_events
from sentinel.signals.nccl_log import nccl_events, torch_events, torch_rank
from sentinel.signals.record import KINDS, Classified, Kind, most_severe
from sentinel.signals.scan import LogScanner, scan_bytes

__all__ = [
    "KINDS",
    "Classified",
    "Kind",
    "LogScanner",
    "classify_line",
    "classify_text",
    "is_noise",
    "most_severe",
    "nccl_events",
    "scan_bytes",
    "text_events",
    "torch_events",
    "torch_rank",
]
