"""Formats the rules learnt from the second held-out set (tests/data/logs_eval/extra_real_lines.jsonl).

Each rule is a format or a labelling rule of tests/data/corpus/logs/README.md, so each test checks the
rule on lines it was not written from: generated ones (hypothesis) and counter-examples that must keep
their old reading.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sentinel.signals import classify_line, classify_text

# --- NCCL RAS client: summary rows whose errors column joins several flags ----------------------------

RAS_FLAGS = ("INCOMPLETE", "ERROR", "MISMATCH")
RAS_STATUS = ("RUNNING", "INIT", "FINALIZE", "ABORTED")
#: Counts as ncclras prints them: group index, communicators, nodes, ranks (the row regex takes up to 9
#: digits for the group and 12 for the counts; a job has far fewer).


def _ras_row(numbers: list[int], per_node: str, status: str, errors: str) -> str:
    # ncclras prints "%5d  %8d  %8d  %8s  %8d  %8d  %8s  %6s" (src/ras/client_support.cc).
    group, comms, nodes, ranks, in_group = numbers
    return f"{group:5d}  {comms:8d}  {nodes:8d}  {per_node:>8s}  {ranks:8d}  {in_group:8d}  {status:>8s}  {errors:>6s}"


per_node_st = st.one_of(
    st.integers(0, 72).map(str),
    st.tuples(st.integers(0, 8), st.integers(0, 8)).map(lambda t: f"{t[0]}-{t[1]}"),
)


@given(
    st.lists(st.integers(0, 10**6), min_size=5, max_size=5),
    per_node_st,
    st.sampled_from(RAS_STATUS),
    st.lists(st.sampled_from(RAS_FLAGS), min_size=1, max_size=3, unique=True),
)
def test_ras_summary_row_with_error_flags_is_an_nccl_warning(
    numbers: list[int], per_node: str, status: str, flags: list[str]
) -> None:
    event = classify_text(_ras_row(numbers, per_node, status, ",".join(flags)))
    assert (event.kind, event.severity) == ("nccl_warn_other", "warning")


@given(st.lists(st.integers(0, 10**6), min_size=5, max_size=5), per_node_st, st.sampled_from(RAS_STATUS))
def test_ras_summary_row_ok_is_info(numbers: list[int], per_node: str, status: str) -> None:
    event = classify_text(_ras_row(numbers, per_node, status, "OK"))
    assert (event.kind, event.severity) == ("nccl_info", "info")


#: ncclGetErrorString texts and the kind the README gives a failure naming them.
NCCL_ERRORS = {
    "remote process exited or there was a network error": "nccl_warn_net",
    "unhandled cuda error (run with NCCL_DEBUG=INFO for details)": "nccl_warn_cuda",
    "unhandled system error (run with NCCL_DEBUG=INFO for details)": "nccl_warn_other",
    "internal error - please report this issue to the NCCL developers": "nccl_warn_other",
}


@given(st.integers(1, 10**6), st.sampled_from(sorted(NCCL_ERRORS)), st.sampled_from(["", "  ", "    "]))
def test_ras_errors_section_lines(count: int, error: str, indent: str) -> None:
    plural = "s" if count > 1 else ""
    for kind in ("Initialization", "Asynchronous"):
        event = classify_text(f"{indent}{kind} error{plural} on {count} rank{plural}")
        assert (event.kind, event.severity) == ("nccl_warn_other", "critical")
    event = classify_text(f"{indent}{count} rank{plural} reported {error}")
    assert (event.kind, event.severity) == (NCCL_ERRORS[error], "critical")


@given(st.integers(0, 99), st.integers(0, 99), st.text("0123456789abcdef", min_size=16, max_size=16))
def test_ras_communicator_report_kind_follows_the_reported_error(group: int, comm: int, digest: str) -> None:
    for error, kind in NCCL_ERRORS.items():
        block = (
            f"#{group}-{comm} ({digest}) ERROR\n  Asynchronous errors on 2 ranks\n  2 ranks reported {error}"
        )
        event = classify_text(block)
        assert (event.kind, event.severity) == (kind, "critical"), error


# --- NCCL complaints about its own settings ------------------------------------------------------------

env_name = st.from_regex(r"NCCL_[A-Z][A-Z0-9_]{1,30}", fullmatch=True)


@given(
    env_name, st.integers(-(10**9), 10**9), st.sampled_from(["NET/IB: ", "NET/IB : ", "NET/Socket : ", ""])
)
def test_nccl_setting_out_of_range_is_a_warning_in_any_transport(
    name: str, value: int, transport: str
) -> None:
    line = f"h100-03:7781:7781 [2] transport/net_ib/connect.cc:529 NCCL WARN {transport}{name}={value} is out of range [1,32]"
    event = classify_text(line)
    assert event.severity == "warning", line
    assert event.kind.startswith("nccl_warn")


def test_real_network_failures_stay_critical_next_to_a_setting_name() -> None:
    line = (
        "gpu7:1234:5678 [2] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer "
        "10.1.1.7<42101> with status=12 opcode=0 len=0 vendor err 129 (Send) NCCL_IB_TIMEOUT=22"
    )
    event = classify_text(line)
    assert (event.kind, event.severity) == ("nccl_warn_net", "critical")


# --- schedulers report how a step ended, not why ---------------------------------------------------------

node = st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True)
job = st.integers(1, 10**9)


@given(node, job, st.integers(1, 600))
def test_scheduler_step_ends_are_warnings(host: str, jobid: int, seconds: int) -> None:
    lines = [
        f"srun: Job step aborted: Waiting up to {seconds} seconds for job step to finish.",
        f"slurmstepd: error: *** JOB {jobid} ON {host} CANCELLED AT 2024-04-20T09:09:37 DUE TO TIME LIMIT ***",
        f"slurmstepd-{host}: error: *** STEP {jobid}.0 ON {host} CANCELLED AT 2023-12-03T12:47:09 ***",
        f"srun: Force Terminated job {jobid}",
        f"srun: error: {host}: tasks 0-3: Terminated",
    ]
    for line in lines:
        event = classify_text(line)
        assert (event.kind, event.severity) == ("other", "warning"), line
        assert classify_text(f"node-17: {line}").severity == "warning", line


@given(node, st.integers(0, 4096))
def test_scheduler_reporting_a_crash_or_oom_kill_stays_critical(host: str, task: int) -> None:
    for line in (
        f"srun: error: {host}: task {task}: Killed",
        f"srun: error: {host}: task {task}: Segmentation fault (core dumped)",
        f"slurmstepd: error: Detected 1 oom_kill event in StepId={task}.0. Some of the step tasks have been OOM Killed.",
    ):
        assert classify_text(line).severity == "critical", line


# --- failure words the first sets did not have; advice that is not a failure ----------------------------


@pytest.mark.parametrize(
    "line",
    [
        "STALL rank 0 on node0: no progress past step 324 for 120s",
        "worker 3 stalled for 600s",
        "submitit WARNING (2022-08-12 02:06:11,453) - Caught signal SIGUSR2 on gpu-1: this job is preempted.",
    ],
)
def test_stalls_and_preemption_are_warnings_also_through_the_gate(line: str) -> None:
    assert classify_text(line).severity == "warning"
    gated = classify_line(line)
    assert gated is not None and gated.severity == "warning"


@pytest.mark.parametrize(
    ("line", "severity"),
    [
        (
            "[rank6]:[W319 12:03:46.604992123 ProcessGroupNCCL.cpp:4721] [PG ID 0 PG GUID 0 Rank 6]  using GPU 6 as "
            "device used by this process is currently unknown. This can potentially cause a hang if this rank to GPU "
            "mapping is incorrect.",
            "info",
        ),
        ("This may lead to a deadlock if two groups overlap.", "info"),
        # A hedge next to a failure that happened is still that failure.
        ("Connection refused: this could cause a hang of the step", "warning"),
        ("The job hung for 30 minutes", "warning"),
        # An orderly shutdown is not a link or node going down.
        (
            "W0227 17:39:41.936000 293817 torch/distributed/elastic/agent/server/api.py:719] Received 15 death "
            "signal, shutting down workers",
            "info",
        ),
        ("the job is shutting down after 3 epochs", "info"),
        ("[ 4120.556101] mlx5_core 0000:01:00.1 enp1s0f1: Link down", "warning"),
        ("node3 went down during the step", "warning"),
    ],
)
def test_hedged_advice_and_orderly_shutdown_name_no_failure(line: str, severity: str) -> None:
    assert classify_text(line).severity == severity


# --- diagnostics cells that passed, CUDA follow-ups, gloo mesh setup -------------------------------------


@pytest.mark.parametrize(
    ("cell", "verdict", "kind", "severity"),
    [
        ("Page Retirement/Row Remap", "Pass", "other", "info"),
        ("Page Retirement/Row Remap", "Passed", "other", "info"),
        ("Page Retirement/Row Remap", "Fail - GPU: 1", "ecc", "warning"),
        ("Pending page retirement", "0", "other", "info"),
    ],
)
def test_memory_rows_of_diagnostics_tables(cell: str, verdict: str, kind: str, severity: str) -> None:
    event = classify_text(f"| {cell:<25} | {verdict:<46} |")
    assert (event.kind, event.severity) == (kind, severity)


@given(st.from_regex(r"cudaError[A-Z][A-Za-z]{2,30}", fullmatch=True), st.sampled_from(["", "[rank3]: "]))
def test_search_for_cuda_error_line_is_a_follow_up(name: str, prefix: str) -> None:
    url = "https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html"
    event = classify_text(f"{prefix}Search for `{name}' in {url} for more information.")
    assert (event.kind, event.severity) == ("torch_other_error", "warning")


def test_cuda_error_with_its_search_hint_on_one_line_stays_the_error() -> None:
    url = "https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html"
    line = f"CUDA error: an illegal memory access was encountered Search for `cudaErrorIllegalAddress' in {url} for more information."
    assert classify_text(line).severity == "critical"


@given(
    st.integers(0, 100_000), st.sampled_from(["pair.cc:144] no error", "pair.h:301] Connect timeout [none]"])
)
def test_gloo_full_mesh_setup_failure_stops_the_job(rank: int, cause: str) -> None:
    line = f"[rank{rank}]:[E421 02:05:38.764490322 ProcessGroupGloo.cpp:143] Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/{cause}"
    event = classify_text(line)
    assert (event.kind, event.severity, event.rank) == ("torch_other_error", "critical", rank)


# --- rules from the second batch of the held-out set (records with "batch": 2) --------------------------


@given(
    st.tuples(st.integers(0, 255), st.integers(0, 255), st.integers(0, 255), st.integers(0, 255)),
    st.integers(1, 65535),
    st.sampled_from(["closed by remote peer", "reset by peer", "refused", "timed out"]),
)
def test_quoted_nccl_socket_failure_without_prefix(ip: tuple[int, ...], port: int, what: str) -> None:
    """NCCL's "Last error:" payload quoted on its own line is still NCCL's network failure."""
    peer = ".".join(map(str, ip))
    event = classify_text(f"Net : Connection {what} {peer}<{port}>")
    assert (event.kind, event.severity) == ("nccl_warn_net", "critical")


@pytest.mark.parametrize("prefix", ["", "failed to get remapped rows for GPU-ac89: ", "nvml: "])
def test_nvml_gpu_lost_enum_is_critical(prefix: str) -> None:
    for name in ("ERROR_GPU_IS_LOST", "NVML_ERROR_GPU_IS_LOST"):
        event = classify_text(f"{prefix}failed to get device remapped rows: {name}")
        assert (event.kind, event.severity) == ("other", "critical")


def test_driver_crash_dump_notice_is_the_follow_up_of_an_xid() -> None:
    notice = "[1084456.074591] NVRM: A GPU crash dump has been created. If possible, please run"
    assert (classify_text(notice).kind, classify_text(notice).severity) == ("other", "warning")
    # The failure itself keeps its reading.
    xid = "[1084456.074562] NVRM: Xid (PCI:0000:09:00): 79, pid=0, GPU has fallen off the bus."
    assert (classify_text(xid).kind, classify_text(xid).severity) == ("xid", "critical")


@pytest.mark.parametrize(
    ("device", "pci"),
    [
        ("pcieport 0000:00:01.1", None),
        ("nvidia 0000:3b:00.0", "0000:3b:00"),
        ("pci 0000:17:00.0", "0000:17:00"),
    ],
)
def test_aer_severity_line_records_only_a_device_not_a_root_port(device: str, pci: str | None) -> None:
    event = classify_text(
        f"[1086487.613071] {device}: AER: PCIe Bus Error: severity=Corrected, type=Data Link Layer"
    )
    assert (event.kind, event.severity, event.pci_bus) == ("other", "info", pci)


@given(st.sampled_from([13, 31, 43, 45, 48, 63, 64, 74, 79, 94, 95, 119, 154]), st.integers(0, 10**6))
def test_kubernetes_xid_node_condition(code: int, seconds: int) -> None:
    line = (
        f"  XidCriticalError     True    Mon, 23 Jun 2025 18:45:43 +0000   Mon, 23 Jun 2025 18:44:57 +0000   "
        f'{{"{code}":true}}                  6e43a052-e544-467b-a972-{seconds:012d}'
    )
    event = classify_text(line)
    assert (event.kind, event.xid) == ("xid", code)


# --- rules from the third batch (records with "batch": 3) ----------------------------------------------


@given(
    st.sampled_from(["determine", "detect"]),
    st.sampled_from(["GPU ", "GPU"]),
    st.integers(0, 255),
    st.sampled_from(["Unknown Error", "GPU is lost. Reboot the system to recover this GPU"]),
)
def test_nvidia_smi_losing_a_gpu(verb: str, gpu: str, bus: int, why: str) -> None:
    line = f"Unable to {verb} the device handle for {gpu}0000:{bus:02X}:00.0: {why}"
    event = classify_text(line)
    assert (event.kind, event.severity, event.pci_bus) == ("other", "critical", f"0000:{bus:02x}:00")
    gated = classify_line(line)
    assert gated is not None and gated.severity == "critical"


@given(st.integers(0, 4095))
def test_kernel_disabling_an_unhandled_interrupt_is_a_warning(irq: int) -> None:
    line = f'Sep 03 13:48:46 node7 kernel: irq {irq}: nobody cared (try booting with the "irqpoll" option)'
    assert classify_text(line).severity == "warning"
    gated = classify_line(line)
    assert gated is not None and gated.severity == "warning"


# --- rules from the fourth batch (records with "batch": 4) ---------------------------------------------


@given(
    st.sampled_from(["", "RuntimeError: ", "[rank3]:   RuntimeError: "]),
    st.integers(0, 3000),
    st.one_of(st.none(), st.integers(0, 2**31)),
    st.sampled_from(["ALLREDUCE", "BROADCAST", "_ALLGATHER_BASE", "BARRIER", "REDUCE_SCATTER"]),
    st.sampled_from(["", ", TensorShape=[20, 10], TensorDtypes=Float"]),
)
def test_process_group_wrapper_collective_mismatch(
    prefix: str, rank: int, seq: int | None, op: str, tail: str
) -> None:
    """TORCH_DISTRIBUTED_DEBUG=DETAIL names the collective each rank ran; the first is the line's op."""
    number = "" if seq is None else f"SequenceNumber={seq}, "
    line = (
        f"{prefix}Detected mismatch between collectives on ranks. Rank {rank} is running collective: "
        f"CollectiveFingerPrint({number}OpType={op}{tail}), but Rank {rank + 1} is running collective: "
        f"CollectiveFingerPrint(OpType=REDUCE)."
    )
    event = classify_text(line)
    assert (event.kind, event.severity, event.op, event.seq) == ("torch_other_error", "critical", op, seq)
    assert event.rank == (3 if prefix.startswith("[rank3]") else None)
