"""The typed readiness record: one entry per setting, shipped with each rank's process info."""

from __future__ import annotations

from typing import Literal

import msgspec

SettingState = Literal["on", "off", "default_on", "default_off"]


class DebugSetting(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One setting as the rank runs with it: ``ok`` when it helps diagnose a stall."""

    name: str  # flight_recorder, async_error_handling, dump_on_timeout, debug_info_pipe, nccl_debug, ...
    state: SettingState
    ok: bool
    value: str = ""  # the environment value (cut), empty when unset


class DebugReadiness(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Every setting of one rank; ``ready`` when all are ok."""

    settings: list[DebugSetting] = []

    @property
    def ready(self) -> bool:
        return all(s.ok for s in self.settings)

    @property
    def missing(self) -> list[str]:
        return [s.name for s in self.settings if not s.ok]
