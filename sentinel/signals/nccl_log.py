"""Parser for NCCL debug output and PyTorch ProcessGroupNCCL / torchrun messages.

NCCL lines look like ``host:pid:tid [cudaDev] NCCL INFO|WARN ...`` (NCCL <= 2.4 printed ``INFO``/``WARN``
without the ``NCCL`` word), usually behind wrappers: MPI ``[1,0]<stdout>:`` tags, pdsh ``host: ``
prefixes, shipper timestamps, Ray ``(Actor pid=N)`` tags. PyTorch lines carry a ``[rankN]:`` prefix
(global rank), a glog header (``[E1206 18:44:16.99 ProcessGroupNCCL.cpp:1709]``) and a process-group tag
(``[PG ID 0 PG GUID 0(default_pg) Rank 5]``) whose rank is global only for the default group.

Every rule searches for the message itself rather than anchoring on a prefix, so unknown wrappers in front
do not matter, and a line that flattens several messages ("... Last error: NET/IB : Got completion ...")
yields one event per message; the caller keeps the most severe. Look-alikes (UCX ``[host:pid:idx:tid]``,
nccl-tests banners, C++ stack frames that mention ProcessGroupNCCL) are not NCCL events.
"""

from __future__ import annotations

import re
from typing import Final

from sentinel.components.vocab import Severity
from sentinel.signals.record import Classified, Kind, make_event
from sentinel.signals.rules import producer
from sentinel.text import bounded, clip, parse_int, pci_from_nccl_busid

# --- NCCL ---------------------------------------------------------------------------------------------

