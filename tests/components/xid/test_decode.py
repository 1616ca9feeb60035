"""Decoders of the registers and values the driver prints after Xid 74, 144-150 and 154."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sentinel.components.xid.decode import decode_nvlink5, decode_xid74, parse_recovery
from sentinel.components.xid.nvidia import XID154_RECOVERY

_CLASS_BITS = {
    "ecc_parity": (4, 5),
    "signal_integrity": (21, 22),
    "link_hardware": (8, 9, 12, 16, 17, 24, 28),
}


@pytest.mark.parametrize(
    ("first", "error_class"),
    [
        (0x10, "ecc_parity"),
        (0x20, "ecc_parity"),
        (0x400000, "signal_integrity"),
        (0x10000, "link_hardware"),
        (0x1000, "link_hardware"),
        (0x2, "unclassified"),
        (0x0, "unclassified"),
    ],
)
def test_xid74_error_class(first: int, error_class: str) -> None:
    decoded = decode_xid74(
        f"NVLink: fatal error detected on link 3(0x{first:x}, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)"
    )
    assert decoded is not None
    assert (decoded.link, decoded.error_class, decoded.registers[0]) == (3, error_class, first)


def test_xid74_without_registers() -> None:
    assert decode_xid74("NVLink: fatal error detected on link 3") is None


@given(link=st.integers(0, 999), registers=st.lists(st.integers(0, 0xFFFFFFFF), min_size=1, max_size=7))
def test_xid74_reads_back_what_was_printed(link: int, registers: list[int]) -> None:
    text = f"NVLink: fatal error detected on link {link}(" + ", ".join(f"0x{r:x}" for r in registers) + ")"
    decoded = decode_xid74(text)
    assert decoded is not None
    assert decoded.link == link and decoded.registers == tuple(registers)
    assert decoded.bits == tuple(bit for bit in range(32) if registers[0] >> bit & 1)
    wanted = [name for name, bits in _CLASS_BITS.items() if set(bits) & set(decoded.bits)]
    assert decoded.error_class == (wanted[0] if wanted else "unclassified")


@given(st.text(max_size=300))
def test_decoders_never_raise_on_any_text(text: str) -> None:
    decode_xid74(text)
    parse_recovery(text)
    for code in range(144, 151):
        decode_nvlink5(code, text)


@given(
    before=st.sampled_from(sorted(XID154_RECOVERY)),
    after=st.sampled_from(sorted(XID154_RECOVERY)),
    case=st.sampled_from([str.lower, str.upper, str]),
)
def test_recovery_reads_nvidias_values(before: str, after: str, case: object) -> None:
    assert callable(case)
    text = (
        f"GPU recovery action changed from 0x{XID154_RECOVERY[before]:x} ({case(before)}) "
        f"to 0x{XID154_RECOVERY[after]:x} ({case(after)})"
    )
    recovery = parse_recovery(text)
    assert recovery is not None
    assert (recovery.before, recovery.after, recovery.value) == (before, after, XID154_RECOVERY[after])


def test_recovery_unknown_value_is_none() -> None:
    assert parse_recovery("GPU recovery action changed from 0x0 (None) to 0x9 (Replace Board)") is None
    assert parse_recovery("154 (") is None


@given(intr_low=st.integers(0, 0x3FF), link=st.integers(0, 0xFFF))
def test_nvlink5_fatal_word_never_picks_a_nonfatal_row(intr_low: int, link: int) -> None:
    intr = link << 10 | intr_low
    for word in ("Fatal", "Nonfatal"):
        decoded = decode_nvlink5(149, f"NETIR {word} XC0 i0 Link 01 (0x{intr:08x} 0x00000001 0x0 0x0)")
        if decoded is not None:
            fatal = "Fatal" in decoded.severity and not decoded.severity.startswith("Non")
            assert fatal == (word == "Fatal")
