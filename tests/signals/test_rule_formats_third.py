"""Formats the rules learnt from the third held-out set (tests/data/logs_eval/third_real_lines.jsonl).

As in test_rule_formats.py, each rule is a format of a producer or a labelling rule of
tests/data/corpus/logs/README.md; the tests generate lines of that format (hypothesis) and keep
counter-examples that must keep their old reading.
"""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from sentinel.signals import classify_line, classify_text

# --- PCIe AER: spellings of the kernel's AER driver, and whose address a message names ------------------

#: dmesg / journald wrappers in front of a kernel line (relative ``-H`` stamps included).
KERNEL_PREFIXES = ("", "[74889.542031] ", "[  +0.000844] ", "Sep 22 09:59:09 pve kernel: ")
#: The AER driver's severity words (older kernels: Corrected/Uncorrected, newer: Correctable/Uncorrectable)
#: and the severity the README gives each (corrected: the hardware fixed it; non-fatal: degraded).
AER_KINDS = {
    "Corrected": "info",
    "Correctable": "info",
    "Uncorrected (Non-Fatal)": "warning",
    "Uncorrectable (Non-Fatal)": "warning",
    "Uncorrected (Fatal)": "critical",
    "Uncorrectable (Fatal)": "critical",
}

bus = st.integers(0, 255)
slot = st.integers(0, 31)
func = st.integers(0, 7)


def _bdf(b: int, d: int, f: int) -> str:
    return f"0000:{b:02x}:{d:02x}.{f}"


@given(
    st.sampled_from(KERNEL_PREFIXES),
    st.sampled_from(sorted(AER_KINDS)),
    bus,
    slot,
    bus,
    slot,
    func,
    st.booleans(),
    st.booleans(),
)
def test_aer_error_message_severity_and_source(
    prefix: str,
    kind: str,
    port_bus: int,
    port_slot: int,
    src_bus: int,
    src_slot: int,
    src_fn: int,
    many: bool,
    new: bool,
) -> None:
    """The source a port names is a device below it (a GPU, recorded) only when its bus is after the port's:
    the port itself, or the root complex on its bus, is not a GPU."""
    port, src = _bdf(port_bus, port_slot, 0), _bdf(src_bus, src_slot, src_fn)
    received = f"error message received from {src}" if new else f"error received: {src}"
    line = f"{prefix}pcieport {port}: AER: {'Multiple ' if many else ''}{kind} {received}"
    event = classify_text(line)
    expected_pci = src[:10].lower() if src_bus > port_bus else None
    assert (event.kind, event.severity, event.pci_bus) == ("other", AER_KINDS[kind], expected_pci), line


@given(st.sampled_from(KERNEL_PREFIXES), st.sampled_from(sorted(AER_KINDS)), bus, slot)
def test_aer_bus_error_severity_line_without_the_aer_tag(prefix: str, kind: str, b: int, d: int) -> None:
    line = f"{prefix}pcieport {_bdf(b, d, 0)}: PCIe Bus Error: severity={kind}, type=Transaction Layer, (Receiver ID)"
    event = classify_text(line)
    assert (event.kind, event.severity, event.pci_bus) == ("other", AER_KINDS[kind], None), line
    # the raw (gated) reading agrees; a corrected error is noise there, as every info "other" line is
    gated = classify_line(line)
    assert (gated.severity if gated else "info") == AER_KINDS[kind]


#: Devices the AER driver names: only the NVIDIA GPU's own address is recorded.
AER_DEVICES = {"nvidia": True, "pcieport": False, "xhci_hcd": False, "snd_hda_intel": False}


@given(
    st.sampled_from(KERNEL_PREFIXES),
    st.sampled_from(sorted(AER_DEVICES)),
    bus,
    slot,
    func,
    st.sampled_from(["AER: can't recover (no error_detected callback)", "AER: device recovery failed"]),
)
def test_aer_recovery_failure_is_critical(
    prefix: str, device: str, b: int, d: int, f: int, what: str
) -> None:
    line = f"{prefix}{device} {_bdf(b, d, f)}: {what}"
    event = classify_text(line)
    expected_pci = _bdf(b, d, f)[:10] if AER_DEVICES[device] else None
    assert (event.kind, event.severity, event.pci_bus) == ("other", "critical", expected_pci), line


