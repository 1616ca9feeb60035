"""The labelling rules (docs/signals.md, "The labelling rules": how severity and kind are decided), applied
to lines whose exact format no parser knows.

Real logs carry the same failures in other dresses (an Xid relayed by a device plugin, an ECC error
reported by CUDA, a ``terminate called``, a Slurm step killed, a look-alike library's warning). The kind is
the most specific failure the line names, else its producer (:func:`producer`); the severity comes from
its failure words (:func:`failure_severity`), so an unknown line with failure words is never ``info``.
Pure and bounded; every regex is linear.
"""

from __future__ import annotations

import re
from typing import Final, Literal

import msgspec

from sentinel.components.ecc import rule as ecc_rule
from sentinel.components.rowremap import rule as row_remap_rule
from sentinel.components.vocab import Severity
from sentinel.components.xid.parse import parse_xid
from sentinel.signals.record import Classified, Kind, finding_event, make_event
from sentinel.text import clip, normalize_pci, parse_int

Producer = Literal["nccl", "torch", "kernel", "lookalike", "other"]

# --- producers ----------------------------------------------------------------------------------------

_TORCH_RE: Final = re.compile(
    r"\[rank\d|ProcessGroup|\bc10d?\b|c10::|\btorch\b|torch[._/]|torchrun|\belastic\b|\[PG |DistBackendError|"
    r"DistNetworkError|DistStoreError|\b[Gg]loo\b|gloo/|TCPStore|NCCLUtils|ChildFailedError|\bTHC|"
    r"\b(?:initializing|init|destroy)[ _]process[ _]group\b|store[ _]based[ _]barrier"
)
_LOOKALIKE_RE: Final = re.compile(
    r"\bUC[XC]\b|\bucp_|\buct_|\bHCCL\b|\bRCCL\b|\bMSCCL|\boneCCL\b|\bCCL_(?:WARN|ERROR|INFO)|\bhccl|\brccl"
)
_NCCL_RE: Final = re.compile(r"\bNCCL\b|NET/|\bncclras\b|\bnccl[A-Z]|\bRAS\b|nccl-tests|_perf\b")
_KERNEL_RE: Final = re.compile(
    r"\bkernel:|NVRM|^\s*\[\s*\d{1,10}\.\d{1,9}\]|\bmlx[45]_|\bpcieport\b|\bpci \w{4}:|nvidia-nvswitch|"
    r"nvidia-peermem|\bib\d{1,3}:|\bAER\b|\bpciehp\b|\b(?:ice|i40e|ixgbe|igb|e1000e|bnxt_en|tg3|ena|efa)\b \w{4}:"
)


def producer(text: str) -> Producer:
    """Who wrote the line: PyTorch (and its launcher) first, since its messages quote NCCL; then the
    look-alike libraries (they imitate NCCL's format), NCCL, the kernel, and everyone else."""
    if _LOOKALIKE_RE.search(text) is not None:
        return "lookalike"
    if _TORCH_RE.search(text) is not None:
        return "torch"
    if _NCCL_RE.search(text) is not None:
        return "nccl"
    if _KERNEL_RE.search(text) is not None:
        return "kernel"
    return "other"


# --- failure words ------------------------------------------------------------------------------------

#: The job or the GPU cannot go on: a crash, an abort, an unrecoverable or fatal error.
_CRITICAL_WORDS_RE: Final = re.compile(
    r"\b(?:fatal|uncorrectable|uncorrected|unrecoverable|panic|crash(?:ed|es)?|segfault|aborted|aborting|"
    r"killed|core dumped|unhandled|illegal|corrupt(?:ed|ion)?|hard lockup|exited abnormally|"
    r"terminate called|out of memory|OOM)\b",
    re.IGNORECASE,
)
#: Something is wrong or degraded, but work may go on (or the cause is on another line).
_WARNING_WORDS_RE: Final = re.compile(
    r"\b(?:errors?|fail(?:s|ed|ure|ures|ing)?|exception|timed? ?out|timeout|hang|hung|"
    r"not responding|unresponsive|unhealthy|degraded|down|unplugged|lost|retry(?:ing)?|refused|"
    r"reset by peer|unreachable|mismatch|invalid|denied|stuck|throttl\w{0,6}|limited by|insufficient|"
    r"dead|missing|cancel+ed|unavailable|violation|overflow|exceeded|stall(?:s|ed|ing)?|no progress|"
    r"preempt(?:ed|ion)|(?:force )?terminat(?:ed|ing))\b",
    re.IGNORECASE,
)
#: Words that name no failure although they contain one: counts of zero, "no errors", configuration.
_BENIGN_RE: Final = re.compile(
    r"\b(?:no|0|zero|without|ignor\w{1,4})[ \t]+(?:\w{1,20}[ \t]+)?(?:errors?|failures?|faults?)\b|"
    r"\b(?:errors?|failures?|faults?)[ \t]*[:=][ \t]*(?:0|none|no|ok|n/a)\b|error_file|errorfile|"
    r"\b[A-Z]{1,20}_\w{0,40}?(?:TIMEOUT|ERROR|RETRY)|\b(?:timeout|retry)['\"]?[ \t]*[:=(][ \t]*\d|"
    r"\bDEBUG\b|\bdown(?:load|sampl|stream)|\bshut(?:ting)?[ \t]+down\b|"
    r"\b[a-z_.]{0,30}(?:panic|timeout|retry|error|fail|abort|oom)[a-z_.]{0,20}=[\w.,:-]{0,40}|"
    # Hedged advice ("this can potentially cause a hang if ...") names a risk, not a failure.
    r"\b(?:can|could|may|might)[ \t]+(?:potentially[ \t]+)?(?:cause|lead[ \t]+to|result[ \t]+in)[ \t]+"
    r"(?:an?[ \t]+)?(?:\w{1,20}[ \t]+)?\w{1,20}",
    re.IGNORECASE,
)


