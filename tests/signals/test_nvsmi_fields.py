"""Single nvidia-smi fields classified as row-remap / ECC events."""

from __future__ import annotations

import pytest

from sentinel.signals import classify_text


@pytest.mark.parametrize(
    ("text", "kind", "severity"),
    [
        ("        Remapping Failure Occurred        : Yes", "row_remap", "critical"),
        ("        Remapping Failure Occurred        : No", "row_remap", "info"),
        ("        Pending Page Blacklist    : Yes", "ecc", "warning"),
        (
            "    ECC Mode\n        Current                           : Enabled\n        Pending                           : Disabled",
            "ecc",
            "warning",
        ),
        ("    ECC Mode\n        Current : Enabled\n        Pending : Enabled", "ecc", "info"),
    ],
)
def test_single_nvidia_smi_fields_and_ecc_mode(text: str, kind: str, severity: str) -> None:
    event = classify_text(text)
    assert (event.kind, event.severity) == (kind, severity)
