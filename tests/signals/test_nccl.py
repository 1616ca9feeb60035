"""NCCL and PyTorch log parsing: prefixes and wrappers, init lines, net/CUDA warnings, watchdog messages."""

from __future__ import annotations

import pytest

from sentinel.signals import classify_line, classify_text, torch_rank

INIT = (
    "node-3:1234:5678 [3] NCCL INFO comm 0x55d5c0a0 rank 11 nranks 16 cudaDev 3 nvmlDev 3 busId 3b000 "
    "commId 0x1a2b3c4d5e6f - Init COMPLETE"
)
WARN_IB = (
    "node-7:1234:1240 [2] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer 10.1.1.2<1234> "
    "with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.1.1.1 remoteGids::ffff:10.1.1.2 hca mlx5_3"
)


@pytest.mark.parametrize(
    "prefix",
    [
        "",
        "[1,3]<stdout>:",
        "Fri Aug 11 12:31:45 2023[1,3]<stderr>:",
        "node-3: ",
        "2024-05-01T12:00:00.000000001Z ",
        "[2024-05-01 12:00:00] ",
        "(RayTrainWorker pid=123, ip=10.0.0.5) ",
        "trainer/0 [3]:",
        "[3] ",
        "    ",
    ],
)
def test_init_line_behind_wrappers(prefix: str) -> None:
    event = classify_text(prefix + INIT)
    assert (event.kind, event.severity, event.rank, event.pci_bus) == ("nccl_init", "info", 11, "0000:3b:00")
    assert (event.nranks, event.cuda_dev, event.host) == (16, 3, "node-3")
    assert classify_line(prefix + INIT) == event


@pytest.mark.parametrize(
    ("busid", "pci"),
    [
        ("3b000", "0000:3b:00"),
        ("9b000", "0000:9b:00"),
        ("1b000", "0000:1b:00"),
        ("1001b000", "0100:1b:00"),
        ("0x4f000", "0000:4f:00"),
        ("e7010", "0000:e7:01"),
    ],
)
def test_busid_to_pci(busid: str, pci: str) -> None:
    event = classify_text(
        f"h:1:2 [0] NCCL INFO comm 0xabc rank 0 nranks 2 cudaDev 0 busId {busid} - Init START"
    )
    assert event.pci_bus == pci


def test_newer_init_wording_and_abort() -> None:
    newer = classify_text(
        "h:1:2 [5] NCCL INFO ncclCommInitRankConfig comm 0x7f rank 5 nranks 8 cudaDev 5 nvmlDev 5 busId a8000 "
        "commId 0x99 - Init START"
    )
    assert (newer.kind, newer.rank, newer.pci_bus) == ("nccl_init", 5, "0000:a8:00")
    abort = classify_text(
        "h:1:2 [3] NCCL INFO comm 0x1 rank 3 nranks 8 cudaDev 3 busId 4f000 - Abort COMPLETE"
    )
    assert (abort.kind, abort.severity, abort.rank) == ("nccl_info", "warning", 3)
    nvls = classify_text("h:1:2 [3] NCCL INFO NVLS comm 0x7f headRank 3 nHeads 4 buffSize 4194304")
    assert (nvls.kind, nvls.rank) == ("nccl_info", None)


@pytest.mark.parametrize(
    "line",
    [
        "NCCL version 2.19.3+cuda12.3",
        "h:1:1 [0] NCCL INFO NCCL version 2.27.5+cuda12.9",
        "   NCCL version 2.4.8+cuda10.1",
    ],
)
def test_version_lines(line: str) -> None:
    event = classify_text(line)
    assert (event.kind, event.severity) == ("nccl_init", "info")
    assert event.nccl_version is not None


def test_cudadev_is_not_a_rank() -> None:
    event = classify_text("h:1:2 [4] NCCL INFO Channel 00/0 : 4[4] -> 5[5] via P2P/IPC")
    assert (event.kind, event.rank, event.cuda_dev) == ("nccl_info", None, 4)