#: An error the line itself calls not fatal (``Non-fatal``, ``non-fatal errors on NVSwitch 3``,
#: ``Uncorrectable (Non-Fatal)``): something wrong that work goes on through, never a fatal one.
_NON_FATAL_RE: Final = re.compile(r"\bnon[- ]?fatal\b", re.IGNORECASE)
_URL_RE: Final = re.compile(r"\b(?:https?|file)://\S{1,500}")
#: A Python or C++ exception class named in the line (``RuntimeError``, ``DistBackendError``).
_EXCEPTION_CLASS_RE: Final = re.compile(r"\b[A-Z][A-Za-z0-9]{0,40}(?:Error|Exception)\b")
#: A broken connection: for a communication library it stops the collective (critical).
_COMMS_FAILURE_RE: Final = re.compile(
    r"[Cc]onnection (?:closed|reset|refused|timed out|lost|aborted)|closed by (?:remote )?peer|[Bb]roken pipe|"
    r"connectFullMesh failed|[Cc]onnect timeout",
)


def failure_severity(text: str) -> Severity | None:
    """The severity the failure words of ``text`` call for, or ``None`` when it names no failure.

    Words inside URLs (``.../elastic/errors.html``) and benign phrases (``0 errors``, ``NCCL_IB_TIMEOUT``)
    do not count.
    """
    cleaned = _URL_RE.sub(" ", text) if "://" in text else text
    cleaned = _BENIGN_RE.sub(" ", cleaned) if _BENIGN_RE.search(cleaned) is not None else cleaned
    if _NON_FATAL_RE.search(cleaned) is not None:
        # The line's own verdict on its error ("non-fatal ... uncorrectable ECC error") wins over the
        # words that describe the error.
        return "warning"
    if _CRITICAL_WORDS_RE.search(cleaned) is not None:
        return "critical"
    if (
        _WARNING_WORDS_RE.search(cleaned) is not None
        or _EXCEPTION_CLASS_RE.search(cleaned) is not None
        or _COMMS_FAILURE_RE.search(cleaned) is not None
    ):
        return "warning"
    return None


# --- specific failures, whatever the wrapper ----------------------------------------------------------

