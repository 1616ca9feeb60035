"""``ECC Errors`` and ``Retired Pages`` sections of ``nvidia-smi -q`` excerpts → the records NVML gives."""

from __future__ import annotations

from sentinel.components.ecc.record import EccCounters, RetiredPages
from sentinel.components.nvsmi import count_value, read_sections, yes_no


def parse_ecc(text: str) -> EccCounters | None:
    """Read the ``ECC Errors`` section of an ``nvidia-smi -q`` excerpt; ``None`` if there is none.

    Understands the Ampere+ layout (``SRAM Correctable``, ``DRAM Uncorrectable``, ...) and the older one
    (``Single Bit`` / ``Double Bit`` with a ``Total`` line).
    """
    scopes: dict[str, dict[str, dict[str, int]]] = {"volatile": {}, "aggregate": {}}
    threshold: bool | None = None
    found = False
    for path, value in read_sections(text):
        if "ecc errors" not in path:
            continue
        found = True
        key = path[-1]
        if "threshold exceeded" in key:
            threshold = yes_no(value)
            continue
        scope = "volatile" if "volatile" in path else "aggregate" if "aggregate" in path else None
        if scope is None:
            continue
        count = count_value(value)
        if count is None:
            continue
        joined = " ".join(path)
        corrected = "single bit" in joined or (" correctable" in f" {key}" and "uncorrectable" not in key)
        location = "sram" if "sram" in key else "dram" if "dram" in key else "total"
        if "single bit" in joined or "double bit" in joined:
            if key != "total":
                continue
            location = "total"
        field = "corrected" if corrected else "uncorrected"
        bucket = scopes[scope].setdefault(location, {})
        bucket[field] = bucket.get(field, 0) + count
    if not found:
        return None

    def get(scope: str, location: str, field: str) -> int | None:
        return scopes[scope].get(location, {}).get(field)

    def total(scope: str, field: str) -> int | None:
        explicit = get(scope, "total", field)
        if explicit is not None:
            return explicit
        return _sum(get(scope, "sram", field), get(scope, "dram", field))

    return EccCounters(
        volatile_corrected=total("volatile", "corrected"),
        volatile_uncorrected=total("volatile", "uncorrected"),
        aggregate_corrected=total("aggregate", "corrected"),
        aggregate_uncorrected=total("aggregate", "uncorrected"),
        volatile_sram_uncorrected=get("volatile", "sram", "uncorrected"),
        volatile_dram_uncorrected=get("volatile", "dram", "uncorrected"),
        sram_uncorrected=get("aggregate", "sram", "uncorrected"),
        dram_uncorrected=get("aggregate", "dram", "uncorrected"),
        sram_threshold_exceeded=threshold,
    )


def _sum(*values: int | None) -> int | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def parse_retired_pages(text: str) -> RetiredPages | None:
    """Read the ``Retired Pages`` section of an ``nvidia-smi -q`` excerpt; ``None`` if there is none."""
    fields: dict[str, object] = {}
    found = False
    for path, value in read_sections(text):
        if "retired pages" not in path:
            continue
        found = True
        key = path[-1]
        if key.startswith("single bit"):
            fields["single_bit"] = count_value(value)
        elif key.startswith("double bit"):
            fields["double_bit"] = count_value(value)
        elif key.startswith("pending"):
            fields["pending"] = yes_no(value)
    if not found:
        return None
    return RetiredPages(**fields)  # type: ignore[arg-type]