@given(st.sampled_from(KERNEL_PREFIXES), bus, slot, st.integers(0, 9))
def test_aer_link_reset_is_a_link_reinitialising(prefix: str, b: int, d: int, code: int) -> None:
    line = f"{prefix}pcieport {_bdf(b, d, 0)}: AER: Root Port link has been reset ({code})"
    event = classify_text(line)
    assert (event.kind, event.severity, event.pci_bus) == ("other", "warning", None)


AER_BITS = (
    "CmpltTO",
    "BadTLP",
    "BadDLLP",
    "Timeout",
    "Receiver Error",
    "SDES",
    "UnsupReq",
    "Surprise Down Error",
)


@given(
    st.sampled_from(KERNEL_PREFIXES),
    bus,
    slot,
    st.integers(0, 31),
    st.sampled_from(AER_BITS),
    st.sampled_from(["", "  (First)"]),
)
def test_aer_status_bit_line_is_a_warning(
    prefix: str, b: int, d: int, bit: int, name: str, first: str
) -> None:
    """One bit of an AER error's detail block: the error and its severity are on the line before."""
    line = f"{prefix}pcieport {_bdf(b, d, 0)}:    [{bit:2d}] {name:<22}{first}"
    for read in (classify_text(line), classify_line(line)):
        assert read is not None
        assert (read.kind, read.severity, read.pci_bus) == ("other", "warning", None), line


def test_aer_register_dump_lines_are_not_status_bits() -> None:
    line = "pcieport 0000:00:03.0:   device [8086:6f08] error status/mask=00004020/00000000"
    assert classify_text(line).reason != "pcie_aer_detail"


# --- host memory and machine checks: not GPU memory -----------------------------------------------------


@given(
    st.sampled_from(KERNEL_PREFIXES), st.integers(0, 15), st.integers(1, 10**6), st.sampled_from(["UE", "CE"])
)
def test_edac_host_memory_counts(prefix: str, mc: int, count: int, what: str) -> None:
    line = f"{prefix}EDAC MC{mc}: {count} {what} memory read error on CPU_SrcID#1_MC#1_Chan#2_DIMM#0 (channel:2 slot:0 page:0xb757589)"
    event = classify_text(line)
    assert (event.kind, event.severity) == ("other", "critical" if what == "UE" else "info"), line


@pytest.mark.parametrize(
    ("line", "severity"),
    [
        (" kernel:[Hardware Error]: Error Status: Corrected error, no action required.", "info"),
        ("mce: [Hardware Error]: Machine check events logged", "warning"),
        ("{1}[Hardware Error]: event severity: recoverable", "warning"),
        ("[Hardware Error]: Error Status: Uncorrected error", "critical"),
    ],
)
def test_machine_check_records(line: str, severity: str) -> None:
    assert (classify_text(line).kind, classify_text(line).severity) == ("other", severity)


# --- NVRM: a failure the GPU cannot go on from, or one it works on with ---------------------------------


@pytest.mark.parametrize(
    ("line", "severity"),
    [
        ("NVRM: _kgspRpcRecvPoll: GSP RM heartbeat timed out", "critical"),
        ("NVRM: GPU 0000:01:00.0: RmInitAdapter failed! (0x22:0x56:894)", "critical"),
        ("NVRM: The NVIDIA probe routine failed for 1 device(s).", "critical"),
        (
            "NVRM: API mismatch: the client has the version 535.54.03, but this kernel module has 550.54.15.",
            "critical",
        ),
        ("NVRM: nvAssertFailedNoLog: Assertion failed: 0 @ kernel_gsp.c:1476", "critical"),
        ("NVRM: GPU1 kbifCacheVFInfo_GB100: Unable to read NV_PF0_INITIAL_AND_TOTAL_VFS", "warning"),
        ("NVRM: knvlinkDiscoverPostRxDetLinks_GH100: Getting peer0's postRxDetLinkMask failed!", "warning"),
        (
            "NVRM: GPU4 GSP RPC buffer contains function 103 (GSP_RM_ALLOC) and data 0x0000000000002081.",
            "info",
        ),
    ],
)
def test_nvrm_failure_severity(line: str, severity: str) -> None:
    event = classify_text(f"Jul 09 10:42:47 pool0-0082 kernel: {line}")
    assert (event.kind, event.severity) == ("other", severity)