_RELAYED_XID_RE: Final = re.compile(
    r"(?<![A-Za-z0-9_])(?:XID|Xid|xid)s?"
    r"(?:[ \t]{1,3}(?:[Ee]rrors?|ERRORS?|[Cc]ode|[Ee]vent|detected|reported|found|occurred)){0,2}[ \t]{0,3}"
    r"(?:[:=#]|is)?[ \t]{0,3}['\"]?(?P<code>\d{1,3})(?![\d.]|:\d)"
)
_XID_CONDITION_RE: Final = re.compile(
    r"\bXid\w{0,30}\b[^\n{]{0,200}\{[ \t]*\"(?P<code>\d{1,3})\"[ \t]*:[ \t]*true\b"
)
_MEMORY_CRITICAL_RE: Final = re.compile(
    r"uncorrect(?:able|ed)[ \t]+(?:ECC|memory|DRAM|SRAM|HBM|DBE)|(?:ECC|DRAM|SRAM|HBM)[ \t]+uncorrect(?:able|ed)|"
    r"double[- ]bit(?:[ \t]+ECC)?[ \t]+errors?|\bDBE\b|ECC_?UNCORRECTABLE|ECCUncorrectable|"
    r"uncorrectable[ \t]+(?:ECC[ \t]+)?errors?[ \t]+(?:was[ \t]+|were[ \t]+)?(?:encountered|detected)",
    re.IGNORECASE,
)
_ROW_REMAP_FAILURE_RE: Final = re.compile(
    r"row[- ]?remap(?:ping|per)?[ \t]+fail|remapping[ \t]+failure|RowRemapFailure|row remapping has failed",
    re.IGNORECASE,
)
_ROW_REMAP_PENDING_RE: Final = re.compile(
    r"rows?[- ]?remap(?:ping)?[ \t]+(?:is[ \t]+)?pending|pending[ \t]+row[- ]?remap|row[s]? (?:was |were )?remapped",
    re.IGNORECASE,
)
_PAGE_RETIRE_RE: Final = re.compile(
    r"pages?[ \t]+(?:pending[ \t]+)?retire|retired[ \t]+pages?|page[ \t]+retirement|pending[ \t]+page",
    re.IGNORECASE,
)
_CORRECTABLE_RE: Final = re.compile(
    r"(?<!un)correct(?:able|ed)[ \t]+(?:ECC|memory|DRAM|SRAM|HBM)|single[- ]bit(?:[ \t]+ECC)?[ \t]+errors?|\bSBE\b",
    re.IGNORECASE,
)
#: What follows a memory-error name when there is none: a zero count, "No", or a diagnostics cell that
#: passed (``| Page Retirement/Row Remap | Pass |``).
_ZERO_AFTER_RE: Final = re.compile(
    r"[^\n:=|]{0,80}?[:=|][ \t]*(?:0(?![\d.])|No\b|N/A|None\b|Pass(?:ed)?\b|OK\b)|[ \t]+0(?![\d.])",
    re.IGNORECASE,
)

_CRASH_RE: Final = re.compile(
    r"terminate called (?:after throwing|without an active exception|recursively)|Segmentation fault|"
    r"\bSIG(?:SEGV|ABRT|BUS|ILL|FPE)\b|Signal \d{1,2} \(SIG\w{2,6}\) received|core dumped|Fatal Python error|"
    r"[Kk]illed by signal|terminated with signal|exited with signal|exited on signal|Aborted \(core|"
    r"Kernel panic|oom[-_ ]kill|\bOOMKilled\b|OutOfMemoryError|CUDA out of memory|\bKilled$|: Killed\b|"
    r"(?:task|process) \d{1,9}(?:: | )(?:Killed|Aborted|Segmentation)"
)
_BENIGN_SIGNAL_RE: Final = re.compile(r"closing signal|death signal|Received SIG(?:TERM|INT|HUP)|SIGTERM")

# CUDA runtime/driver error strings (cudaGetErrorString / cuGetErrorString texts and enum names).
_CUDA_ERROR_RE: Final = re.compile(
    r"Search for [`'\u2018]cuda[A-Z]\w{2,40}' in \S{1,300} for more information|"
    r"\bCUDA error\b|\bCUDA_ERROR_\w{2,40}|\bcudaError[A-Z]\w{2,40}|cuda runtime error|CUDA driver error|"
    r"\bCUBLAS_STATUS_\w{2,40}|\bCUDNN_STATUS_\w{2,40}|an illegal memory access was encountered|"
    r"unspecified launch failure|device-side assert triggered|misaligned address|"
    r"an illegal instruction was encountered|the launch timed out and was terminated|"
    r"(?:all )?CUDA-capable devices? (?:is/are|are|is) busy or unavailable|no CUDA-capable device is detected|"
    r"CUDA driver version is insufficient|unsupported display driver / cuda driver combination|"
    r"forward compatibility was attempted on non supported HW|\bCUDA initialization\b|"
    r"peer access is not supported|uncorrectable ECC error encountered|CUDA kernel errors might be"
)
_CUDA_BENIGN_RE: Final = re.compile(r"CUDA_LAUNCH_BLOCKING|TORCH_USE_CUDA_DSA|CUDA_VISIBLE_DEVICES")

_TEST_FAILURE_RE: Final = re.compile(
    r"\b(?:Test )?(?P<lib>NCCL|CUDA) failure (?:in )?\S{1,120}?:\d{1,6}(?P<rest>.{0,200})|"
    r"\bTest failure \S{1,120}?\.cu:\d{1,6}"
)
_NCCL_ERROR_KIND_RE: Final = re.compile(r"cuda", re.IGNORECASE)
#: nccl-tests' verdict on the collective's results (``# Out of bounds values : 248 FAILED``): values that
#: came back wrong are an NCCL failure the test program reports; ``0 OK`` is the passing verdict.
_TEST_VERDICT_RE: Final = re.compile(r"Out of bounds values ?: ?(?P<count>\d{1,12}) (?P<verdict>OK|FAILED)\b")
#: nccl-tests' device banner: ``#  Rank  0 Group  0 Pid 895544 on h100-2 device  0 [0002:00:01] NVIDIA H100``;
#: newer versions print the GPU's domain:bus:device, older ones its bus alone (``[0x61]``, no address).
_TEST_DEVICE_RE: Final = re.compile(
    r"#\s{1,4}Rank\s{1,6}\d{1,7}\s{1,4}Group\s{1,4}\d{1,7}\s{1,4}Pid\s{1,8}\d{1,10}\s{1,4}on\s{1,40}\S{1,255}\s{1,4}"
    r"device\s{1,4}\d{1,4}\s{1,4}\[(?P<bus>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})\]"
)
_NCCL_NET_RE: Final = re.compile(r"network|remote process|socket|connection|\bIB\b|peer", re.IGNORECASE)

