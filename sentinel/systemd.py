"""systemd notifications (sd_notify) over ``$NOTIFY_SOCKET``, without libsystemd.

``Type=notify`` units wait for ``READY=1``; with ``WatchdogSec=`` systemd restarts the service unless
``WATCHDOG=1`` arrives at least every ``$WATCHDOG_USEC``. Both daemons send WATCHDOG from their event loop
(not a thread), so a loop stuck on something gets the daemon restarted. ``STATUS=`` shows in ``systemctl status``.
An address starting with ``@`` is in the abstract namespace.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from sentinel.log import get_logger

log = get_logger(module="systemd")


class SystemdNotifier:
    """Sends datagrams to the notify socket; a no-op when not run by systemd."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        environ = os.environ if env is None else env
        address = environ.get("NOTIFY_SOCKET", "")
        self.address: str | None = None
        if address.startswith("@"):
            self.address = "\0" + address[1:]
        elif address.startswith("/"):
            self.address = address
        self.watchdog_s: float | None = None
        usec = environ.get("WATCHDOG_USEC", "")
        pid = environ.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_s = int(usec) / 1e6
        self._sock: socket.socket | None = None
        self.errors = 0

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def notify(self, *fields: str) -> bool:
        """Send ``KEY=value`` lines in one datagram; False when not possible (never raises)."""
        if self.address is None:
            return False
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto("\n".join(fields).encode(), self.address)
        except OSError as exc:
            self.errors += 1
            if self.errors <= 3:
                log.warning("sd_notify_failed", error=exc.strerror or str(exc))
            return False
        return True

    def ready(self, status: str = "") -> bool:
        return self.notify("READY=1", *([f"STATUS={status}"] if status else []))

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def status(self, text: str) -> bool:
        return self.notify(f"STATUS={text}")

    def stopping(self) -> bool:
        return self.notify("STOPPING=1")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
