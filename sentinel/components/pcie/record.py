"""The PCIe link record: generation and width now vs the maximum the GPU and slot support."""

from __future__ import annotations

import msgspec


class PcieLink(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A link trained at x8 instead of x16 halves host↔GPU bandwidth: a slow GPU that looks healthy.

    The generation drops at idle to save power (that is normal); the width does not.
    """

    gen: int | None = None
    gen_max: int | None = None
    width: int | None = None
    width_max: int | None = None