_PREFIX_TAIL_RE: Final = re.compile(r":(?P<pid>\d{1,10}):(?P<tid>\d{1,10}) \[(?P<dev>\d{1,3})\] ")
_HOST_STOP: Final = " \t[]()<>:"
_DEV_RE: Final = re.compile(r" \[(\d{1,3})\] ")
_HOST_RE: Final = re.compile(r"[A-Za-z0-9][\w.-]{0,254}")
_LEVEL_RE: Final = re.compile(r"NCCL (?P<lvl>INFO|WARN|ERROR|ABORT)\b[ \t]?(?P<payload>.*)")
_DEV_TOKEN_RE: Final = re.compile(r"\[\d{1,3}\]")
_SOURCE_TOKEN_RE: Final = re.compile(r"[\w./-]{1,200}\.(?:cc|cu|c|h|cpp|hpp):\d{1,6}")
_LINE_TOKEN_RE: Final = re.compile(r"[\w./-]{1,200}:\d{1,6}")
_INIT_RE: Final = re.compile(
    r"comm (?P<comm>0x[0-9A-Fa-f]{1,16}) rank (?P<rank>\d{1,9}) nranks (?P<nranks>\d{1,9})\b"
)
_CUDADEV_RE: Final = re.compile(r"cudaDev (\d{1,4})\b")
_BUSID_RE: Final = re.compile(r"busId (?:0x)?([0-9A-Fa-f]{1,13})\b")
_COMM_RANK_RE: Final = re.compile(r"comm (?P<comm>0x[0-9A-Fa-f]{1,16}) rank (?P<rank>\d{1,9})\b")
_COMM_STATE_RE: Final = re.compile(
    r"- (Init START|Init COMPLETE|Abort COMPLETE|Destroy COMPLETE|Abort START)"
)
_VERSION_RE: Final = re.compile(r"NCCL version (?P<ver>\d{1,3}\.\d{1,3}\.\d{1,4}\S{0,40})")
_TRACE_RE: Final = re.compile(r"^\s*\S{1,200}?:\d{1,6} -> (?P<ret>-?\d{1,4})\b")
_FROM_RANK_RE: Final = re.compile(r"\bfrom rank (\d{1,9})\b")
_PEER_RE: Final = re.compile(
    r"\b(?:peer|from|to) (\d{1,3}\.[\d.]{1,20}<\d{1,5}>|[0-9a-fA-F:.]{3,45}<\d{1,5}>)"
)
_CUDA_WARN_RE: Final = re.compile(
    r"Cuda failure|CUDA failure|Failed to CUDA|CUDA error|Cuda API error|cudaError\w{0,40}|"
    r"cu[A-Z]\w{0,40}(?:\(\))? failed|cuda[A-Z]\w{0,40}(?:\(\))? failed"
)
# A CUDA failure quoted without the NCCL prefix ("Last error:\nCuda failure 'out of memory'").
_BARE_CUDA_RE: Final = re.compile(r"Cuda failure(?: \d{1,4})? '|Failed to CUDA calloc|Cuda API error")
_NET_WARN_RE: Final = re.compile(
    r"NET/|\bNet :|[Ss]ocket|Call to (?:connect|recv|send|accept|bind|listen|ibv_)|\bibv_|\bIB\b|RoCE|"
    r"Got completion|async event|async fatal|ncclIb|\bOFI\b|libfabric|ibverbs|wrong type|remote peer|"
    r"Connection (?:closed|reset|refused|timed out)"
)
_NET_FILE_RE: Final = re.compile(
    r"(?:^|[/\[])(?:socket|net\w{0,20}|ib\w{0,20}|\w{0,20}ibv\w{0,20}|\w{0,10}ofi\w{0,20})\.(?:cc|c|h)\b"
)
_NET_BENIGN_RE: Final = re.compile(
    r"status=5\b|with error 5\b|async event ?: ?(?:port error|port active|GID|LID|client reregister|SM change)"
)
# Network payloads quoted without the NCCL prefix ("Last error: NET/IB : Got completion ..."). NCCL's
# transports name themselves NET/<plugin>[/<sub>] (NET/IB, NET/IBP, NET/IB/GIN, NET/OFI); its socket layer
# and bootstrap prefix their warnings with the function or subsystem ("ncclSocketInit: ...",
# "socketProgress: ...", "Bootstrap : no socket interface found"). NCCL's own INFO lines always carry
# its prefix, so such a text without one is the quoted last error: a warning.
_BARE_NET_RE: Final = re.compile(
    r"NET/\w{1,20}(?:/\w{1,20})? ?: ?(?:\S{1,40} )?(?:Got completion from peer|Got async event|async fatal event)|"
    r"NET/OFI Request \S{1,40} completed with error|NET/\w{1,20} ?: ?\w{0,40} ?failed|"
    r"socket\w{0,30}: Call to \w{1,12} (?:from|to) \S{1,80} failed|\bNet : Call to \w{1,12}|"
    r"Call to connect failed|Socket creation failed|\bNet : Connection (?:closed|reset|refused|timed out)|"
    r"\b(?:nccl)?[Ss]ocket[A-Z]\w{0,30}: \S|\bBootstrap ?: ?no (?:\w{1,30} ){0,2}interface found"
)
# Configuration complaints (deprecated variables, ignored settings) are worth a look, not a page.
_CONFIG_WARN_RE: Final = re.compile(
    r"deprecated|[Ii]gnoring|will be ignored|falling back|[Ii]nvalid value|not supported|out of range"
)
#: A complaint about an ``NCCL_*`` setting, whichever transport prints it: the value is wrong, nothing
#: has failed yet (``NET/IB: NCCL_IB_SUBNET_PREFIX_LEN=40 is out of range [1,32]``).
_ENV_CONFIG_RE: Final = re.compile(
    r"\bNCCL_[A-Z0-9_]{2,60}\b[^\n]{0,60}?\b(?:is out of range|out of range|is invalid|invalid value|"
    r"ignored|ignoring|deprecated|not supported|unknown value)"
)
#: NCCL's result string (ncclGetErrorString) after "NCCL error: ", as vLLM's pynccl raises it
#: (``RuntimeError(f"NCCL error: {error_str}")``) and PyTorch's watchdog prints it (with ", NCCL version").
_RELAYED_RESULT_RE: Final = re.compile(
    r"\bNCCL error: (?P<what>unhandled cuda error|unhandled system error|internal error|invalid argument|"
    r"invalid usage|remote process exited or there was a network error)"
)


def relayed_nccl_result(text: str) -> re.Match[str] | None:
    """NCCL's result string relayed by a program that is neither NCCL nor PyTorch (vLLM, a Ray worker).

    The README's producer rule: PyTorch's distributed stack gets ``torch_*`` (its ``NCCL error: ...``
    carries ``, NCCL version`` or a PyTorch marker); another program reporting NCCL's failure is, like a
    test program, reporting an NCCL failure: ``nccl_*``, kind by the result (CUDA, network, other).
    """
    if "NCCL error: " not in text:
        return None
    match = _RELAYED_RESULT_RE.search(text)
    if (
        match is None
        or ", NCCL version" in text[match.end() : match.end() + 300]
        or producer(text) == "torch"
    ):
        return None
    return match


_RAS_MISMATCH_RE: Final = re.compile(
    r"MISMATCH\b[\s\S]{0,400}?Communicator ranks have different (?P<op>\w{1,40}) operation counts"
)

# --- PyTorch ------------------------------------------------------------------------------------------