@pytest.mark.parametrize(
    ("line", "severity"),
    [
        (WARN_IB, "critical"),
        ("node-7: " + WARN_IB, "critical"),
        (WARN_IB.replace("status=12", "status=5"), "warning"),
        (
            "h:1:2 [0] ib_plugin.c:1105 NCCL WARN NET/IB : Got completion from peer 10.0.0.1<1> with error 12, opcode 0, len 0, vendor err 129",
            "critical",
        ),
        (
            "h:1:2 [0] misc/socket.cc:538 NCCL WARN socketStartConnect: Connect to 10.0.0.2<45678> failed : Software caused connection abort",
            "critical",
        ),
        ("h:1:2 [0] transport/net_ib.cc:93 NCCL WARN NET/IB : Got async event : GID table change", "warning"),
        (
            "h:1:2 [0] misc/ibvwrap.cc:190 NCCL WARN Call to ibv_reg_mr failed with error Cannot allocate memory",
            "critical",
        ),
        (
            "h:1:2 [0] include/socket.h:403 NCCL WARN Net : Connection closed by remote peer 10.0.0.9<33411>",
            "critical",
        ),
        ("h:1:2 [0] include/socket.h:360 WARN Call to connect failed : Connection refused", "critical"),
        (
            "Last error:\nNET/IB : Got completion from peer 10.0.0.3<4444> with error 12, opcode 0, len 0, vendor err 129",
            "critical",
        ),
        ("socketProgressOpt: Call to send to 10.0.0.9<1234> failed : Broken pipe", "critical"),
        (
            "[rank2]: NET/OFI Request 0x7f completed with error. RC: 21. Error: 0 (Success). Completed length: 0",
            "critical",
        ),
    ],
)
def test_net_warnings(line: str, severity: str) -> None:
    event = classify_text(line)
    assert (event.kind, event.severity) == ("nccl_warn_net", severity)


@pytest.mark.parametrize(
    "line",
    [
        "h:1:2 [0] enqueue.cc:1123 NCCL WARN Cuda failure 'unspecified launch failure'",
        "h:1:2 [0] init.cc:1234 NCCL WARN Cuda failure 999 'unknown error'",
        "2024-05-01T12:00:00Z h:1:2 [0] include/alloc.h:103 NCCL WARN Failed to CUDA calloc 1048576 bytes",
        "h:1:2 [0] misc/shmutils.cc:103 NCCL WARN Cuda failure 'invalid argument'",
    ],
)
def test_cuda_warnings(line: str) -> None:
    event = classify_text(line)
    assert (event.kind, event.severity) == ("nccl_warn_cuda", "critical")


def test_other_warning_with_requesting_rank() -> None:
    event = classify_text(
        "h:1:2 [0] proxy.cc:1523 NCCL WARN [Proxy Service 2] Failed to execute operation Connect from rank 2, retcode 3"
    )
    assert (event.kind, event.rank, event.severity) == ("nccl_warn_other", 2, "critical")


@pytest.mark.parametrize(
    "line",
    [
        "h:1:2 [0] NCCL INFO transport.cc:183 -> 6",
        "h:1:2 [1] NCCL INFO init.cc:1478 -> 6 [Async thread]",
        "h:1:2 [1] INFO bootstrap.cc:51 -> 3",
    ],
)
def test_error_trace_info_lines_are_warnings(line: str) -> None:
    event = classify_line(line)
    assert event is not None
    assert (event.kind, event.severity) == ("nccl_info", "warning")


@pytest.mark.parametrize(
    "line",
    [
        "[1687180000.123456] [node1:1234:0]          ucp_worker.c:1783 UCX  WARN  failed to create ep",
        "[node1:1234:0:5678] Caught signal 11 (Segmentation fault: address not mapped to object at address 0x8)",
        "#  Rank  3 Group  0 Pid  12345 on     node1 device  3 [0x3b] NVIDIA H100 80GB HBM3",
        "frame #12: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, std::ratio<1l, 1000l> > >) + 0x1f4 (0x7f in libtorch_cuda.so)",
    ],
)
def test_look_alikes_are_not_nccl(line: str) -> None:
    event = classify_text(line)
    assert not event.kind.startswith("nccl")
    assert event.kind != "torch_watchdog_timeout"


WATCHDOG = (
    "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12345, OpType=_REDUCE_SCATTER_BASE, "
    "NumelIn=1024, NumelOut=128, Timeout(ms)=600000) ran for 600041 milliseconds before timing out."
)


