"""Property tests: arbitrary text, invalid UTF-8 and very long lines never raise and stay fast.

Every regex in sentinel.signals is written without nested quantifiers; these tests throw the shapes that
make backtracking regexes explode (long runs of the characters a pattern loops on) at every entry point
with a time bound per call.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sentinel.signals import LogScanner, classify_line, classify_text, scan_bytes

FRAGMENTS = [
    "NVRM: Xid (PCI:",
    "0000:3b:00",
    "): ",
    "13, pid=",
    "name=",
    ", ",
    "SXid (",
    "NCCL WARN ",
    "NCCL INFO ",
    "comm 0x1 rank 1 nranks ",
    "busId ",
    "WorkNCCL(SeqNum=",
    "Timeout(ms)=",
    "[rank",
    "[PG ID 0 PG GUID 0(default_pg) Rank ",
    "Watchdog caught collective operation timeout",
    "\n",
    "\r",
    "    Remapped Rows\n",
    "    ECC Errors\n        Volatile\n",
    "  rank : ",
    "Root Cause (first observed failure):\n",
    # formats added with the second held-out set (rules.py: RAS errors, schedulers, CUDA follow-ups)
    "   RUNNING  ",
    "INCOMPLETE,ERROR",
    ",MISMATCH",
    "#0-0 (9e1c3a5b7d2f4e60) ERROR\n",
    "  Asynchronous errors on ",
    " ranks reported ",
    "Search for `cudaError",
    "' in https://docs.nvidia.com/x for more information",
    "srun: ",
    "slurmstepd: error: *** JOB ",
    " CANCELLED AT ",
    "NCCL WARN NET/IB: NCCL_IB_SUBNET_PREFIX_LEN=",
    " is out of range [1,32]",
    " can potentially cause a ",
    "| Page Retirement/Row Remap | ",
    "Pass",
    "Gloo connectFullMesh failed with [",
    "no progress",
    "XidCriticalError     True    ",
    '{"31":true}',
    "NVRM: A GPU crash dump has been created.",
    "ERROR_GPU_IS_LOST",
    "Net : Connection closed by remote peer ",
    "shutting down",
    "Detected mismatch between collectives on ranks. ",
    "CollectiveFingerPrint(SequenceNumber=",
    "OpType=",
    # formats added with the third held-out set (kernel AER/EDAC/NVRM, NCCL last-error quotes, relays)
    "pcieport 0000:00:03.0: AER: ",
    "Uncorrectable (Non-Fatal) error message received from ",
    "can't recover (no error_detected callback)",
    "PCIe Bus Error: severity=Correctable",
    ":    [14] CmpltTO    (First)",
    "EDAC MC3: 1 UE memory read error",
    "[Hardware Error]: Corrected error, no action required",
    "NVRM: knvlinkDiscover_GH100: Unable to read NV_PF0",
    "NET/IBP:Got completion from peer 1.2.3.4<5> with status=12",
    "ncclSocketInit: connecting to address ",
    "Bootstrap : no socket interface found",
    "(VllmWorkerProcess pid=1) ERROR x.py:1] ",
    "NCCL error: unhandled cuda error",
    ", NCCL version 2.20.5",
    "will start\n   to dump the debug info",
    "srun: Terminating job step ",
    "GPU:0 PCI:0000:0f:00.0 ",
    "exits with return code = -9",
    "Killing subprocess ",
    "[W503 01:52:07.5 socket.cpp:204] [c10d] ",
    "Running collective: CollectiveFingerPrint(SequenceNumber=",
    "|   0  NVIDIA A100  Off |   00000000:01:00.0  On |   2 |",
    "nvidia-persistenced[1]: device 0000:3d:00.0 - ",
    "# Out of bounds values : 248 FAILED",
    "#  Rank  0 Group  0 Pid 1 on h device  0 [0002:00:01] ",
    "Reason:       OOMKilled",
    ":",
    "[",
    "]",
    "(",
    ")",
    " ",
    "9",
    "-",
    "\udcff",
    "\x00",
]

log_like = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=20)), max_size=60).map("".join)
BOUND_S = 2.0


def _timed(call: object, *args: object) -> None:
    start = time.perf_counter()
    call(*args)  # type: ignore[operator]
    assert time.perf_counter() - start < BOUND_S


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(max_size=400), log_like))
def test_text_entry_points_never_raise(text: str) -> None:
    for call in (
        classify_line,
        classify_text,
    ):  # the components' own parsers: tests/components/*/test_fuzz.py
        _timed(call, text)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2000), st.integers(min_value=1, max_value=300))
def test_scanner_on_arbitrary_bytes(data: bytes, chunk: int) -> None:
    scanner = LogScanner()
    for offset in range(0, len(data), chunk):
        scanner.feed(data[offset : offset + chunk])
    scanner.finish()
    assert scan_bytes(data, include_all=True) is not None


@settings(max_examples=100, deadline=None)
@given(log_like, st.integers(min_value=1, max_value=64), st.booleans())
def test_scanner_on_log_like_bytes(text: str, chunk: int, include_all: bool) -> None:
    """Whatever the chunk boundaries, the scanner finds the events the whole log gives, each a contract
    record with a contract severity."""
    data = text.encode("utf-8", "surrogateescape")
    whole = scan_bytes(data, include_all=include_all)
    scanner = LogScanner(include_all=include_all)
    chunked = []
    for offset in range(0, len(data), chunk):
        chunked.extend(scanner.feed(data[offset : offset + chunk]))
    chunked.extend(scanner.finish())
    assert chunked == whole
    assert all(event.severity in ("info", "warning", "critical") for event in whole)


PATHOLOGICAL = [
    "a" * 200_000,
    ":" * 200_000,
    "0" * 200_000,
    "Xid (" * 40_000,
    "SXid (PCI:" * 20_000,
    "NVRM: Xid (PCI:0000:01:00): 13, name=" + "x" * 100_000,
    "NCCL WARN " * 20_000,
    " NCCL INFO " * 20_000,
    "host:1:2 [0] " * 20_000,
    "[rank" * 40_000,
    "WorkNCCL(" + "(ms)" * 50_000,
    "WorkNCCL(SeqNum=" + "9" * 100_000,
    "comm 0x" + "f" * 100_000,
    "a.cc:" * 40_000 + " -> 6",
    "[PG ID 0 PG GUID 0(" * 10_000,
    "MISMATCH " + "\n" * 100_000,
    "    Remapped Rows\n" + "        Pending : Yes\n" * 20_000,
    "Root Cause (first observed failure):\n" + "  rank : 1\n" * 20_000,
    "x" * 50_000 + "\r" * 50_000,
    "   RUNNING  " + "INCOMPLETE," * 20_000,
    " 1" * 100_000 + " RUNNING OK",
    "  " + "1 ranks reported " * 20_000,
    "Search for `cudaErrorX' in " + "h" * 100_000,
    "srun: " * 40_000,
    "NCCL WARN NET/IB: NCCL_" + "A" * 100_000 + " is out of range",
    "can could may might cause lead to " * 10_000,
    "| Page Retirement | " * 20_000,
    "XidCriticalError " + " " * 100_000 + '{"31":true}',
    "Xid" + "{" * 100_000,
    "mismatch between collectives on ranks." + " " * 100_000 + "CollectiveFingerPrint(OpType=X",
    "CollectiveFingerPrint(SequenceNumber=" + "9" * 100_000,
    "pcieport 0000:00:03.0:" + " " * 100_000 + "[1] X",
    "AER: Correctable error message received from " * 10_000,
    "EDAC MC0: " + "9" * 100_000,
    "NET/" + "a" * 100_000 + " : Got completion from peer",
    "ncclSocket" + "A" * 100_000 + ": x",
    "Bootstrap : no " + "x " * 50_000 + "interface found",
    "NCCL error: unhandled cuda error" + " " * 100_000 + ", NCCL version",
    "will start" + " " * 100_000 + "to dump the debug info",
    "GPU" + ":" * 100_000 + "PCI:0000:00:00",
    "NVRM: " + "fail " * 40_000,
    "0  " + "x" * 100_000 + " Off | 00000000:01:00.0 On | 1",
    "Running collective: CollectiveFingerPrint(" + "SequenceNumber=1," * 10_000,
    "[W" + " " * 100_000 + "[c10d]",
    "#  Rank " + "  " * 50_000 + "Group 0 Pid 1 on x device 0 [0000:00:00]",
    "Out of bounds values : " + "9" * 100_000 + " FAILED",
]


@pytest.mark.parametrize("text", PATHOLOGICAL, ids=lambda t: repr(t[:24]))
def test_pathological_inputs_are_bounded(text: str) -> None:
    _timed(classify_line, text)
    _timed(classify_text, text)
    _timed(scan_bytes, text.encode())