#: Words that name what the GPU cannot go on from (init, firmware, reset, loss, memory): a generated
#: register name holding one is not "a read that failed".
FATAL_WORDS: tuple[str, ...] = ("init", "probe", "attach", "mismatch", "assert", "halt", "reset", "gsp")
FATAL_WORDS += ("firmware", "heartbeat", "lost", "fallen", "hang", "timeout", "corrupt", "memory", "fatal")


@given(
    st.sampled_from(
        ["kbifCacheVFInfo", "knvlinkDiscoverPostRxDetLinks", "kbusGetBar1Info", "kpmgrReadSensor"]
    ),
    st.sampled_from(["_GH100", "_GB100", "_TU102", "_AD102", ""]),
    st.sampled_from(["Unable to read", "Failed to query", "Getting peer0's mask failed for"]),
    st.from_regex(r"NV_[A-Z0-9_]{3,20}", fullmatch=True),
)
def test_nvrm_read_failures_are_warnings(function: str, chip: str, what: str, register: str) -> None:
    assume(not any(word in register.lower() for word in FATAL_WORDS))
    line = f"NVRM: GPU0 {function}{chip}: {what} {register}"
    event = classify_text(line)
    assert (event.kind, event.severity) == ("other", "warning"), line


# --- NCCL's warnings quoted without its prefix (PyTorch's "Last error:") --------------------------------

ip = st.tuples(st.integers(1, 254), st.integers(0, 255), st.integers(0, 255), st.integers(1, 254)).map(
    lambda t: ".".join(map(str, t))
)


@given(
    st.sampled_from(["IB", "IBP", "IB/GIN", "OFI", "GDR"]),
    st.sampled_from(["", " "]),
    ip,
    st.integers(1, 65535),
    st.sampled_from([4, 5, 10, 12, 13]),
)
def test_bare_net_plugin_completion_error(plugin: str, space: str, peer: str, port: int, status: int) -> None:
    line = f"NET/{plugin}{space}:{space}Got completion from peer {peer}<{port}> with status={status} opcode=0 len=0 vendor err 129 (Send)"
    event = classify_text(line)
    # status 5 is a flushed request (IBV_WC_WR_FLUSH_ERR): the follow-up of an earlier one
    assert (event.kind, event.severity) == ("nccl_warn_net", "warning" if status == 5 else "critical"), line


@given(
    st.sampled_from(["ncclSocketInit", "ncclSocketConnect", "ncclSocketAccept"]),
    st.sampled_from(["", "[trainer0|0]:", "Last error: "]),
    st.integers(0, 65535),
)
def test_bare_nccl_socket_warning(function: str, prefix: str, family: int) -> None:
    line = f"{prefix}{function}: connecting to address with family {family} is neither AF_INET(2) nor AF_INET6(10)"
    for read in (classify_text(line), classify_line(line)):
        assert read is not None
        assert (read.kind, read.severity) == ("nccl_warn_net", "critical"), line


@pytest.mark.parametrize(
    "line",
    [
        "socketProgress: Connection closed by remote peer node1<57557>",
        "socketFinalizeAccept: wrong type 4 != 3",
        "socketStartConnect: Connect to 10.0.0.2<45763> failed : Software caused connection abort",
        "socketTryAccept: Accept failed: Interrupted system call",
    ],
)
def test_bare_socket_layer_warnings(line: str) -> None:
    """NCCL's socket.cc warnings (src/misc/socket.cc WARN("<function>: ...")) as PyTorch quotes them."""
    for read in (classify_text(line), classify_line(line)):
        assert read is not None
        assert (read.kind, read.severity) == ("nccl_warn_net", "critical"), line