_GLOBAL_RANK_RE: Final = re.compile(r"\[rank(\d{1,7})[\]\[]")
_PG_RANK_RE: Final = re.compile(
    r"\[PG (?:ID )?(?P<pg>\d{1,6})(?: PG GUID (?P<guid>\d{1,6}))?[ \t]*(?:\((?P<name>[^()\]]{0,80})\))?[ \t]*Rank (?P<rank>\d{1,7})\]"
)
_OLD_RANK_RE: Final = re.compile(r"\[Rank (\d{1,7})\]")
_ABORTED_RANK_RE: Final = re.compile(r"aborted on rank (\d{1,7})")
_BLOCK_RANK_RE: Final = re.compile(r"(?m)^[ \t]*rank[ \t]*:[ \t]*(\d{1,7})")
_BLOCK_EXIT_RE: Final = re.compile(r"(?m)^[ \t]*exitcode[ \t]*:[ \t]*(-?\d{1,5})")
_WATCHDOG_TIMEOUT_RE: Final = re.compile(
    r"collective\s+operation\s+timeout|milliseconds\s+before\s+timing\s+out|timed\s+out\s+in\s+blocking\s+wait"
)
_WORK_RE: Final = re.compile(r"WorkNCCL\((?P<body>(?:[^()]|\(ms\)){0,800})\)")
_SEQNUM_RE: Final = re.compile(r"SeqNum=(-?\d{1,22})")
_OPTYPE_RE: Final = re.compile(r"OpType=(\w{1,40})")
_NUMEL_IN_RE: Final = re.compile(r"NumelIn=(-?\d{1,22})")
_NUMEL_OUT_RE: Final = re.compile(r"NumelOut=(-?\d{1,22})")
_TIMEOUT_MS_RE: Final = re.compile(r"Timeout\(ms\)=(\d{1,22})")
_RAN_FOR_RE: Final = re.compile(r"ran for (\d{1,22}) milliseconds")
_EXIT_RE: Final = re.compile(r"failed \(exitcode: (?P<code>-?\d{1,5})\)(?: local_rank: (?P<local>\d{1,7}))?")

