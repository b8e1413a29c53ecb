"""systemd's notify protocol without a dependency: datagrams to ``$NOTIFY_SOCKET``.

``READY=1`` once the first collection has run, ``WATCHDOG=1`` every half ``$WATCHDOG_USEC`` while the sampling
loop makes progress (a stuck loop stops the pings and systemd restarts the service), ``STOPPING=1`` on shutdown.
Outside systemd (no ``$NOTIFY_SOCKET``) every call does nothing.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger(__name__)


class Notifier:
    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        # An abstract socket is written with a leading '@' and addressed with a leading NUL byte.
        self._address = "\0" + address[1:] if address.startswith("@") else address
        self._sock: socket.socket | None = None
        self.watchdog_interval: float | None = None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_interval = int(usec) / 1e6 / 2
        self._last_ping: float | None = None

    @property
    def enabled(self) -> bool:
        return bool(self._address)

    def send(self, message: str) -> bool:
        if not self._address:
            return False
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(message.encode(), self._address)
            return True
        except OSError as exc:
            log.warning("systemd notify failed: %s", exc)
            return False

    def ready(self) -> None:
        self.send("READY=1")

    def stopping(self) -> None:
        self.send("STOPPING=1")

    def status(self, text: str) -> None:
        self.send(f"STATUS={text}")

    def watchdog(self, now: float) -> None:
        """Ping if half the watchdog period has passed since the last ping; ``now`` is monotonic seconds."""
        if self.watchdog_interval is None:
            return
        if self._last_ping is None or now - self._last_ping >= self.watchdog_interval:
            self._last_ping = now
            self.send("WATCHDOG=1")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