@pytest.mark.parametrize(
    "line", ["Bootstrap : no socket interface found", "Bootstrap : no NCCL_SOCKET_IFNAME interface found"]
)
def test_bare_bootstrap_interface_warning(line: str) -> None:
    for read in (classify_text(line), classify_line(line)):
        assert read is not None
        assert (read.kind, read.severity) == ("nccl_warn_net", "critical")


@pytest.mark.parametrize(
    "line",
    [
        "host-2:38610:38610 [0] NCCL INFO socketStartConnect: Connect to 198.18.2.2<54298> failed : Connection refused",
        "node08:6561:6561 [0] NCCL INFO Bootstrap : Using ib0:10.252.0.211<0>",
        "[W socket.cpp:663] [c10d] The client socket has failed to connect to [localhost]:29500 (errno: 99).",
    ],
)
def test_prefixed_or_torch_socket_lines_keep_their_reading(line: str) -> None:
    assert classify_text(line).reason not in ("nccl_socket_error", "nccl_net_error")


# --- NCCL's result string relayed by a program that is not PyTorch --------------------------------------

#: ncclGetErrorString texts and the NCCL kind the README gives a failure naming them.
RESULTS = {
    "unhandled cuda error (run with NCCL_DEBUG=INFO for details)": "nccl_warn_cuda",
    "unhandled system error (run with NCCL_DEBUG=INFO for details)": "nccl_warn_other",
    "internal error - please report this issue to the NCCL developers": "nccl_warn_other",
    "remote process exited or there was a network error": "nccl_warn_net",
    "invalid usage (run with NCCL_DEBUG=WARN for details)": "nccl_warn_other",
}
#: Wrappers of programs that are neither NCCL nor PyTorch (vLLM workers, Ray actors).
RELAY_WRAPPERS = (
    "(VllmWorkerProcess pid={n}) ERROR 07-24 08:26:01 multiproc_worker_utils.py:226] Exception in worker VllmWorkerProcess while processing method init_device: ",
    "(RayWorkerWrapper pid={n}) ERROR 08-27 05:12:18 worker_base.py:382] RuntimeError: ",
    "RuntimeError: ",
)


@given(st.sampled_from(RELAY_WRAPPERS), st.integers(1, 10**6), st.sampled_from(sorted(RESULTS)))
def test_relayed_nccl_result_is_an_nccl_failure(wrapper: str, pid: int, result: str) -> None:
    line = wrapper.format(n=pid) + f"NCCL error: {result}"
    event = classify_text(line)
    assert (event.kind, event.severity) == (RESULTS[result], "critical"), line


@given(st.sampled_from(sorted(RESULTS)), st.integers(0, 512))
def test_pytorch_printing_the_same_result_stays_pytorch(result: str, rank: int) -> None:
    short = result.split(" (", maxsplit=1)[0]
    lines = [
        f"[rank{rank}]:[E ProcessGroupNCCL.cpp:1575] [PG 0 Rank {rank}] Process group watchdog thread terminated with exception: NCCL error: {short}",
        f"RuntimeError: NCCL error: {short}, NCCL version 2.20.5",
    ]
    for line in lines:
        assert classify_text(line).kind == "torch_other_error", line


# --- PyTorch announcing the dump a timeout triggered; schedulers ending a step; GPUs named by health tools


@given(st.integers(0, 4095), st.sampled_from(["this local rank", " rank 3"]), st.booleans())
def test_dump_announcement_severity_is_whose_timeout_it_is(rank: int, source: str, wrapped: bool) -> None:
    """This rank's own timeout ("from this local rank") is a collective timeout (critical); another rank's
    is a follow-up here (warning)."""
    text = (
        f"[rank{rank}]:[E327 17:04:16.182548526 ProcessGroupNCCL.cpp:1346] [PG 0 Rank {rank}] Received a timeout "
        f"signal from {source} and will start to dump the debug info. Last enqueued NCCL work: 2, last completed NCCL work: 1."
    )
    if wrapped:
        text = text.replace(" will start to ", " will start\n   to ")
    event = classify_text(text)
    severity = "critical" if source == "this local rank" else "warning"
    assert (event.kind, event.severity, event.rank) == ("torch_other_error", severity, rank)