# torchrun failure-summary field lines, behind whatever wrapper: ``  exitcode  : -6 (pid: 2385923)``.
_FIELD_EXIT_RE: Final = re.compile(r"(?:^|[ \t])exitcode[ \t]*:[ \t]*(?P<code>-?\d{1,5})\b")
_FIELD_SIGNAL_RE: Final = re.compile(
    r"(?:^|[ \t])traceback[ \t]*:[ \t]*Signal \d{1,3} \(SIG\w{2,6}\) received"
)
_FIELD_RANK_RE: Final = re.compile(
    r"(?:^|[ \t])rank[ \t]*:[ \t]*(?P<rank>\d{1,7})(?:[ \t]*\(local_rank:[ \t]*(?P<local>\d{1,7})\))?[ \t]*$"
)
_SUMMARY_FAILED_RE: Final = re.compile(r"(?:^|[ \t])\S{1,200}\.py FAILED[ \t]*$")
_CHILD_FAILED_RE: Final = re.compile(r"\bChildFailedError\b")
_ELASTIC_FAILED_RE: Final = re.compile(
    r"[Ww]orker group (?:FAILED|failed)|[Ww]orkers? (?:failed|exited)|[Rr]estarting worker group|"
    r"Process \d{1,9} exited with (?:exit )?code|exited with (?:exit )?code -?\d{1,5}|[Ee]xit(?:ed)? (?:with )?(?:exit )?code[ :]+-?\d{1,5}|"
    r"\bexit status -?\d{1,5}|non-zero exit|"
    # DeepSpeed's launcher: "[...] exits with return code = -9", and its teardown "Killing subprocess 13266"
    r"\bexits with return code ?= ?-?\d{1,5}|[Kk]illing (?:sub)?process(?:es)? \d{1,9}"
)
_EXIT_CODE_RE: Final = re.compile(
    r"(?:exit(?:s|ed)?(?: with)?(?: exit| return)? (?:code|status)|exitcode)[ :=]{0,3}(?P<code>-?\d{1,5})"
)
_HEALTH_VERDICT_RE: Final = re.compile(
    r"marked unhealthy|will go unhealthy|\bunhealthy\b|[Hh]ealth[ \w]{0,20}: ?(?:Fail|Warn|Unhealthy|Critical)|"
    r"\bFail(?:ed)?\b[ \t]*-[ \t]*(?:GPU|All)|\|[ \t]*Fail\b"
)
_COLLECTIVE_TIMEOUT_RE: Final = re.compile(
    r"collective\s+operation\s+time\s?out|watchdog\s+caught|timed\s+out\s+(?:after|waiting)[^\n]{0,80}?"
    r"(?:collective|allreduce|all_reduce|broadcast|allgather|all_gather|reduce_scatter|barrier)",
    re.IGNORECASE,
)
_NET_WORDS_RE: Final = re.compile(
    r"socket|NET/|\bIB\b|ibv_|connection|remote peer|network|\bRoCE\b|\bpeer\b|bootstrap", re.IGNORECASE
)
_CUDA_WORDS_RE: Final = re.compile(r"\bcuda|\bcu[A-Z]\w{2,30}", re.IGNORECASE)

# Kernel network / PCIe driver lines that name a state rather than a failure word.
_LINK_UP_RE: Final = re.compile(
    r"\bLink (?:is )?[Uu]p\b|\blink up\b|\bLink ACTIVE\b|link becomes ready|Cable plugged|"
    r"plugged and enabled|advertised sufficient power|NIC Link is Up",
)
_LINK_DOWN_RE: Final = re.compile(
    r"\bLink (?:is )?[Dd]own\b|\blink down\b|\bLink DOWN\b|NIC Link is Down|Cable unplugged|"
    r"Port module event[^\n]{0,40}unplugged|carrier lost|Link Down|link (?:is )?not ready|"
    r"port (?:state )?(?:changed )?to (?:DOWN|down)|PORT_ERR|LINK_DOWN|link (?:re-?)?initiali[sz]",
)
_POWER_LIMIT_RE: Final = re.compile(
    r"insufficient power|power limit|power[- ]capp|[Pp]ackage power limit|limited by [\d.]{1,8} GT/s|"
    r"\(downgraded\)|PCIe link (?:speed|width) (?:downgraded|degraded|reduced)"
)

