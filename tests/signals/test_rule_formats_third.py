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
