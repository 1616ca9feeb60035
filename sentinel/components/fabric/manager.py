"""The NVIDIA fabric manager's service state, read by the agent on hosts that have NVSwitches.

The agent asks systemd (``systemctl show``) through a small injected :class:`UnitReader`; this module only
parses its answer, so the parser is fuzzed and the simulator answers for a simulated host. A host without
the unit (no NVSwitch, no fabric manager installed) reports nothing: only a present unit is judged.
"""

from __future__ import annotations

import subprocess
from typing import Final, Protocol

import msgspec

from sentinel.components.fabric.record import FabricManagerStatus
from sentinel.text import bounded

UNIT: Final = "nvidia-fabricmanager.service"
#: ``systemctl show`` properties read, one ``Name=value`` line each
PROPERTIES: Final = ("LoadState", "ActiveState", "SubState")
#: how long the agent waits for systemctl
TIMEOUT_S: Final = 5.0
MAX_VALUE: Final = 32


class UnitState(msgspec.Struct, frozen=True, kw_only=True):
    """A unit as ``systemctl show`` describes it (``""`` where it did not say)."""

    load: str = ""
    active: str = ""
    sub: str = ""

    @property
    def present(self) -> bool:
        """The unit file exists (``LoadState=loaded``; ``not-found`` on a host without it)."""
        return self.load == "loaded"

    @property
    def absent(self) -> bool:
        """systemd answered and has no such unit (not a failed read: that says nothing)."""
        return self.load == "not-found"

    @property
    def running(self) -> bool:
        return self.active == "active" and self.sub in ("running", "")


class UnitReader(Protocol):
    """Where the unit's ``systemctl show`` text comes from (systemd, or a simulated host)."""

    def show(self, unit: str) -> str: ...


def parse_show(text: str) -> UnitState:
    """``systemctl show -p LoadState,ActiveState,SubState`` output → :class:`UnitState`; lines it does not
    know, and values that are not short words, are ignored."""
    values: dict[str, str] = {}
    for line in bounded(text).splitlines():
        name, sep, value = line.partition("=")
        value = value.strip()
        if sep and name in PROPERTIES and len(value) <= MAX_VALUE and value.replace("-", "").isalnum():
            values.setdefault(name, value)
    return UnitState(
        load=values.get("LoadState", ""), active=values.get("ActiveState", ""), sub=values.get("SubState", "")
    )


def status_after(previous: FabricManagerStatus | None, unit: UnitState, now: float) -> FabricManagerStatus:
    """The status to ship for ``unit`` read at ``now``: ``since`` moves only when the state changes."""
    state = f"{unit.active or '?'}/{unit.sub or '?'}"
    if previous is not None and previous.state == state and previous.present == unit.present:
        return previous
    return FabricManagerStatus(present=unit.present, running=unit.running, state=state, since=now)


#: systemctl's environment: none of the agent's (``NOTIFY_SOCKET`` would let its own sd_notify reach the
#: agent's service manager on failure)
_ENV: Final = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "LC_ALL": "C", "SYSTEMD_PAGER": ""}


class Systemctl:
    """:class:`UnitReader` over ``systemctl show`` (no shell, a clean environment, a deadline, its failure
    an empty answer)."""

    def show(self, unit: str) -> str:
        try:
            done = subprocess.run(
                ["systemctl", "show", unit, "--no-pager", "-p", ",".join(PROPERTIES)],
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
                check=False,
                env=_ENV,
            )
        except (OSError, subprocess.SubprocessError):
            return ""
        return done.stdout