# NCCL RAS (``ncclras``) text output.
_RAS_ROW_RE: Final = re.compile(
    r"(?:^|[ \t])\d{1,9}(?:[ \t]+\d{1,12}(?:-\d{1,12})?){4,8}[ \t]+(?P<status>[A-Z_]{2,20})[ \t]+"
    r"(?P<errors>[A-Z_]{2,20}(?:,[A-Z_]{2,20}){0,4})\s*$"
)
_RAS_COMM_RE: Final = re.compile(
    r"#\d{1,6}-\d{1,6} \([0-9a-fA-F]{4,32}\) (?P<what>MISMATCH|INCOMPLETE|ERROR|ABORT\w{0,4}|DEAD|TIMEOUT)"
)
_RAS_DEAD_RE: Final = re.compile(
    r"job process(?:es)? (?:is|are) considered dead|\bPEER_DEAD\b|Missing communicator data from"
)
_RAS_TIMEOUT_RE: Final = re.compile(r"communication timeouts? while gathering")
#: Lines of a RAS report's Errors section, also when quoted alone.
_RAS_ERROR_LINE_RE: Final = re.compile(
    r"(?<![\w-])(?:(?:Initialization|Asynchronous) errors? on \d{1,9} ranks?|\d{1,9} ranks? reported \w[^\n]{0,200})\s*$"
)

# Slurm and other batch schedulers: they report what happened to a job step, not why.
_SCHEDULER_RE: Final = re.compile(
    r"(?<![\w./-])(?:srun|sbatch|salloc|slurmd|slurmctld|slurmstepd(?:-[\w.-]{1,64})?|submitit)(?=:|[ \t])"
)

#: A GPU named with its PCI address by a health tool (DCGM / NVSentinel ``GPU:0 PCI:0000:0f:00.0``): the
#: address is that GPU's, so a rule event about the line records it.
_GPU_PCI_RE: Final = re.compile(
    r"\bGPU[ :#]?\d{0,3}[ \t,;]{1,3}(?:PCI|[Bb]us[ -]?[Ii]d)[ \t]?[:=][ \t]?(?P<bdf>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})"
)
_WEAK_REASONS: Final = frozenset(
    {"pci_device", "ib_port_info", "nvrm_info", "nvsmi_gpu_row", "persistenced_device"}
)


def _xid_events(text: str) -> list[Classified]:
    """An Xid code relayed by another tool (device plugin, DCGM, a health agent): the code decides."""
    if "id" not in text and "ID" not in text:
        return []
    match = _RELAYED_XID_RE.search(text)
    if match is None and "{" in text:
        # A Kubernetes node condition (GKE's device plugin): ``XidCriticalError True ... {"31":true}``.
        match = _XID_CONDITION_RE.search(text)
    if match is None:
        return []
    code = parse_int(match.group("code"))
    if code is None or code == 0:
        return []
    # The catalog's verdict, refined by what the line says (NVLink "Nonfatal", Xid 154 recovery action),
    # is the Xid parser's: give it the canonical kernel form of the same event.
    pci = normalize_pci(text)
    rest = text[match.end() :].lstrip(" ,:;.-")
    record = parse_xid(f"Xid (PCI:{pci or ''}): {code}, {rest}")
    if record is None:
        return []
    return [
        make_event(
            "xid",
            record.severity,
            xid=record.xid,
            pci_bus=pci,
            action=record.action,
            reason=f"xid_{record.xid}",
            message=clip(text),
        )
    ]


def _zero_count(text: str, end: int) -> bool:
    """``Uncorrectable ECC errors: 0`` is a count of nothing, not an error."""
    return _ZERO_AFTER_RE.match(text, end) is not None