# (needles, pattern, severity, reason): the regex runs only when one needle is in the text (C-speed
# substring test), so a line pays for the rules that can match it. A group named "seq" is the collective
# sequence number / work id, one named "op" the collective as printed.
_TORCH_RULES: Final[tuple[tuple[tuple[str, ...], re.Pattern[str], Severity, str], ...]] = (
    (
        ("by watchdog at work",),
        re.compile(r"detected by watchdog at work(?: sequence id)?:\s*(?P<seq>-?\d{1,22})"),
        "critical",
        "watchdog_detected_failure",
    ),
    (
        ("Timeout at NCCL work",),
        re.compile(r"Timeout at NCCL work:\s*(?P<seq>-?\d{1,22})"),
        "critical",
        "watchdog_timeout_at_work",
    ),
    (
        ("Exception hit in NCCL work",),
        re.compile(r"Exception hit in NCCL work:\s*(?P<seq>-?\d{1,22})"),
        "critical",
        "nccl_work_exception",
    ),
    (
        ("watchdog thread terminated",),
        re.compile(r"watchdog thread terminated with exception"),
        "critical",
        "watchdog_terminated",
    ),
    (
        ("Some NCCL operations",),
        re.compile(r"Some NCCL operations have failed or timed out"),
        "critical",
        "nccl_operations_failed",
    ),
    (
        ("entire process down",),
        re.compile(r"taking the entire process down"),
        "critical",
        "process_taken_down",
    ),
    (
        ("communicator was aborted",),
        re.compile(r"NCCL communicator was aborted"),
        "critical",
        "communicator_aborted",
    ),
    (
        # PyTorch's spellings: "NCCL error in: file:line, ...", c10d 1.x "NCCL Error 2: ...", and the
        # watchdog's "NCCL error: <result>[, NCCL version 2.20.5]". A bare "NCCL error: <result>" in a line
        # that is not PyTorch's is another program relaying NCCL's result string (relayed_nccl_result).
        ("DistBackendError", "NCCL error", "NCCL Error"),
        re.compile(r"DistBackendError|NCCL error in:|NCCL [Ee]rror(?: \d{1,4})?:"),
        "critical",
        "nccl_error",
    ),
    (
        ("Error",),
        re.compile(r"\bnccl(?:Remote|System|Internal|UnhandledCuda|InvalidUsage|InvalidArgument)Error\b"),
        "critical",
        "nccl_error",
    ),
    (
        ("watchdog got stuck", "eartbeat"),
        re.compile(r"watchdog got stuck|[Hh]eartbeat monitor|no heartbeat|[Hh]eartbeat timeout"),
        "critical",
        "watchdog_heartbeat",
    ),
    (
        ("CUDA error",),
        re.compile(r"RuntimeError: CUDA error|\bCUDA error: an illegal"),
        "critical",
        "cuda_error",
    ),
    (
        ("DistStoreError", "DistNetworkError", "Rendezvous"),
        re.compile(r"\bDist(?:Store|Network)Error\b|\bRendezvous\w{0,20}Error\b"),
        "critical",
        "c10d_store_error",
    ),
    (
        # ProcessGroupWrapper (TORCH_DISTRIBUTED_DEBUG=DETAIL): ranks called different collectives.
        ("CollectiveFingerPrint",),
        re.compile(
            r"mismatch between collectives on ranks\.[^\n]{0,120}?CollectiveFingerPrint\("
            r"(?:SequenceNumber=(?P<seq>\d{1,22}),?[ \t]?)?OpType=(?P<op>\w{1,40})"
        ),
        "critical",
        "collective_mismatch",
    ),
    (
        # The monitor thread ending the process after a timeout, an exception or a watchdog hang; with
        # monitoring disabled it "would have" and the hang goes on, which is no better.
        ("Terminating the process after", "would have terminated the process"),
        re.compile(
            r"(?:Terminating|would have terminated) the process\s{0,4}after attempting to dump debug info"
        ),
        "critical",
        "process_terminated_after_dump",
    ),
    (
        # The monitor thread of the rank whose own collective timed out (or failed): "from this local
        # rank" (torch 2.2-2.9 wordings). That is this rank's collective timeout, not a follow-up.
        ("this local",),
        re.compile(
            r"Received a (?:dump|timeout) signal (?:due to a collective timeout )?from\s{1,8}this\s{0,8}local\s{0,8}rank"
        ),
        "critical",
        "collective_timeout_dump",
    ),
    (
        ("dump signal",),
        re.compile(r"(?:Received a(?: global)?|Observed flight recorder) dump signal"),
        "warning",
        "dump_signal",
    ),
    (
        # The dump signal's bookkeeping in the store (raising it, polling it, reading which rank raised
        # it): the timeout it carries is reported by the watchdog's own line.
        ("TCPStore", "tcpstore", "global store", "signal dumping"),
        re.compile(
            r"(?:timeout rank ID|\"should dump\" flag|exception dump flag|signal exception_dump|"
            r"detecting the dump signal)[^\n]{0,60}?(?:TCPStore|tcpstore|global store)|"
            r"PG on this rank to signal dumping"
        ),
        "warning",
        "dump_signal_store",
    ),
    (
        # glog's FATAL level in a ProcessGroup header (``[F1105 14:10:11.20 ProcessGroupNCCL.cpp:1614]``):
        # LOG(FATAL) aborts the process after printing, whatever the message says.
        ("[F",),
        re.compile(r"\[F(?:\d{3,4} \d\d:\d\d:\d\d[.\d]{0,12})? ?ProcessGroup\w{0,20}\.cpp:\d{1,6}\]"),
        "critical",
        "process_group_fatal_log",
    ),
    (
        ("Stack trace of the failed",),
        re.compile(r"Stack trace of the failed collective"),
        "warning",
        "failed_collective_trace",
    ),
    (
        ("flight recorder", "light recorder dump"),
        re.compile(r"flight recorder dumps? to finish|[Ff]light recorder dump (?:did not finish|failed)"),
        "warning",
        "flight_recorder_dump_wait",
    ),
    (("dump debug info",), re.compile(r"preparing to dump debug info"), "warning", "flight_recorder_dump"),
    (
        # torch 2.3's monitor thread announcing the dump a timeout (reported on the line before) triggers.
        ("debug info",),
        re.compile(r"(?:will start|try our best)\s{1,8}to\s{1,8}dump\s{1,8}the\s{1,8}debug\s{1,8}info"),
        "warning",
        "flight_recorder_dump",
    ),
)
_DUMP_SIGNAL_RE: Final = re.compile(
    r"Received a dump signal due to a collective timeout from\s+rank (\d{1,7})"
)
_BENIGN_TORCH_RE: Final = re.compile(
    r"destroy_process_group\(\) was not called|process group has NOT been destroyed|closing signal SIG[A-Z]{2,6}|"
    r"Exception raised from \w{1,80} at|^\s*frame #\d{1,4}:"
)
_C10D_BAD_RE: Final = re.compile(r"\[c10d\].{0,400}?(?:failed|timed out|[Ee]rror|refused|reset by peer)")
_GLOG_ERROR_RE: Final = re.compile(r"\[E\d{0,4}[ \]]|\[E ")
#: glog's warning level in PyTorch's header (``[W503 01:52:07.59 socket.cpp:204]``, ``[W socket.cpp:663]``).
_GLOG_WARNING_RE: Final = re.compile(r"\[W\d{0,4}[ \]]")
#: ProcessGroupWrapper's per-collective debug line (TORCH_DISTRIBUTED_DEBUG=DETAIL): no failure, but it
#: names the collective and its sequence number.
_FINGERPRINT_RUN_RE: Final = re.compile(
    r"Running collective: CollectiveFingerPrint\((?:SequenceNumber=(?P<seq>\d{1,22}),?[ \t]?)?OpType=(?P<op>\w{1,40})"
)
_PG_GLOBAL_RANK_RE: Final = re.compile(r"global rank: (\d{1,7})")
_PG_OPTIONS_TIMEOUT_RE: Final = re.compile(r"TIMEOUT\(ms\): (\d{1,22})")
_ROOT_CAUSE_RE: Final = re.compile(r"Root Cause \(first observed failure\)")


