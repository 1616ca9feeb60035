"""Single nvidia-smi row-remapping fields: the log classifier asks the rowremap component."""

from __future__ import annotations

import pytest

from sentinel.signals import classify_text


@pytest.mark.parametrize(
    ("text", "kind", "severity"),
    [
        ("        Remapping Failure Occurred        : Yes", "row_remap", "critical"),
        ("        Remapping Failure Occurred        : No", "row_remap", "info"),
    ],
)
def test_single_nvidia_smi_row_remap_fields(text: str, kind: str, severity: str) -> None:
    event = classify_text(text)
    assert (event.kind, event.severity) == (kind, severity)