def _memory_events(text: str) -> list[Classified]:
    """GPU memory errors, whichever layer reports them (driver, CUDA, PyTorch, NCCL, diagnostics)."""
    lowered_hint = "rror" in text or "ECC" in text or "emap" in text or "etire" in text or "DBE" in text
    if not lowered_hint and "ncorrect" not in text and "bit" not in text:
        return []
    failure = _ROW_REMAP_FAILURE_RE.search(text)
    if failure is not None and not _zero_count(text, failure.end()):
        return [finding_event("row_remap", row_remap_rule.FAILURE, message=clip(text))]
    memory = _MEMORY_CRITICAL_RE.search(text)
    if memory is not None and not _zero_count(text, memory.end()):
        return [finding_event("ecc", ecc_rule.REPORTED_UNCORRECTABLE, message=clip(text))]
    pending = _ROW_REMAP_PENDING_RE.search(text)
    if pending is not None and not _zero_count(text, pending.end()):
        return [finding_event("row_remap", row_remap_rule.PENDING, message=clip(text))]
    retire = _PAGE_RETIRE_RE.search(text)
    if retire is not None and not _zero_count(text, retire.end()):
        return [finding_event("ecc", ecc_rule.REPORTED_RETIRED, message=clip(text))]
    if _CORRECTABLE_RE.search(text) is not None:
        return [finding_event("ecc", ecc_rule.REPORTED_CORRECTABLE, message=clip(text))]
    return []


def _kind_for(prod: Producer, text: str) -> Kind:
    """The producer decides the kind of a failure that names nothing more specific."""
    if prod == "nccl":
        if _CUDA_WORDS_RE.search(text) is not None:
            return "nccl_warn_cuda"
        if _NET_WORDS_RE.search(text) is not None:
            return "nccl_warn_net"
        return "nccl_warn_other"
    if prod == "torch":
        if _COLLECTIVE_TIMEOUT_RE.search(text) is not None:
            return "torch_watchdog_timeout"
        return "torch_other_error"
    return "other"


def _crash_events(text: str, prod: Producer) -> list[Classified]:
    if _CRASH_RE.search(text) is None or _BENIGN_SIGNAL_RE.search(text) is not None:
        return []
    kind: Kind = "torch_other_error" if prod == "torch" else "other"
    return [make_event(kind, "critical", reason="process_crash", message=clip(text))]


def _cuda_events(text: str, prod: Producer) -> list[Classified]:
    match = _CUDA_ERROR_RE.search(text)
    if match is None:
        return []
    if match.group(0) == "CUDA kernel errors might be" or match.group(0).endswith("for more information"):
        # PyTorch's follow-up of a CUDA error reported on the line before.
        return [make_event("torch_other_error", "warning", reason="cuda_error_followup", message=clip(text))]
    # "CUDA error: ..." is PyTorch's C10_CUDA_CHECK format; NCCL quotes "Cuda failure"; the rest is CUDA
    # failing under some other program.
    if prod == "nccl":
        kind: Kind = "nccl_warn_cuda"
    elif prod == "torch" or match.group(0) == "CUDA error" or match.group(0) == "cuda runtime error":
        kind = "torch_other_error"
    else:
        kind = "other"
    return [make_event(kind, "critical", reason="cuda_error", message=clip(text[match.start() :]))]


def _test_verdict_events(text: str) -> list[Classified]:
    """nccl-tests' result verdict and device banner (see _TEST_VERDICT_RE, _TEST_DEVICE_RE)."""
    verdict = _TEST_VERDICT_RE.search(text) if "Out of bounds" in text else None
    if verdict is not None:
        if verdict.group("verdict") == "FAILED" and verdict.group("count").strip("0"):
            return [
                make_event(
                    "nccl_warn_other", "critical", reason="nccl_tests_wrong_results", message=clip(text)
                )
            ]
        return [make_event("other", "info", reason="nccl_tests_verdict")]
    device = _TEST_DEVICE_RE.search(text) if "Rank" in text and "device" in text else None
    if device is not None:
        return [
            make_event(
                "other", "info", pci_bus=normalize_pci(device.group("bus")), reason="nccl_tests_device"
            )
        ]
    return []


def _test_program_events(text: str) -> list[Classified]:
    """nccl-tests: ``Test NCCL failure common.cu:777 'unhandled system error'`` and its ``Test failure``
    follow-up (the cause is on the line before)."""
    if "failure" not in text:
        return []
    match = _TEST_FAILURE_RE.search(text)
    if match is None:
        return []
    lib = match.group("lib")
    if lib is None:
        return [make_event("other", "warning", reason="test_failure", message=clip(text))]
    if lib == "CUDA":
        return [make_event("other", "critical", reason="cuda_test_failure", message=clip(text))]
    rest = match.group("rest") or ""
    kind: Kind
    if _NCCL_ERROR_KIND_RE.search(rest) is not None:
        kind = "nccl_warn_cuda"
    elif _NCCL_NET_RE.search(rest) is not None:
        kind = "nccl_warn_net"
    else:
        kind = "nccl_warn_other"
    return [make_event(kind, "critical", reason="nccl_tests_failure", message=clip(text))]


