"""systemd ``sd_notify``: READY/STATUS/WATCHDOG datagrams to ``$NOTIFY_SOCKET``.

The protocol is one ``KEY=VALUE`` line per field in a single datagram to a unix
socket (``@`` = abstract namespace). Outside systemd (no ``NOTIFY_SOCKET``) every
call is a no-op, and a failed send is never fatal to the daemon.
"""

from __future__ import annotations

import socket


class Notifier:
    """Send notifications to the socket named at construction (or nowhere)."""

    def __init__(self, socket_path: str | None) -> None:
        self._addr: str | None = None
        if socket_path:
            self._addr = "\0" + socket_path[1:] if socket_path.startswith("@") else socket_path

    @property
    def enabled(self) -> bool:
        return self._addr is not None

    def notify(self, **fields: str | int) -> bool:
        """Send ``KEY=VALUE`` lines (keys upper-cased); True if sent."""
        if self._addr is None:
            return False
        payload = "\n".join(f"{k.upper()}={v}" for k, v in fields.items()).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.sendto(payload, self._addr)
        except OSError:
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.notify(ready=1, status=status)

    def status(self, status: str) -> bool:
        return self.notify(status=status)

    def watchdog(self) -> bool:
        return self.notify(watchdog=1)

    def stopping(self) -> bool:
        return self.notify(stopping=1)