def _nccl_ids(text: str, limit: int) -> dict[str, object]:
    """host / pid / cudaDev of the NCCL prefix that ends before ``limit``.

    Anchored on the literal ``:pid:tid [dev] `` tail and walking back to the host name, so the cost is
    linear in the line (a regex that starts at every character with a host-name class would not be).
    """
    tail = _PREFIX_TAIL_RE.search(text, 0, limit)
    if tail is not None:
        end = tail.start()
        host = text[max(text.rfind(c, 0, end) for c in _HOST_STOP) + 1 : end]
        return {
            "host": host or None,
            "pid": parse_int(tail.group("pid")),
            "cuda_dev": parse_int(tail.group("dev")),
        }
    dev = _DEV_RE.search(text, 0, limit)
    if dev is not None:
        before = text[: dev.start()].rsplit(None, 1)
        host = before[-1] if before else ""
        if host and _HOST_RE.fullmatch(host) is not None:
            return {"host": host, "pid": None, "cuda_dev": parse_int(dev.group(1))}
        return {"host": None, "pid": None, "cuda_dev": parse_int(dev.group(1))}
    return {"host": None, "pid": None, "cuda_dev": None}


def _old_level(text: str) -> tuple[str, int, int] | None:
    """NCCL <= 2.4 ``[dev] [file:line ]INFO|WARN payload`` (no ``NCCL`` word): (level, start, payload start)."""
    for level in ("WARN", "INFO"):
        pos = text.find(f" {level} ")
        if pos < 0:
            continue
        before = text[:pos].rsplit(None, 2)
        last = before[-1] if before else ""
        prev = before[-2] if len(before) > 1 else ""
        if (
            _DEV_TOKEN_RE.fullmatch(last) is not None
            or _SOURCE_TOKEN_RE.fullmatch(last) is not None
            or (_LINE_TOKEN_RE.fullmatch(last) is not None and _DEV_TOKEN_RE.fullmatch(prev) is not None)
        ):
            return level, pos + 1, pos + len(level) + 2
    return None


def nccl_events(text: str) -> list[Classified]:
    """NCCL events in one logical line or block (may be several when messages were flattened)."""
    text = bounded(text)
    events: list[Classified] = []
    if ("UCX" in text or "ucp_" in text or "uct_" in text) and "NCCL" not in text:
        return events
    level_name: str | None = None
    level_start = 0
    payload = ""
    if "NCCL " in text:
        level = _LEVEL_RE.search(text)
        if level is not None:
            level_name, level_start = level.group("lvl"), level.start()
            payload = level.group("payload")
    if level_name is None and (" WARN " in text or " INFO " in text):
        old = _old_level(text)
        if old is not None:
            level_name, level_start, payload_start = old
            payload = text[payload_start:]
    ids = _nccl_ids(text, level_start if level_name else min(len(text), 600))
    if level_name == "INFO":
        events.append(_info_event(payload, ids))
    elif level_name is not None:
        before = text[:level_start].rsplit(None, 1)
        events.append(_warn_event(payload, before[-1] if before else "", ids))
    if level_name is None and (
        "NET/" in text or "ocket" in text or "Net :" in text or "Call to" in text or "Bootstrap" in text
    ):
        bare = _BARE_NET_RE.search(text)
        if bare is not None:
            events.append(_net_event(text[bare.start() :], ids))
    if level_name is None and ("Cuda" in text or "CUDA calloc" in text):
        bare_cuda = _BARE_CUDA_RE.search(text)
        if bare_cuda is not None:
            events.append(
                make_event(
                    "nccl_warn_cuda",
                    "critical",
                    reason="nccl_cuda_failure",
                    message=clip(text[bare_cuda.start() :]),
                    **ids,
                )
            )
    if level_name is None and "NCCL error: " in text:
        relayed = relayed_nccl_result(text)
        if relayed is not None:
            what = relayed.group("what")
            kind: Kind = (
                "nccl_warn_cuda"
                if "cuda" in what
                else "nccl_warn_net"
                if "network" in what
                else "nccl_warn_other"
            )
            events.append(
                make_event(
                    kind,
                    "critical",
                    reason="nccl_result_relayed",
                    message=clip(text[relayed.start() :]),
                    **ids,
                )
            )
    if level_name is None and "NCCL version" in text:
        version = _VERSION_RE.search(text)
        # "..., NCCL version 2.21.5" ends PyTorch's NCCL error messages: part of that error, not a banner.
        if version is not None and not text[: version.start()].rstrip().endswith(","):
            events.append(
                make_event("nccl_init", "info", reason="nccl_version", nccl_version=version.group("ver"))
            )
    if "MISMATCH" in text:
        ras = _RAS_MISMATCH_RE.search(text)
        if ras is not None:
            events.append(
                make_event(
                    "nccl_warn_other",
                    "critical",
                    op=ras.group("op") if ras.group("op") != "collective" else None,
                    reason="nccl_ras_mismatch",
                    message=clip(text),
                )
            )
    return events