def _launcher_events(text: str, prod: Producer) -> list[Classified]:
    """torchrun/elastic failure summaries and their single field lines; schedulers reporting an exit."""
    field_exit = _FIELD_EXIT_RE.search(text)
    if field_exit is not None:
        code = parse_int(field_exit.group("code"))
        severity: Severity = "critical" if code is None or code < 0 else "warning"
        return [
            make_event(
                "torch_other_error", severity, exit_code=code, reason="torchrun_exitcode", message=clip(text)
            )
        ]
    if _FIELD_SIGNAL_RE.search(text) is not None:
        return [make_event("torch_other_error", "critical", reason="torchrun_signal", message=clip(text))]
    field_rank = _FIELD_RANK_RE.search(text)
    if field_rank is not None:
        return [
            make_event(
                "other",
                "info",
                rank=parse_int(field_rank.group("rank")),
                local_rank=parse_int(field_rank.group("local")),
                reason="torchrun_rank_field",
            )
        ]
    if _SUMMARY_FAILED_RE.search(text) is not None or _CHILD_FAILED_RE.search(text) is not None:
        return [
            make_event("torch_other_error", "warning", reason="torchrun_child_failed", message=clip(text))
        ]
    if _ELASTIC_FAILED_RE.search(text) is not None:
        code_match = _EXIT_CODE_RE.search(text)
        code = parse_int(code_match.group("code")) if code_match else None
        severity = "critical" if code is not None and code < 0 else "warning"
        kind: Kind = "torch_other_error" if prod == "torch" else "other"
        return [make_event(kind, severity, exit_code=code, reason="process_exit", message=clip(text))]
    return []


def _ras_events(text: str) -> list[Classified]:
    """NCCL RAS client output: a communicator table row, a per-communicator report, a dead process."""
    if text.rstrip()[-1:].isupper():
        row = _RAS_ROW_RE.search(text)
        if row is not None:
            if row.group("errors") == "OK":
                return [make_event("nccl_info", "info", reason="nccl_ras_status")]
            return [
                make_event("nccl_warn_other", "warning", reason="nccl_ras_status_error", message=clip(text))
            ]
    comm = _RAS_COMM_RE.search(text)
    if comm is not None:
        # The report names the NCCL error the ranks returned: a network or CUDA one decides the kind.
        report_kind = _kind_for("nccl", text[comm.end() :])
        return [make_event(report_kind, "critical", reason="nccl_ras_report", message=clip(text))]
    if _RAS_DEAD_RE.search(text) is not None:
        return [make_event("nccl_warn_other", "critical", reason="nccl_ras_dead_process", message=clip(text))]
    if _RAS_TIMEOUT_RE.search(text) is not None:
        return [make_event("nccl_warn_other", "warning", reason="nccl_ras_timeout", message=clip(text))]
    return []


def _ras_error_line_events(text: str) -> list[Classified]:
    """A line of a RAS report's Errors section quoted alone (``  Asynchronous errors on 2 ranks``)."""
    if _RAS_ERROR_LINE_RE.search(text) is None:
        return []
    return [make_event(_kind_for("nccl", text), "critical", reason="nccl_ras_errors", message=clip(text))]


def _link_events(text: str, prod: Producer) -> list[Classified]:
    """Network and PCIe driver state lines: a link going down or a power/bandwidth limit is degraded
    service (warning); a link coming up is normal operation."""
    if _POWER_LIMIT_RE.search(text) is not None:
        return [make_event("other", "warning", reason="pcie_power_or_bandwidth_limit", message=clip(text))]
    if _LINK_DOWN_RE.search(text) is not None:
        return [make_event("other", "warning", reason="link_down", message=clip(text))]
    if _LINK_UP_RE.search(text) is not None and prod != "nccl":
        return [make_event("other", "info", reason="link_up")]
    return []


_LEVEL_WORD_RE: Final = re.compile(r"\b(?:WARN|WARNING|ERROR|FATAL)\b|\|CCL_(?:WARN|ERROR)\|")
_TIMEOUT_WORD_RE: Final = re.compile(r"\btim(?:ed|ing)? ?out\b|\btimeout\b", re.IGNORECASE)
_CRASH_HINTS: Final = (
    "terminate",
    "fault",
    "sig",
    "core dumped",
    "fatal",
    "killed",
    "abort",
    "panic",
    "oom",
    "outofmemory",
    "out of memory",
)
_CUDA_HINTS: Final = ("cuda", "cublas", "cudnn", "illegal", "launch", "assert", "misaligned", "peer access")
_LINK_HINTS: Final = ("link", "cable", "power", "gt/s", "downgraded", "carrier", "port")
_LAUNCHER_HINTS: Final = (
    "exitcode",
    "traceback",
    "rank",
    "failed",
    "childfailederror",
    "exit",
    "orker",
    "killing",
)
_MEMORY_HINTS: Final = ("correct", "ecc", "dbe", "sbe", "remap", "retire", "double", "single", "pending page")


