"""The ``Remapped Rows`` section of an ``nvidia-smi -q`` excerpt → the same :class:`RowRemap` NVML gives."""

from __future__ import annotations

from sentinel.components.nvsmi import count_value, read_sections, yes_no
from sentinel.components.rowremap.record import RowRemap

_LEVELS = ("max", "high", "partial", "low", "none")


def parse_row_remap(text: str) -> RowRemap | None:
    """Read the ``Remapped Rows`` section; ``None`` if there is none. ``N/A`` counts stay ``None``."""
    fields: dict[str, int | bool | None] = {}
    found = False
    for path, value in read_sections(text):
        if "remapped rows" not in path:
            continue
        found = True
        key = path[-1]
        if "histogram" in " ".join(path[:-1]):
            if key in _LEVELS:
                fields[f"hist_{key}"] = count_value(value)
        elif key.startswith("correctable"):
            fields["correctable"] = count_value(value)
        elif key.startswith("uncorrectable"):
            fields["uncorrectable"] = count_value(value)
        elif key.startswith("pending"):
            fields["pending"] = bool(yes_no(value))
        elif "failure" in key:
            fields["failure"] = bool(yes_no(value))
    if not found:
        return None
    return RowRemap(**fields)  # type: ignore[arg-type]