@pytest.mark.parametrize(
    ("prefix", "rank"),
    [
        ("[rank3]:[E1024 10:00:00.123456789 ProcessGroupNCCL.cpp:616] [Rank 3] ", 3),
        ("[E ProcessGroupNCCL.cpp:475] [Rank 9] ", 9),
        ("[rank12]:[E1024 10:00:00.1 ProcessGroupNCCL.cpp:616] [PG ID 2 PG GUID 5 Rank 0] ", 12),
        ("[E1024 10:00:00.1 ProcessGroupNCCL.cpp:616] [PG ID 0 PG GUID 0(default_pg) Rank 7] ", 7),
        ("[E1024 10:00:00.1 ProcessGroupNCCL.cpp:616] [PG ID 2 PG GUID 5 Rank 1] ", None),
        ("18:11:06.680 [rank4]:[E205 18:11:06.375 ProcessGroupNCCL.cpp:1870] [PG 0 (default_pg) Rank 4] ", 4),
        (
            "  what():  [PG ID 0 PG GUID 0(default_pg) Rank 2] Process group watchdog thread terminated with exception: [Rank 2] ",
            2,
        ),
        (
            "RuntimeError: NCCL communicator was aborted on rank 5.  Original reason for failure was: [Rank 5] ",
            5,
        ),
    ],
)
def test_watchdog_timeout_versions(prefix: str, rank: int | None) -> None:
    event = classify_text(prefix + WATCHDOG)
    assert (event.kind, event.severity, event.rank) == ("torch_watchdog_timeout", "critical", rank)
    assert (event.seq, event.op, event.timeout_ms) == (12345, "_REDUCE_SCATTER_BASE", 600000)
    assert (event.numel_in, event.numel_out, event.ran_for_ms) == (1024, 128, 600041)


def test_watchdog_hard_wrapped_block() -> None:
    text = (
        "[E329 19:15:11.77 ProcessGroupNCCL.cpp:565] [Rank 0] Watchdog\ncaught collective operation timeout: "
        "WorkNCCL(SeqNum=2,\nOpType=ALLREDUCE, NumelIn=10, NumelOut=10, Timeout(ms)=10000) ran for\n10028 "
        "milliseconds before timing out."
    )
    event = classify_text(text)
    assert (event.kind, event.rank, event.seq, event.op, event.timeout_ms) == (
        "torch_watchdog_timeout",
        0,
        2,
        "ALLREDUCE",
        10000,
    )


def test_overflowing_and_negative_numbers() -> None:
    event = classify_text(
        "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=99999999999999999999999, "
        "OpType=COALESCED, NumelIn=18446744073709551615, NumelOut=18446744073709551615, Timeout(ms)=1800000) "
        "ran for 1800014 milliseconds before timing out."
    )
    assert (event.kind, event.seq, event.numel_in, event.timeout_ms) == (
        "torch_watchdog_timeout",
        None,
        -1,
        1800000,
    )
    negative = classify_text(
        "[rank0]:[E1 1:1:1.1 ProcessGroupNCCL.cpp:1] [PG ID 0 PG GUID 0(default_pg) Rank 0] Exception (either an "
        "error or timeout) detected by watchdog at work: -1, last enqueued NCCL work: -1, last completed NCCL work: -1."
    )
    assert (negative.kind, negative.seq, negative.rank) == ("torch_other_error", -1, 0)


def test_tqdm_glued_line() -> None:
    line = (
        "Epoch 1:  45%|####5     | 450/1000 [01:02<01:15]\r[rank1]:[E1 1:1:1.1 ProcessGroupNCCL.cpp:1] [Rank 1] "
        + WATCHDOG
    )
    event = classify_line(line)
    assert event is not None
    assert (event.kind, event.rank, event.seq) == ("torch_watchdog_timeout", 1, 12345)


@pytest.mark.parametrize(
    ("line", "severity", "seq"),
    [
        (
            "[rank2]:[E1 1:1:1.1 ProcessGroupNCCL.cpp:1423] [PG ID 0 PG GUID 0(default_pg) Rank 2] Heartbeat monitor timed out! Process will be terminated after dumping debug info.",
            "critical",
            None,
        ),
        (
            "[rank2]:[E1 1:1:1.1 ProcessGroupNCCL.cpp:1] [PG ID 0 PG GUID 0(default_pg) Rank 2] Timeout at NCCL work: 77, last enqueued NCCL work: 78, last completed NCCL work: 76.",
            "critical",
            77,
        ),
        (
            "[rank2]:[E1 1:1:1.1 ProcessGroupNCCL.cpp:1] [Rank 2] failure detected by watchdog at work sequence id: 5 PG status: last enqueued work: 6, last completed work: 4",
            "critical",
            5,
        ),
        (
            "[rank2]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, unhandled system error",
            "critical",
            None,
        ),
        (
            "[rank2]:[W1 1:1:1.1 ProcessGroupNCCL.cpp:1] [PG ID 1 PG GUID 1 Rank 2] timed out after waiting for 60000ms flight recorder dumps to finish.",
            "warning",
            None,
        ),
    ],
)
def test_other_torch_errors(line: str, severity: str, seq: int | None) -> None:
    event = classify_text(line)
    assert (event.kind, event.severity, event.rank, event.seq, event.timeout_ms) == (
        "torch_other_error",
        severity,
        2,
        seq,
        None,
    )