@given(st.integers(1, 10**9), st.integers(0, 9))
def test_scheduler_terminating_a_step_is_a_warning(job: int, step: int) -> None:
    line = f"srun: Terminating job step {job}.{step}"
    event = classify_line(line)
    assert event is not None and (event.kind, event.severity) == ("other", "warning")


@given(
    st.sampled_from(["GpuPowerWatchIsNotHealthy", "GpuThermalWatchIsNotHealthy", "GpuPcieWatch"]),
    st.integers(0, 7),
    bus,
    slot,
)
def test_health_tool_names_the_gpu_address(check: str, gpu: int, b: int, d: int) -> None:
    line = (
        f"{check} Message=ErrorCode:DCGM_FR_CLOCK_THROTTLE_POWER GPU:{gpu} PCI:{_bdf(b, d, 0)} "
        f"Detected clocks event due to power violation in GPU {gpu}. Recommended Action=NONE;"
    )
    event = classify_text(line)
    assert (event.kind, event.severity, event.pci_bus) == ("other", "warning", _bdf(b, d, 0)[:10])


def test_an_address_not_named_as_a_gpus_is_not_recorded() -> None:
    line = "NIC mlx5_0 PCI:0000:3b:00.0 reported a failure; GPU work continues"
    assert classify_text(line).pci_bus is None


# --- batch 2 of the third set: launchers, c10d levels, debug fingerprints, GPU tools naming a GPU --------


@given(st.integers(-64, 255), st.sampled_from(["", "[2024-03-20 20:31:29,269] "]), st.integers(1, 10**6))
def test_deepspeed_launcher_exit_code_decides(code: int, stamp: str, pid: int) -> None:
    """A negative return code is a worker killed by a signal (critical); a positive one an exit whose cause
    is elsewhere (warning); the launcher killing its other workers is its teardown (warning)."""
    line = f"{stamp}[ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python3', '-u', 'main.py'] exits with return code = {code}"
    event = classify_text(line)
    if code != 0:
        assert (event.kind, event.severity) == ("other", "critical" if code < 0 else "warning"), line
    teardown = classify_text(f"{stamp}[INFO] [launch.py:428:sigkill_handler] Killing subprocess {pid}")
    assert (teardown.kind, teardown.severity) == ("other", "warning")


@given(
    st.sampled_from(["[W503 01:52:07.597517393 socket.cpp:204] ", "[W socket.cpp:204] "]), st.integers(-9, -1)
)
def test_c10d_warning_level_without_failure_words(header: str, err: int) -> None:
    line = f"{header}[c10d] The hostname of the client socket cannot be retrieved. err={err}"
    event = classify_text(line)
    assert (event.kind, event.severity) == ("torch_other_error", "warning")


def test_c10d_info_level_line_stays_info() -> None:
    line = "[I socket.cpp:480] [c10d] The server socket has started to listen on [::]:29500."
    assert classify_text(line).severity == "info"


@given(
    st.integers(0, 4095),
    st.integers(0, 10**7),
    st.sampled_from(["ALLREDUCE", "BROADCAST", "_ALLGATHER_BASE"]),
)
def test_fingerprint_debug_line_names_the_collective(rank: int, seq: int, op: str) -> None:
    line = (
        f"[I ProcessGroupWrapper.cpp:562] [Rank {rank}] Running collective: CollectiveFingerPrint("
        f"SequenceNumber={seq}, OpType={op}, TensorShape=[], TensorDtypes=Float)"
    )
    event = classify_text(line)
    assert (event.kind, event.severity, event.rank, event.seq, event.op) == ("other", "info", rank, seq, op)


@given(st.integers(0, 4095))
def test_deepspeed_log_dist_rank(rank: int) -> None:
    line = f"[2025-03-07 23:55:15,357] [INFO] [logging.py:128:log_dist] [Rank {rank}] DeepSpeed info: version=0.16.3"
    assert classify_text(line).rank == rank