def chatter_event(text: str) -> Classified:
    """A plain NCCL INFO line: ``nccl_info``/``info`` with the prefix identifiers."""
    text = bounded(text)
    return make_event("nccl_info", "info", **_nccl_ids(text, min(len(text), 600)))


def _info_event(payload: str, ids: dict[str, object]) -> Classified:
    init = _INIT_RE.search(payload) if "nranks" in payload else None
    if init is None and "comm 0x" in payload:
        return _comm_event(payload, ids)
    if init is not None:
        state = _COMM_STATE_RE.search(payload)
        state_text = state.group(1) if state else ""
        cuda = _CUDADEV_RE.search(payload)
        bus = _BUSID_RE.search(payload)
        fields: dict[str, object] = dict(ids)
        fields.update(
            rank=parse_int(init.group("rank")),
            nranks=parse_int(init.group("nranks")),
            comm=init.group("comm"),
            pci_bus=pci_from_nccl_busid(bus.group(1)) if bus else None,
        )
        if cuda is not None:
            fields["cuda_dev"] = parse_int(cuda.group(1))
        if state_text.startswith("Abort"):
            return make_event("nccl_info", "warning", reason="nccl_comm_abort", **fields)
        if state_text.startswith("Destroy"):
            return make_event("nccl_info", "info", reason="nccl_comm_destroy", **fields)
        return make_event("nccl_init", "info", reason="nccl_comm_init", **fields)
    version = _VERSION_RE.match(payload)
    if version is not None:
        return make_event(
            "nccl_init", "info", reason="nccl_version", nccl_version=version.group("ver"), **ids
        )
    trace = _TRACE_RE.match(payload)
    if trace is not None:
        return make_event("nccl_info", "warning", reason="nccl_error_trace", message=clip(payload), **ids)
    return make_event("nccl_info", "info", **ids)


def _comm_event(payload: str, ids: dict[str, object]) -> Classified:
    """``comm 0x.. rank N`` lines that are not init lines (NCCL 2.19+ ``nRanks ... localRank``, teardown)."""
    match = _COMM_RANK_RE.search(payload)
    fields: dict[str, object] = dict(ids)
    if match is not None:
        fields.update(rank=parse_int(match.group("rank")), comm=match.group("comm"))
    state = _COMM_STATE_RE.search(payload)
    if state is not None and state.group(1).startswith("Abort"):
        return make_event("nccl_info", "warning", reason="nccl_comm_abort", **fields)
    return make_event("nccl_info", "info", reason="nccl_comm", **fields)


def _warn_event(payload: str, source_file: str, ids: dict[str, object]) -> Classified:
    from_rank = _FROM_RANK_RE.search(payload)
    rank = parse_int(from_rank.group(1)) if from_rank else None
    if _CUDA_WARN_RE.search(payload) is not None:
        return make_event(
            "nccl_warn_cuda", "critical", reason="nccl_cuda_failure", message=clip(payload), **ids
        )
    if _NET_WARN_RE.search(payload) is not None or _NET_FILE_RE.search(source_file) is not None:
        return _net_event(payload, ids, rank=rank)
    severity: Severity = "warning" if _CONFIG_WARN_RE.search(payload) is not None else "critical"
    return make_event(
        "nccl_warn_other", severity, rank=rank, reason="nccl_warn", message=clip(payload), **ids
    )


