"""Single nvidia-smi ECC fields and the ECC mode: the log classifier asks the ecc component."""

from __future__ import annotations

import pytest

from sentinel.signals import classify_text


@pytest.mark.parametrize(
    ("text", "kind", "severity"),
    [
        ("        Pending Page Blacklist    : Yes", "ecc", "warning"),
        (
            "    ECC Mode\n        Current                           : Enabled\n        Pending                           : Disabled",
            "ecc",
            "warning",
        ),
        ("    ECC Mode\n        Current : Enabled\n        Pending : Enabled", "ecc", "info"),
    ],
)
def test_single_nvidia_smi_ecc_fields_and_ecc_mode(text: str, kind: str, severity: str) -> None:
    event = classify_text(text)
    assert (event.kind, event.severity) == (kind, severity)