@pytest.mark.parametrize(
    ("line", "severity", "local_rank"),
    [
        (
            "[2024-05-08 08:47:31,877] torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: -11) local_rank: 0 (pid: 5939) of binary: /usr/bin/python",
            "critical",
            0,
        ),
        (
            "E0726 10:59:50.786825 140538 torch/distributed/elastic/multiprocessing/api.py:833] failed (exitcode: 1) local_rank: 3 (pid: 1234) of binary: /usr/bin/python",
            "warning",
            3,
        ),
    ],
)
def test_torchrun_failures(line: str, severity: str, local_rank: int) -> None:
    event = classify_text(line)
    assert (event.kind, event.severity, event.rank, event.local_rank) == (
        "torch_other_error",
        severity,
        None,
        local_rank,
    )


def test_torchrun_root_cause_block_gives_global_rank() -> None:
    text = (
        "Root Cause (first observed failure):\n[0]:\n  time      : 2024-01-01_00:00:00\n  host      : node-1\n"
        "  rank      : 21 (local_rank: 5)\n  exitcode  : -9 (pid: 1)\n  error_file: <N/A>"
    )
    event = classify_text(text)
    assert (event.kind, event.severity, event.rank, event.exit_code) == (
        "torch_other_error",
        "critical",
        21,
        -9,
    )


@pytest.mark.parametrize(
    "line",
    [
        "[rank0]:[W730 15:32:17.84 ProcessGroupNCCL.cpp:1479] Warning: WARNING: destroy_process_group() was not called before program exit, which can leak resources.",
        "[2024-05-08 08:47:31,261] torch.distributed.elastic.multiprocessing.api: [WARNING] Sending process 5938 closing signal SIGTERM",
    ],
)
def test_benign_torch_messages_are_noise(line: str) -> None:
    assert classify_line(line) is None
    assert classify_text(line).severity == "info"


def test_torch_rank_rules() -> None:
    assert torch_rank("[rank5]:[E1 ...] [PG ID 3 PG GUID 3 Rank 1] x") == 5
    assert torch_rank("[rank3[]:[E508 07:35:59] x") == 3
    assert torch_rank("[PG 0 Rank 4] x") == 4
    assert torch_rank("[PG 2 Rank 4] x") is None
    assert torch_rank("[Rank 6] x") == 6
    assert torch_rank("no rank here, local_rank: 3") is None


def test_ras_mismatch_block() -> None:
    text = (
        "#0-0 (fa93daea854b060b) MISMATCH\n  Communicator ranks have different ReduceScatter operation counts\n"
        "  30 ranks have launched up to operation 640\n  Rank 12 -- GPU 4 managed by process 1 on node 10.0.0.1"
    )
    event = classify_text(text)
    assert (event.kind, event.op, event.rank, event.severity) == (
        "nccl_warn_other",
        "ReduceScatter",
        None,
        "critical",
    )


def test_flattened_messages_pick_the_root_cause() -> None:
    text = (
        "[E ProcessGroupNCCL.cpp:455] Some NCCL operations have failed or timed out. ncclRemoteError: A call failed "
        "possibly due to a network error. Last error: NET/IB : Got completion from peer 11.2.3.4<39138> with error 12, "
        "opcode 0, len 0, vendor err 129"
    )
    assert classify_text(text).kind == "nccl_warn_net"


def test_async_collective_exception_is_not_a_timeout() -> None:
    event = classify_text(
        "[rank0]:[E1 1:1:1.1 ProcessGroupNCCL.cpp:543] [Rank 0] Collective WorkNCCL(SeqNum=1, OpType=ALLREDUCE, "
        "NumelIn=1, NumelOut=1, Timeout(ms)=600000) raised the following async exception: NCCL error: unhandled system error"
    )
    assert (event.kind, event.severity, event.rank, event.seq, event.op) == (
        "torch_other_error",
        "critical",
        0,
        1,
        "ALLREDUCE",
    )