def _net_event(payload: str, ids: dict[str, object], rank: int | None = None) -> Classified:
    benign = _NET_BENIGN_RE.search(payload) is not None or (
        "NCCL_" in payload and _ENV_CONFIG_RE.search(payload) is not None
    )
    severity: Severity = "warning" if benign else "critical"
    peer = _PEER_RE.search(payload)
    if "completion" in payload:
        reason = "nccl_ib_completion_error"
    elif "async" in payload:
        reason = "nccl_ib_async_event"
    elif "ocket" in payload or "Call to" in payload or "Connection" in payload:
        reason = "nccl_socket_error"
    else:
        reason = "nccl_net_error"
    return make_event(
        "nccl_warn_net",
        severity,
        rank=rank,
        reason=reason,
        peer=peer.group(1) if peer else None,
        message=clip(payload),
        **ids,
    )


def torch_rank(text: str) -> int | None:
    """The global rank a PyTorch line speaks for.

    ``[rank12]:`` (added by torchrun) is authoritative; otherwise a ``[PG ... Rank N]`` tag counts only for
    the default group (its ranks are global), then the old ``[Rank N]`` tag (default group only existed).
    """
    match = _GLOBAL_RANK_RE.search(text)
    if match is not None:
        return parse_int(match.group(1))
    pg = _PG_RANK_RE.search(text)
    if pg is not None:
        if pg.group("pg") == "0" or (pg.group("name") or "").strip() == "default_pg":
            return parse_int(pg.group("rank"))
        return None
    old = _OLD_RANK_RE.search(text)
    if old is not None:
        return parse_int(old.group(1))
    aborted = _ABORTED_RANK_RE.search(text)
    if aborted is not None:
        return parse_int(aborted.group(1))
    return None


def torch_events(text: str) -> list[Classified]:
    """PyTorch distributed events (watchdog timeouts, NCCL errors, heartbeat, torchrun failures)."""
    text = bounded(text)
    events: list[Classified] = []
    if not any(word in text for word in _TORCH_GATE):
        return events
    rank: int | None = None
    rank_done = False

    def get_rank() -> int | None:
        nonlocal rank, rank_done
        if not rank_done:
            rank, rank_done = torch_rank(text), True
        return rank

    if "WorkNCCL(" in text or "operation timeout" in text or "timing out" in text:
        timed_out = _WATCHDOG_TIMEOUT_RE.search(text) is not None
        if timed_out or "WorkNCCL(" in text:
            events.append(_work_event(text, get_rank(), timed_out=timed_out))
    for index in _torch_rules_for(text):
        _, pattern, severity, reason = _TORCH_RULES[index]
        match = pattern.search(text)
        if match is not None and reason == "nccl_error" and relayed_nccl_result(text) is not None:
            match = None
        if match is not None:
            seq = parse_int(match.group("seq")) if "seq" in pattern.groupindex else None
            op = match.group("op") if "op" in pattern.groupindex else None
            events.append(
                make_event(
                    "torch_other_error",
                    severity,
                    rank=get_rank(),
                    seq=seq,
                    op=op,
                    reason=reason,
                    message=clip(text[match.start() :]),
                )
            )
    dump = _DUMP_SIGNAL_RE.search(text) if "dump signal" in text else None
    if dump is not None:
        events[:] = [e for e in events if e.reason != "dump_signal"]
        events.append(
            make_event(
                "torch_other_error",
                "warning",
                rank=get_rank(),
                reason="dump_signal_from_peer",
                peer_rank=parse_int(dump.group(1)),
                message=clip(text[dump.start() :]),
            )
        )
    exit_match = _EXIT_RE.search(text) if "exitcode" in text else None
    if exit_match is not None:
        code = parse_int(exit_match.group("code"))
        events.append(
            make_event(
                "torch_other_error",
                "critical" if code is None or code < 0 else "warning",
                reason="torchrun_worker_failed",
                exit_code=code,
                local_rank=parse_int(exit_match.group("local")),
                message=clip(text[exit_match.start() :]),
            )
        )
    block_exit = _BLOCK_EXIT_RE.search(text) if "\n" in text and "exitcode" in text else None
    if block_exit is not None or ("Root Cause" in text and _ROOT_CAUSE_RE.search(text) is not None):
        # torchrun's failure summary ("Root Cause" or "Failures:" section): one field per line.
        block_rank = _BLOCK_RANK_RE.search(text)
        code = parse_int(block_exit.group(1)) if block_exit else None
        events.append(
            make_event(
                "torch_other_error",
                "warning" if code is not None and code >= 0 else "critical",
                rank=parse_int(block_rank.group(1)) if block_rank else None,
                exit_code=code,
                reason="torchrun_root_cause",
                message=clip(text),
            )
        )
    if "[c10d]" in text and not events:
        c10d = _C10D_BAD_RE.search(text)
        if c10d is not None:
            c10d_severity: Severity = "critical" if _GLOG_ERROR_RE.search(text[: c10d.start()]) else "warning"
            events.append(
                make_event(
                    "torch_other_error",
                    c10d_severity,
                    rank=get_rank(),
                    reason="c10d_error",
                    message=clip(text[c10d.start() :]),
                )
            )
        elif _GLOG_WARNING_RE.search(text, 0, text.find("[c10d]")) is not None:
            # No failure word, but c10d logged it at warning level ("The hostname of the client socket
            # cannot be retrieved"): PyTorch's own verdict that something is wrong.
            events.append(
                make_event(
                    "torch_other_error", "warning", rank=get_rank(), reason="c10d_warning", message=clip(text)
                )
            )
    if not events and "Running collective" in text:
        fingerprint = _FINGERPRINT_RUN_RE.search(text)
        if fingerprint is not None:
            events.append(
                make_event(
                    "other",
                    "info",
                    rank=get_rank(),
                    seq=parse_int(fingerprint.group("seq")),
                    op=fingerprint.group("op"),
                    reason="collective_fingerprint",
                )
            )
    if not events and "TIMEOUT(ms)" in text:
        pg_timeout = _PG_OPTIONS_TIMEOUT_RE.search(text)
        if pg_timeout is not None:
            explicit = _PG_GLOBAL_RANK_RE.search(text)
            events.append(
                make_event(
                    "other",
                    "info",
                    rank=parse_int(explicit.group(1)) if explicit else get_rank(),
                    timeout_ms=parse_int(pg_timeout.group(1)),
                    reason="process_group_options",
                )
            )
    if not events and _maybe_benign(text) and _BENIGN_TORCH_RE.search(text) is not None:
        events.append(make_event("other", "info", rank=get_rank(), reason="torch_benign"))
    return events