@given(st.sampled_from(["'timeout': 900", '"timeout": 900', "timeout=900", "'retry': 3"]))
def test_configuration_values_name_no_failure(field: str) -> None:
    assert classify_text(f"  rdzv_configs     : {{{field}}}").severity == "info"


@given(
    st.integers(0, 7),
    st.sampled_from(["NVIDIA A100-SXM4-80GB", "NVIDIA RTX A2000 Laptop GPU", "NVIDIA GeForce ..."]),
    st.sampled_from(["On", "Off"]),
    bus,
    st.sampled_from(["N/A", "0", "2", "117"]),
)
def test_nvidia_smi_gpu_row(index: int, name: str, persistence: str, b: int, ecc: str) -> None:
    """The row names the GPU's address; a non-zero volatile uncorrected-ECC cell is an uncorrectable memory
    error (critical), through the raw (gated) reading too."""
    line = f"|   {index}  {name:<24}  {persistence:>3}  |   00000000:{b:02X}:00.0 Off |{ecc:>22} |"
    event = classify_text(line)
    failing = ecc not in ("N/A", "0")
    expected = ("ecc", "critical") if failing else ("other", "info")
    assert (event.kind, event.severity, event.pci_bus) == (*expected, f"0000:{b:02x}:00"), line
    gated = classify_line(line)
    assert (gated is not None) == failing


@given(bus, slot, st.sampled_from(["registered", "unregistered"]))
def test_persistenced_names_the_gpu(b: int, d: int, what: str) -> None:
    line = f"May 31 05:33:40 kino1 nvidia-persistenced[19176]: device {_bdf(b, d, 0)} - {what}"
    event = classify_text(line)
    assert (event.kind, event.severity, event.pci_bus) == ("other", "info", _bdf(b, d, 0)[:10])


def test_persistenced_failure_keeps_its_failure_words() -> None:
    line = "May 31 05:33:40 kino1 nvidia-persistenced[19176]: device 0000:3d:00.0 - failed to open"
    assert classify_text(line).severity == "warning"


# --- batch 3: nccl-tests verdicts and banners, Kubernetes' OOMKilled -----------------------------------


@given(st.integers(0, 10**6), st.sampled_from(["", "[1,0]<stdout>:", "# "]))
def test_nccl_tests_wrong_values_verdict(count: int, prefix: str) -> None:
    failed = count > 0
    line = f"{prefix}# Out of bounds values : {count} {'FAILED' if failed else 'OK'}"
    event = classify_text(line)
    expected = ("nccl_warn_other", "critical") if failed else ("other", "info")
    assert (event.kind, event.severity) == expected, line


@given(st.integers(0, 4095), st.integers(1, 10**6), st.integers(0, 0xFFFF), bus, slot, st.integers(0, 7))
def test_nccl_tests_device_banner_names_the_gpu(
    rank: int, pid: int, domain: int, b: int, d: int, dev: int
) -> None:
    address = f"{domain:04x}:{b:02x}:{d:02x}"
    line = f"#  Rank {rank:2d} Group  0 Pid {pid:6d} on     h100-2 device  {dev} [{address}] NVIDIA H100 80GB HBM3"
    event = classify_text(line)
    assert (event.kind, event.severity, event.pci_bus, event.rank) == ("other", "info", address, None)


def test_nccl_tests_banner_with_a_bare_bus_records_no_address() -> None:
    line = "#  Rank  1 Group  0 Pid   4940 on ai-worker03 device  0 [0x61] NVIDIA L40"
    assert classify_text(line).pci_bus is None


@given(
    st.sampled_from(
        ["      Reason:       OOMKilled", "Last State: Terminated (OOMKilled)", "reason: OOMKilled"]
    )
)
def test_kubernetes_oom_killed_is_a_crash(line: str) -> None:
    for read in (classify_text(line), classify_line(line)):
        assert read is not None
        assert (read.kind, read.severity) == ("other", "critical"), line