def test_torch_1x_caught_collective_timeout_without_watchdog_word() -> None:
    event = classify_text(
        "[Rank 0] Caught collective operation timeout: WorkNCCL(OpType=BROADCAST, Timeout(ms)=1800000) ran for "
        "1801354 milliseconds before timing out."
    )
    assert (event.kind, event.rank, event.op, event.timeout_ms, event.seq) == (
        "torch_watchdog_timeout",
        0,
        "BROADCAST",
        1800000,
        None,
    )


@pytest.mark.parametrize(
    ("line", "severity", "reason"),
    [
        (
            "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients joined.",
            "critical",
            "c10d_store_error",
        ),
        (
            "[E socket.cpp:957] [c10d] The client socket has timed out after 1800s while trying to connect to (10.0.0.1, 29500).",
            "critical",
            "c10d_error",
        ),
        (
            "[W socket.cpp:464] [c10d] The server socket has failed to bind to [::]:29500 (errno: 98 - Address already in use).",
            "warning",
            "c10d_error",
        ),
        (
            "[rank1]:[E1 1:1:1.1 ProcessGroupNCCL.cpp:1] [PG ID 0 PG GUID 0(default_pg) Rank 1] Observed flight recorder dump signal from another rank via TCPStore.",
            "warning",
            "dump_signal",
        ),
        (
            "[rank1]:[F1 1:1:1.1 ProcessGroupNCCL.cpp:1224] [PG ID 0 PG GUID 0(default_pg) Rank 1] Terminating the process after attempting to dump debug info, due to collective timeout or exception.",
            "critical",
            "process_terminated_after_dump",
        ),
    ],
)
def test_more_torch_messages(line: str, severity: str, reason: str) -> None:
    event = classify_text(line)
    assert (event.kind, event.severity, event.reason) == ("torch_other_error", severity, reason)


def test_event_less_torch_line_keeps_its_rank() -> None:
    event = classify_text(
        "[rank3]:[W1 1:1:1.1 ProcessGroupNCCL.cpp:4115] [PG ID 0 PG GUID 0 Rank 3]  using GPU 3 to perform barrier"
    )
    assert (event.kind, event.severity, event.rank) == ("other", "info", 3)
    options = classify_text(
        "[I ProcessGroupNCCL.cpp:686] [Rank 0] ProcessGroupNCCL initialization options: NCCL_ASYNC_ERROR_HANDLING: 1, "
        "TIMEOUT(ms): 1800000, USE_HIGH_PRIORITY_STREAM: 0"
    )
    assert (options.kind, options.rank, options.timeout_ms) == ("other", 0, 1800000)


def test_quoted_cuda_failure_and_comm_lines() -> None:
    quoted = classify_text(
        "ncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\nCuda failure 'out of memory'"
    )
    assert (quoted.kind, quoted.severity) == ("nccl_warn_cuda", "critical")
    comm = classify_text(
        "h:1:2 [0] NCCL INFO comm 0x55 rank 3 nRanks 8 nNodes 1 localRanks 8 localRank 3 MNNVL 0"
    )
    assert (comm.kind, comm.severity, comm.rank) == ("nccl_info", "info", 3)
    ipc = classify_text("h:1:2 [0] transport/p2p.cc:200 NCCL WARN Error: cudaIpcOpenMemHandle failed")
    assert ipc.kind == "nccl_warn_cuda"


def test_configuration_warnings_are_not_pages() -> None:
    event = classify_text("h:1:2 [0] init.cc:100 NCCL WARN NCCL_IB_GID_INDEX is deprecated, ignoring it")
    assert (event.kind, event.severity) == ("nccl_warn_other", "warning")


def test_process_group_options_global_rank() -> None:
    event = classify_text(
        "[I1 1:1:1.1 ProcessGroupNCCL.cpp:1200] [PG ID 1 PG GUID 1 Rank 2] ProcessGroupNCCL initialization options: "
        "size: 4, global rank: 6, TIMEOUT(ms): 600000, USE_HIGH_PRIORITY_STREAM: 0"
    )
    assert (event.kind, event.severity, event.rank, event.timeout_ms) == ("other", "info", 6, 600000)