_TORCH_NEEDLES: Final = tuple(
    (needle, index) for index, rule in enumerate(_TORCH_RULES) for needle in rule[0]
)


def _torch_rules_for(text: str) -> list[int]:
    """Indexes of the rules whose needle occurs in ``text``, in rule order, each once."""
    hits: list[int] = []
    for needle, index in _TORCH_NEEDLES:
        if needle in text and index not in hits:
            hits.append(index)
    hits.sort()
    return hits


#: Words one of which every PyTorch message handled here contains; a line with none skips them all.
_TORCH_GATE: Final = (
    "NCCL",
    "atchdog",
    "Error",
    "rror",
    "entire process",
    "aborted",
    "eartbeat",
    "CUDA",
    "Terminating",
    "dump",
    "Stack trace",
    "flight recorder",
    "timeout",
    "timing out",
    "exitcode",
    "Root Cause",
    "[c10d]",
    "TIMEOUT(ms)",
    "destroy",
    "closing signal",
    "Exception raised",
    "frame #",
    "Rendezvous",
    "CollectiveFingerPrint",
)


def _maybe_benign(text: str) -> bool:
    return (
        "destroy" in text or "closing signal" in text or "Exception raised from" in text or "frame #" in text
    )


def _work_event(text: str, rank: int | None, *, timed_out: bool) -> Classified:
    """A message about one collective (``WorkNCCL(...)``): a watchdog timeout, or an async exception."""
    work = _WORK_RE.search(text)
    body = work.group("body") if work else ""
    seq = _SEQNUM_RE.search(body)
    op = _OPTYPE_RE.search(body)
    numel_in = _NUMEL_IN_RE.search(body)
    numel_out = _NUMEL_OUT_RE.search(body)
    timeout = _TIMEOUT_MS_RE.search(body)
    ran_for = _RAN_FOR_RE.search(text, work.end()) if work else None
    return make_event(
        "torch_watchdog_timeout" if timed_out else "torch_other_error",
        "critical",
        rank=rank,
        seq=parse_int(seq.group(1)) if seq else None,
        op=op.group(1) if op else None,
        timeout_ms=parse_int(timeout.group(1)) if timeout else None,
        numel_in=parse_int(numel_in.group(1)) if numel_in else None,
        numel_out=parse_int(numel_out.group(1)) if numel_out else None,
        ran_for_ms=parse_int(ran_for.group(1)) if ran_for else None,
        reason="watchdog_timeout" if timed_out else "collective_exception",
        message=clip(text[work.start() :] if work else text),
    )


def global_rank(text: str) -> int | None:
    """The ``[rankN]`` prefix torchrun adds to every line of a worker, if any."""
    if "[rank" not in text:
        return None
    match = _GLOBAL_RANK_RE.search(bounded(text))
    return parse_int(match.group(1)) if match else None
