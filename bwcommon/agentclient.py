"""The controller's side of one agent's channel: a persistent connection,
one request and its signed reply at a time (:mod:`bwcommon.channel` for
the messages, :mod:`bwcommon.transport` for the frames)."""

from __future__ import annotations

import select
import socket

from bwcommon.channel import ReplayGuard, Receiver, Sender
from bwcommon.transport import connect, recv_frame, send_frame


class AgentClient:
    def __init__(self, address: str, host: str, key: bytes, timeout: float = 10.0):
        self.address, self.host, self.timeout = address, host, timeout
        self.tx = Sender(key, host, direction="c2a")
        self.rx = Receiver(key, host, ReplayGuard(), direction="a2c")
        self.sock: socket.socket | None = None

    @property
    def connected(self) -> bool:
        return self.sock is not None

    def connect(self) -> None:
        if self.sock is None:
            self.sock = connect(self.address, self.timeout)

    def request(self, msg_type: str, body: dict) -> dict:
        return self.request_raw(self.tx.seal(msg_type, body))

    def request_raw(self, raw: bytes) -> dict:
        """Send one message, wait for its reply. Any failure closes the
        connection (the next request reconnects) and raises."""
        self.connect()
        try:
            send_frame(self.sock, raw)
            reply = recv_frame(self.sock, self.timeout, self.timeout)
            if reply is None:
                raise ConnectionError(f"agent {self.host} closed the connection")
            _, body = self.rx.open(reply)
        except BaseException:
            self.close()
            raise
        return body

    def peer_closed(self) -> bool:
        """Between requests nothing may arrive: a readable socket means the
        agent closed it (it restarted, or timed the connection out)."""
        if self.sock is None:
            return True
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            readable = [self.sock]
        if readable:
            self.close()
            return True
        return False

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None
