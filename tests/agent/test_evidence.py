"""The agent's evidence capture: which processes it reads (only mapped ranks of a job on its GPUs), its
bounds in time and bytes, the kernel window around the fault, the nvidia-smi-shaped GPU snapshot, and the
py-spy boundary (a real py-spy on a live process where it is installed)."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sentinel.agent.commands import CommandTargets, dispatch
from sentinel.agent.evidence import SIMULATED, EvidenceCapture, GpuReads, rank_processes
from sentinel.agent.jobs import JobMapper
from sentinel.agent.kernel_window import KernelWindow
from sentinel.agent.nvml.recording import parse
from sentinel.agent.nvml.smi_snapshot import snapshot_xml
from sentinel.agent.stacks import PySpy, find_py_spy, parse_dump, read_bounded
from sentinel.components.ecc.record import EccCounters
from sentinel.components.rowremap.record import RowRemap
from sentinel.wire import (
    Command,
    CommandResult,
    EvidenceAnswer,
    EvidenceRequest,
    GpuInfo,
    GpuSample,
    ProcInfo,
    StackFrame,
    ThreadStack,
    decode_agent_frame,
    encode,
)
from tests.agent.fakes import FakeHost, FakeProcess
from tests.support import need

JOB = "job-7"
PROCS = [
    ProcInfo(gpu=0, pid=100, job_id=JOB, rank=0),
    ProcInfo(gpu=1, pid=101, job_id=JOB, rank=1),
    ProcInfo(gpu=2, pid=102, job_id="other", rank=0),  # another job's rank
    ProcInfo(gpu=3, pid=103),  # on a GPU, no job known
    ProcInfo(gpu=9, pid=109, job_id=JOB, rank=9),  # a GPU this host does not have
]


def info(index: int) -> GpuInfo:
    return GpuInfo(index=index, uuid=f"GPU-{index:04d}", pci_bus=f"0000:{index + 16:02x}:00.0", name="H100")


def reads(now: float = 1000.0) -> dict[int, GpuReads]:
    fast = GpuSample(
        gpu=0, t=now - 1, mem_used_bytes=10 << 20, mem_total_bytes=80 << 30, temp_c=71.0, pstate=0
    )
    return {i: GpuReads(info=info(i), fast=msgspec.structs.replace(fast, gpu=i), slow=None) for i in range(4)}


class Reader:
    """A stack reader at the py-spy boundary: records every pid it is asked to read."""

    def __init__(self, frames: int = 3, fail: set[int] | None = None, cost_s: float = 0.0) -> None:
        self.asked: list[int] = []
        self.frames = frames
        self.fail = fail or set()
        self.cost_s = cost_s
        self.clock: Clock | None = None

    def __call__(self, pid: int, timeout_s: float, max_bytes: int) -> tuple[list[ThreadStack], str]:
        self.asked.append(pid)
        if self.clock is not None:
            self.clock.now += self.cost_s
        if pid in self.fail:
            raise OSError("ptrace: operation not permitted")
        frames = [StackFrame(name=f"f{i}", file="train.py", line=i) for i in range(self.frames)]
        return [ThreadStack(thread_id=pid, frames=frames)], ""


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def capture(
    reader: Reader, procs: list[ProcInfo] | None = None, **kw: object
) -> tuple[EvidenceCapture, Counter[str]]:
    problems: Counter[str] = Counter()
    table = PROCS if procs is None else procs
    cap = EvidenceCapture(
        "node-a",
        procs=lambda: table,
        gpus=reads,
        kernel=kw.pop("kernel", KernelWindow()),  # type: ignore[arg-type]
        stacks=reader,
        problem=lambda reason: problems.update([reason]),
        clock=lambda: 1000.0,
        **kw,  # type: ignore[arg-type]
    )
    return cap, problems


def test_only_mapped_ranks_of_the_job_on_this_hosts_gpus_are_read() -> None:
    reader = Reader()
    cap, problems = capture(reader)
    answer = cap.answer(EvidenceRequest(job=JOB, ranks=[0, 1, 9, 4]))
    assert reader.asked == [100, 101]  # not another job's, not an unmapped pid, not a GPU it lacks
    assert [(s.rank, s.pid, s.gpu) for s in answer.stacks] == [(0, 100, 0), (1, 101, 1)]
    assert sorted(answer.refused) == ["4", "9"]
    assert problems == Counter({"not_a_local_rank": 2})


def test_without_a_job_the_ranks_on_the_named_gpus_are_read() -> None:
    reader = Reader()
    cap, _ = capture(reader)
    answer = cap.answer(EvidenceRequest(gpus=[2, 3]))
    assert reader.asked == [102]  # pid 103 on GPU 3 is no rank of any job
    assert [g.gpu for g in answer.gpus] == [2, 3]


def test_rank_processes_never_includes_a_process_without_job_and_rank() -> None:
    chosen = rank_processes(PROCS, {0, 1, 2, 3}, EvidenceRequest(gpus=[0, 1, 2, 3]))
    assert [p.pid for p in chosen] == [100, 102, 101]  # ordered by rank, then pid


def test_a_pid_that_stopped_being_the_rank_is_not_read() -> None:
    reader = Reader()
    tables = [PROCS, [p for p in PROCS if p.pid != 101]]
    problems: Counter[str] = Counter()
    calls = iter([tables[0], tables[1], tables[1]])
    cap = EvidenceCapture(
        "node-a",
        procs=lambda: next(calls),
        gpus=reads,
        kernel=KernelWindow(),
        stacks=reader,
        problem=lambda reason: problems.update([reason]),
        clock=lambda: 1000.0,
    )
    answer = cap.answer(EvidenceRequest(job=JOB))
    assert reader.asked == [100]
    assert answer.stacks[1].error == "no longer a rank of this job on this host"
    assert problems["gone"] == 1


def test_a_pid_whose_live_process_is_another_jobs_is_not_read() -> None:
    """The job mapper reads each process again before its read: pid 101 was rank 1 of the job at the last
    poll, but the process there now (a reused pid) belongs to another job."""
    host = FakeHost(
        procs={
            100: FakeProcess(100, {"SENTINEL_JOB_ID": JOB, "RANK": "0"}),
            101: FakeProcess(101, {"SENTINEL_JOB_ID": "someone-else", "RANK": "1"}),
        }
    )
    processes = host.inputs().processes
    assert processes is not None
    mapper = JobMapper(listpids=None, processes=processes)
    reader = Reader()
    cap, problems = capture(reader, remap=lambda p: next(iter(mapper.map({p.gpu: [p.pid]})), None))
    answer = cap.answer(EvidenceRequest(job=JOB))
    assert reader.asked == [100]
    assert answer.stacks[1].error == "no longer a rank of this job on this host"
    assert problems["gone"] == 1


def test_one_failing_read_is_its_entrys_error_not_the_answers() -> None:
    reader = Reader(fail={100})
    cap, problems = capture(reader)
    answer = cap.answer(EvidenceRequest(job=JOB))
    assert answer.stacks[0].error.startswith("OSError") and not answer.stacks[1].error
    assert answer.stacks[1].threads[0].frames[0].name == "f0"
    assert problems["read_failed"] == 1


def test_the_answers_deadline_stops_further_reads() -> None:
    clock = Clock()
    reader = Reader(cost_s=4.0)
    reader.clock = clock
    cap, problems = capture(reader, monotonic=clock)
    answer = cap.answer(EvidenceRequest(job=JOB, timeout_s=4.0))
    assert reader.asked == [100]  # the first read used the time up
    assert any("out of time" in c for c in answer.cut)
    assert problems["deadline"] == 1


def test_stacks_past_the_byte_budget_are_left_out_and_the_frame_stays_bounded() -> None:
    reader = Reader(frames=200)
    one = len(msgspec.msgpack.encode(reader(0, 1.0, 1 << 20)[0]))
    cap, _ = capture(reader)
    limit = int((1.5 * one + 3000) / 0.75)  # room for the GPU snapshots and one stack, not two
    answer = cap.answer(EvidenceRequest(job=JOB, max_bytes=limit))
    sizes = [len(msgspec.msgpack.encode(s)) for s in answer.stacks]
    assert answer.stacks[0].threads and not answer.stacks[0].error
    assert answer.stacks[1].error == "byte budget spent" and not answer.stacks[1].threads
    assert sum(sizes) + sum(len(g.xml) for g in answer.gpus) <= limit
    # and the whole answer travels in one command result
    frame = decode_agent_frame(encode(_result(answer)))
    assert frame == _result(answer)


def _result(answer: EvidenceAnswer) -> CommandResult:
    return CommandResult(id="i:evidence:node-a", answer=answer)


def test_kernel_window_is_the_lines_around_the_fault_within_the_byte_bound() -> None:
    window = KernelWindow()
    for t in range(900, 1001):
        window.note(float(t), f"line at {t}")
    cap, _ = capture(Reader(), kernel=window)
    answer = cap.answer(EvidenceRequest(job=JOB, fault_t=950.0, window_s=10.0))
    assert [k.t for k in answer.kernel] == [float(t) for t in range(940, 961)]
    assert answer.kernel_window == (940.0, 960.0)
    lines, cut = window.between(0.0, 2000.0, max_bytes=10 * 28)
    assert cut and [k.text for k in lines][-1] == "line at 1000" and len(lines) == 10


def test_kernel_window_forgets_the_oldest_past_its_bounds() -> None:
    window = KernelWindow(max_lines=5, max_chars=1000)
    for t in range(10):
        window.note(float(t), "x" * 100)
    assert len(window) == 5
    window.note(10.0, "y" * 901)  # with the 100 of the line before: over 1000
    assert len(window) == 1


def test_gpu_snapshot_reads_like_nvidia_smi_and_parses_with_its_reader() -> None:
    fast = GpuSample(
        gpu=1,
        t=5.0,
        mem_used_bytes=1024 << 20,
        mem_total_bytes=81559 << 20,
        temp_c=64.4,
        power_w=312.5,
        pstate=0,
        util_gpu_pct=97.0,
        throttle=["hw_slowdown"],
        pids=[4242],
    )
    slow = GpuSample(
        gpu=1, t=4.0, ecc=EccCounters(volatile_uncorrected=2), remap=RowRemap(uncorrectable=3, pending=True)
    )
    root = parse(snapshot_xml(info(1), fast, slow, driver="550.54.15").encode())
    gpu = root.find("gpu")
    assert gpu is not None and gpu.attrs["id"] == "0000:11:00.0".upper()
    expect = {
        "uuid": "GPU-0001",
        "product_name": "H100",
        "fb_memory_usage/total": "81559 MiB",
        "fb_memory_usage/used": "1024 MiB",
        "temperature/gpu_temp": "64 C",
        "gpu_power_readings/power_draw": "312.50 W",
        "performance_state": "P0",
        "utilization/gpu_util": "97 %",
        "processes/process_info/pid": "4242",
        "ecc_errors/volatile/total_uncorrectable": "2",
        "remapped_rows/remapped_row_unc": "3",
        "remapped_rows/remapped_row_pending": "Yes",
        "clocks_event_reasons/clocks_event_reason_hw_slowdown": "Active",
    }
    got = {path: (gpu.find(path).text if gpu.find(path) is not None else None) for path in expect}  # type: ignore[union-attr]
    assert got == expect
    assert root.find("driver_version") is not None and root.find("driver_version").text == "550.54.15"  # type: ignore[union-attr]


def test_a_gpu_not_read_yet_or_absent_says_so() -> None:
    cap, _ = capture(Reader())
    answer = cap.answer(EvidenceRequest(gpus=[3, 7]))
    assert [(g.gpu, g.error) for g in answer.gpus] == [(3, ""), (7, "no such GPU on this host")]


async def test_the_command_table_answers_evidence_off_the_loop_and_without_a_capture() -> None:
    cap, _ = capture(Reader())
    targets = CommandTargets(
        snapshot=lambda since: None,  # type: ignore[arg-type]
        fr_dumps=None,  # type: ignore[arg-type]
        health=None,  # type: ignore[arg-type]
        clock=lambda: 1.0,
        evidence=cap,
    )
    result = await dispatch(targets, Command(id="x", request=EvidenceRequest(job=JOB)))
    assert isinstance(result.answer, EvidenceAnswer) and len(result.answer.stacks) == 2
    bare = CommandTargets(
        snapshot=targets.snapshot, fr_dumps=targets.fr_dumps, health=targets.health, clock=targets.clock
    )
    result = await dispatch(bare, Command(id="y", request=EvidenceRequest(job=JOB)))
    assert isinstance(result.answer, EvidenceAnswer) and result.answer.error


def test_read_bounded_kills_a_reader_past_its_time_or_bytes() -> None:
    out, error = read_bounded(["sleep", "30"], 0.3, 1000)
    assert (out, error) == (b"", "no answer within 0.3 s")
    out, error = read_bounded(["yes"], 10.0, 100_000)
    assert out == b"" and error == "output over 100000 bytes"
    out, error = read_bounded([sys.executable, "-c", "import sys; sys.exit('boom')"], 10.0, 1000)
    assert error == "exit 1: boom"


def test_parse_dump_keeps_the_innermost_and_outermost_frames_of_a_deep_stack() -> None:
    frames = [{"name": f"f{i}", "filename": "/x/a.py", "line": i} for i in range(300)]
    data = msgspec.json.encode([{"thread_id": 7, "thread_name": "MainThread", "frames": frames}])
    (thread,) = parse_dump(data, max_frames=10)
    assert [f.name for f in thread.frames] == [
        "f0",
        "f1",
        "f2",
        "f3",
        "f4",
        "f295",
        "f296",
        "f297",
        "f298",
        "f299",
    ]
    assert thread.frames_cut == 290 and thread.name == "MainThread"


@given(st.binary(max_size=512))
def test_parse_dump_of_any_bytes_is_stacks_or_a_value_error(data: bytes) -> None:
    try:
        threads = parse_dump(data)
    except ValueError:
        return
    assert all(isinstance(t, ThreadStack) for t in threads)


def test_py_spy_reads_a_live_process_without_stopping_it(tmp_path: Path) -> None:
    need(find_py_spy() is not None, "py-spy not installed (pip install 'sentinel[stacks]')")
    script = tmp_path / "waits.py"
    script.write_text(
        "import sys, time\n\ndef waits_here():\n    print('ready', flush=True)\n    time.sleep(600)\n\nwaits_here()\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        threads, error = PySpy()(proc.pid, 20.0, 1 << 20)
        assert error == ""
        frames = threads[0].frames
        assert (frames[0].name, Path(frames[0].file).name, frames[0].line) == ("waits_here", "waits.py", 5)
        assert proc.poll() is None  # still running
    finally:
        proc.kill()
        proc.wait()


def test_a_simulated_host_reads_no_process_and_counts_nothing() -> None:
    cap, problems = capture(Reader())
    cap.stacks = None
    answer = cap.answer(EvidenceRequest(job=JOB))
    assert [s.error for s in answer.stacks] == [SIMULATED, SIMULATED]
    assert not problems and answer.gpus


def test_a_missing_py_spy_is_a_reason_not_an_exception() -> None:
    spy = PySpy(binary="/nonexistent/py-spy")
    assert spy(1, 1.0, 1000) == ([], "py-spy not installed (pip install 'sentinel[stacks]')")


@pytest.mark.parametrize("field", ["timeout_s", "max_bytes", "window_s"])
def test_the_requests_bounds_are_checked_by_the_decoder(field: str) -> None:
    huge = {"timeout_s": 1e6, "max_bytes": 1 << 40, "window_s": 1e9}[field]
    raw = msgspec.msgpack.encode({"type": "command", "id": "c", "request": {"name": "evidence", field: huge}})
    from sentinel.wire import decode_aggregator_frame

    with pytest.raises(msgspec.ValidationError):
        decode_aggregator_frame(raw)