def rule_events(text: str, found: list[Classified]) -> list[Classified]:
    """Events the rules add to what the format parsers ``found`` in one logical line.

    The most specific failure a line names (an Xid, a memory error) is added whatever the wrapper; the
    producer-and-failure-words rules run only when no parser recognised the line (or recognised only
    something weak, such as a bare device address). Each rule is tried only when a word it needs is in
    the line (a C-speed substring test), so a line pays for the rules that can match it.
    """
    lower = text.lower()
    events: list[Classified] = []
    if "xid" in lower and not any(event.kind == "xid" for event in found):
        events.extend(_xid_events(text))
    # An NVSwitch's own ECC errors are the switch's (an SXid), not a GPU's memory.
    if (
        any(hint in lower for hint in _MEMORY_HINTS)
        and "nvswitch" not in lower
        and "sxid" not in lower
        and not any(event.kind in ("ecc", "row_remap") for event in found)
    ):
        events.extend(_memory_events(text))
    if events or any(event.reason not in _WEAK_REASONS for event in found):
        return events
    prod = producer(text)
    specific: list[Classified] = []
    if "failure" in lower:
        specific = _test_program_events(text)
    if not specific and ("out of bounds" in lower or "# " in text):
        specific = _test_verdict_events(text)
    if not specific and (
        text.rstrip()[-1:].isupper() or "#" in text or "dead" in lower or "communicator" in lower
    ):
        specific = _ras_events(text)
    if not specific and " rank" in text and prod != "torch":
        specific = _ras_error_line_events(text)
    if not specific and any(hint in lower for hint in _LAUNCHER_HINTS):
        specific = _launcher_events(text, prod)
    if not specific and any(hint in lower for hint in _CRASH_HINTS):
        specific = _crash_events(text, prod)
    if not specific and any(hint in lower for hint in _CUDA_HINTS):
        specific = _cuda_events(text, prod)
    if not specific and any(hint in lower for hint in _LINK_HINTS):
        specific = _link_events(text, prod)
    if (
        not specific
        and ("health" in lower or "fail" in lower)
        and _HEALTH_VERDICT_RE.search(text) is not None
    ):
        specific = [make_event("other", "warning", reason="health_verdict", message=clip(text))]
    events = specific or _failure_word_events(text, prod)
    if events and "GPU" in text and events[0].pci_bus is None and prod not in ("kernel", "lookalike"):
        named = _GPU_PCI_RE.search(text)
        if named is not None:
            events = [
                msgspec.structs.replace(event, pci_bus=normalize_pci(named.group("bdf"))) for event in events
            ]
    return events


def _failure_word_events(text: str, prod: Producer) -> list[Classified]:
    """The last rule: a line nobody recognised is as severe as its failure words, in its producer's kind."""
    severity = failure_severity(text)
    if prod == "lookalike":
        # Libraries that imitate NCCL's output are not NCCL: their warnings are worth a look, never an
        # NCCL page.
        if severity is None and _LEVEL_WORD_RE.search(text) is None:
            return []
        return [make_event("other", severity or "warning", reason="lookalike_library", message=clip(text))]
    if severity is None:
        return []
    kind = _kind_for(prod, text)
    if severity == "critical" and _SCHEDULER_RE.search(text) is not None:
        # "Job step aborted", "CANCELLED": the scheduler reports an end whose cause is on another line
        # (a crash or an OOM kill it names is caught by the crash rule first).
        severity = "warning"
    if prod in ("nccl", "torch") and (
        _TIMEOUT_WORD_RE.search(text) is not None or _COMMS_FAILURE_RE.search(text) is not None
    ):
        # A collective or communicator that timed out stops the job.
        severity = "critical"
    if severity == "critical" and prod == "torch" and _torch_warning_level(text):
        # PyTorch logged it at warning level: its own verdict that work goes on (a store it polls went
        # away, a connection it retries); a crash it names is caught by the crash rule first.
        severity = "warning"
    return [make_event(kind, severity, reason="failure_words", message=clip(text))]


#: glog's warning level in a PyTorch C++ header (``[W1105 14:05:01.118 TCPStore.cpp:141]``,
#: ``[W socket.cpp:663]``), behind at most a ``[rankN]:`` prefix.
_GLOG_WARNING_HEAD_RE: Final = re.compile(
    r"(?:^|[\s:])\[W(?:\d{3,4} \d\d:\d\d:\d\d[.\d]{0,12})? ?[\w.-]{1,80}\.(?:cpp|cc|h):\d{1,6}\]"
)


def _torch_warning_level(text: str) -> bool:
    return "[W" in text and _GLOG_WARNING_HEAD_RE.search(text, 0, 400) is not None
