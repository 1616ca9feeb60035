"""Formats the rules learnt from the fourth evaluation set (tests/data/logs_eval/unseen_lines.jsonl).

Each rule is a labelling rule of tests/data/corpus/logs/README.md applied to a producer's format: the
tests generate lines of that format (hypothesis) and check the reading, with the counter-cases that must
keep the other reading.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sentinel.components.xid.sxid import NON_FATAL_SXIDS
from sentinel.signals import classify_text

rank = st.integers(0, 4095)
work = st.integers(-1, 10**7)
#: PyTorch's process-group tags of the default group (its ranks are global), torch 2.2 to 2.9.
DEFAULT_TAGS = ("[PG 0 Rank {r}]", "[PG 0 (default_pg) Rank {r}]", "[PG ID 0 PG GUID 0(default_pg) Rank {r}]")
GLOG = ("[E ProcessGroupNCCL.cpp:1316]", "[E1105 14:02:11.661209870 ProcessGroupNCCL.cpp:1858]")

# --- Flight Recorder dump signals: whose timeout it is decides -----------------------------------------

#: The monitor thread's wordings (torch 2.2-2.3 and 2.4+): the local rank's own timeout, or another rank's.
LOCAL = (
    "Received a timeout signal from this local rank and will start to dump the debug info.",
    "Received a dump signal from this local rank and will start to dump the debug info.",
    "Received a dump signal due to a collective timeout from this local rank and we will try our best to "
    "dump the debug info.",
)
PEER = (
    "Received a global timeout from another rank and will start to dump the debug info.",
    "Received a dump signal due to a collective timeout from  rank {p} and we will try our best to dump the "
    "debug info.",
    "Observed flight recorder dump signal from another rank via TCPStore.",
)
#: The dump signal's bookkeeping in the store: follow-ups of the timeout the watchdog reports.
STORE = (
    'Failed to check the "should dump" flag on TCPStore, (maybe TCPStore server has shut down too early), '
    "with error: Connection reset by peer",
    "Failed to get timeout rank ID from TCPStore.Connection reset by peer",
    "Broadcasting signal exception_dump to other ranks via TCPStore.",
    "Failed to broadcast signal exception_dump through TCPStore.",
    "First PG on this rank to signal dumping.",
    "First PG on this rank detecting the dump signal through tcpstore.",
    "Failed to get exception dump flag from the global store.Connection reset by peer",
)


@given(
    rank,
    rank,
    work,
    st.sampled_from(DEFAULT_TAGS),
    st.sampled_from(GLOG),
    st.sampled_from(LOCAL + PEER),
    st.booleans(),
)
def test_dump_signal_is_critical_only_for_the_rank_that_timed_out(
    r: int, peer: int, last: int, tag: str, glog: str, message: str, prefixed: bool
) -> None:
    text = f"{glog} {tag.format(r=r)} {message.format(p=peer)} Last enqueued NCCL work: {last}, last completed NCCL work: {last - 1}."
    if prefixed:
        text = f"[rank{r}]:" + text
    event = classify_text(text)
    severity = "critical" if message in LOCAL else "warning"
    assert (event.kind, event.severity, event.rank, event.seq) == ("torch_other_error", severity, r, None), (
        text
    )


@given(rank, st.sampled_from(DEFAULT_TAGS), st.sampled_from(STORE), st.sampled_from(["W", "E"]))
def test_dump_signal_bookkeeping_is_a_follow_up(r: int, tag: str, message: str, level: str) -> None:
    text = f"[rank{r}]:[{level}1105 14:05:01.118802277 ProcessGroupNCCL.cpp:1770] {tag.format(r=r)} {message}"
    event = classify_text(text)
    assert (event.kind, event.severity, event.rank) == ("torch_other_error", "warning", r), text


@given(
    rank,
    work,
    st.sampled_from(["ALLREDUCE", "BROADCAST", "_ALLGATHER_BASE", "RECV"]),
    st.integers(1, 10**7),
    st.sampled_from(["", " (TORCH_NCCL_BLOCKING_WAIT=1)"]),
)
def test_blocking_wait_timeout_is_a_collective_timeout(
    r: int, seq: int, op: str, timeout: int, tail: str
) -> None:
    text = (
        f"RuntimeError: [Rank {r}] Work WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn=8, NumelOut=8, "
        f"Timeout(ms)={timeout}) timed out in blocking wait{tail}."
    )
    event = classify_text(text)
    assert (event.kind, event.severity, event.rank, event.seq, event.op, event.timeout_ms) == (
        "torch_watchdog_timeout",
        "critical",
        r,
        seq,
        op,
        timeout,
    )


# --- PyTorch's own warning level; its [Rank N] tag on lines read from their words ----------------------


@given(rank, st.sampled_from(["Connection reset by peer", "Broken pipe", "Connection closed by peer"]))
def test_pytorch_warning_level_caps_a_broken_connection(r: int, error: str) -> None:
    line = (
        "[PG ID 0 PG GUID 0(default_pg) Rank {r}] Failed to check the signal remote_error:0 on TCPStore, {e}"
    )
    warned = classify_text(
        f"[rank{r}]:[W1105 14:05:01.118802277 ProcessGroupNCCL.cpp:1337] " + line.format(r=r, e=error)
    )
    failed = classify_text(
        f"[rank{r}]:[E1105 14:05:01.118802277 ProcessGroupNCCL.cpp:1337] " + line.format(r=r, e=error)
    )
    assert (warned.severity, failed.severity) == ("warning", "critical")
    assert warned.rank == failed.rank == r


@given(rank, st.integers(0, 99))
def test_rule_read_pytorch_failure_takes_its_rank_tag(r: int, peer: int) -> None:
    text = (
        f"[E ProcessGroupNCCL.cpp:1042] [Rank {r}] Found key in store: NCCLABORTEDCOMM:3a7f09e2c1b54d, from rank: "
        f"{peer}. This means that rank has aborted its NCCL communicators previously and is not in a healthy "
        "state.. Aborting appropriate communicators"
    )
    event = classify_text(text)
    assert (event.kind, event.severity, event.rank) == ("torch_other_error", "critical", r)


# --- NVSwitch: a non-fatal error is never rated like a fatal one ---------------------------------------


@given(st.integers(0, 63), st.sampled_from(["", "DCGM_FR_NVSWITCH_{W}_ERROR: "]))
def test_dcgm_nvswitch_error_severity_follows_its_word(switch: int, prefix: str) -> None:
    non = classify_text(
        prefix.format(W="NON_FATAL") + f"Detected one or more non-fatal errors on NVSwitch {switch}"
    )
    fatal = classify_text(
        prefix.format(W="FATAL") + f"Detected one or more fatal errors on NVSwitch {switch}"
    )
    assert (non.kind, non.severity) == ("other", "warning")
    assert (fatal.kind, fatal.severity) == ("other", "critical")


@given(
    st.integers(1, 65535),
    st.sampled_from(["fatal", "non-fatal", "non fatal"]),
    st.integers(0, 255),
    st.integers(0, 63),
)
def test_fabric_manager_error_is_graded_by_the_sxid_table(code: int, word: str, b: int, port: int) -> None:
    line = (
        f"[Nov 05 2025 14:07:11] [ERROR] [tid 5521] detected NVSwitch {word} error {code} on fid 0 on NVSwitch "
        f"pci bus id 00000000:{b:02x}:00.0 physical id 3 port {port}"
    )
    event = classify_text(line)
    # the line's own word wins over the table; the table is asked, never bypassed
    assert (event.kind, event.sxid, event.pci_bus) == ("other", code, f"0000:{b:02x}:00")
    assert event.severity == ("critical" if word == "fatal" else "warning"), line


@given(st.sampled_from(sorted(NON_FATAL_SXIDS)), st.integers(0, 255))
def test_sxid_continuation_of_a_non_fatal_code_is_a_warning(code: int, b: int) -> None:
    line = f"nvidia-nvswitch2: SXid (PCI:0000:{b:02x}:00.0): {code}, Data {{0x00000000, 0x00000001}}"
    assert classify_text(line).severity == "warning"


@given(st.sampled_from(["single-bit", "uncorrectable", "double-bit"]), st.integers(0, 63))
def test_nvswitch_ecc_error_is_not_gpu_memory(what: str, port: int) -> None:
    line = f"NVSwitch non-fatal error detected on NVSwitch 2, port {port}: ingress ECC {what} error"
    event = classify_text(line)
    assert (event.kind, event.severity) == ("other", "warning")


@given(st.integers(0, 17), st.integers(0, 255))
def test_nvrm_non_fatal_nvlink_error_is_a_warning(link: int, b: int) -> None:
    line = f"NVRM: nvlink: NVLink non-fatal error detected on link {link} of GPU 0000:{b:02x}:00.0"
    fatal = line.replace("non-fatal", "fatal")
    assert classify_text(line).severity == "warning"
    assert classify_text(fatal).severity == "critical"


@given(
    rank,
    st.sampled_from(
        ["[F ProcessGroupNCCL.cpp:1396]", "[F1105 14:10:11.201334512 ProcessGroupNCCL.cpp:1614]"]
    ),
    st.sampled_from(
        [
            "ProcessGroupNCCL's watchdog detected a dump signal from rank 2 and notified the current rank.",
            "ProcessGroupNCCL's watchdog detected an exception from the local rank.",
            "Terminating the process after attempting to dump debug info, due to collective timeout or exception.",
        ]
    ),
)
def test_process_group_fatal_log_is_critical(r: int, header: str, message: str) -> None:
    """LOG(FATAL) aborts the process after printing: whatever the message, the process is gone."""
    fatal = classify_text(f"[rank{r}]:{header} [PG 0 Rank {r}] {message}")
    assert (fatal.kind, fatal.severity, fatal.rank) == ("torch_other_error", "critical", r)


@given(rank, st.sampled_from(["collective timeout or exception", "ProcessGroupNCCL watchdog hang"]))
def test_monitor_disabled_but_would_have_terminated_is_critical(r: int, reason: str) -> None:
    """With monitoring off nothing ends the hang: as critical as the termination it would have been."""
    text = (
        f"[rank{r}]:[E1105 14:10:44.118230551 ProcessGroupNCCL.cpp:1620] [PG ID 0 PG GUID 0(default_pg) Rank {r}] "
        "ProcessGroupNCCL monitor thread is disabled, but would have terminated the process after attempting to "
        f"dump debug info, due to {reason}."
    )
    event = classify_text(text)
    assert (event.kind, event.severity, event.rank) == ("torch_other_error", "critical", r)


@given(rank, st.sampled_from(["did not finish within 15000 ms.", "failed: basic_ios::clear: iostream error"]))
def test_flight_recorder_dump_trouble_is_a_follow_up(r: int, tail: str) -> None:
    text = f"[rank{r}]:[E1105 14:02:44.118230551 HeartbeatMonitor.cpp:201] [PG ID 0 PG GUID 0(default_pg) Rank {r}] Flight recorder dump {tail}"
    event = classify_text(text)
    assert (event.kind, event.severity, event.rank) == ("torch_other_error", "warning", r)
