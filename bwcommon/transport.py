"""The agent channel's transport: length-prefixed frames over a stream
socket (``unix:/path`` or ``tcp:ADDR:PORT``), and a server loop that a
hostile peer cannot stop.

- A frame is a 4-byte big-endian length and that many bytes, at most
  ``MAX_FRAME``; a longer announced length closes the connection before
  anything is read.
- Timeouts: a frame must arrive whole within ``frame_timeout_s`` once its
  first byte has; a connection that has not sent a complete frame within
  ``first_frame_timeout_s`` of being accepted, or that stays idle for
  ``idle_timeout_s`` between frames, is closed. A peer holding a partial
  frame or an idle socket open therefore costs a slot for seconds, not
  forever.
- At most ``max_connections`` connections are served at once; the next one
  is accepted and closed at once (counted), so a flood cannot exhaust the
  agent's threads or descriptors.
- The accept loop survives every error (EMFILE/ENFILE when descriptors run
  out, ECONNABORTED, anything else): it logs, counts, backs off briefly and
  accepts again. It returns only when ``stop`` is set.
- TCP listeners bind to the address given, which must be given: there is no
  0.0.0.0 default (``tcp:0.0.0.0:PORT`` must be written out to mean it).

Everything a connection handler raises is caught, logged and counted; the
connection is closed, the server goes on.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

MAX_FRAME = 256 * 1024            # a 512-pair configuration is ~30 KB
log = logging.getLogger("bwfabric.agent")


class FrameError(ValueError):
    pass


def send_frame(sock: socket.socket, payload: bytes) -> None:
    if len(payload) > MAX_FRAME:
        raise FrameError(f"frame of {len(payload)} bytes exceeds {MAX_FRAME}")
    sock.sendall(struct.pack("!I", len(payload)) + payload)


def recv_frame(sock: socket.socket, frame_timeout_s: float | None = None,
               idle_timeout_s: float | None = None) -> bytes | None:
    """One frame, or None when the peer closed cleanly between frames.
    Raises FrameError (too large, cut short) or socket.timeout."""
    sock.settimeout(idle_timeout_s)
    first = sock.recv(1)
    if not first:
        return None
    sock.settimeout(frame_timeout_s)
    deadline = None if frame_timeout_s is None else time.monotonic() + frame_timeout_s
    hdr = first + _recv_exact(sock, 3, deadline)
    (n,) = struct.unpack("!I", hdr)
    if n > MAX_FRAME:
        raise FrameError(f"announced frame of {n} bytes exceeds {MAX_FRAME}")
    return _recv_exact(sock, n, deadline)


def _recv_exact(sock: socket.socket, n: int, deadline: float | None) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("frame not complete in time")
            sock.settimeout(left)
        chunk = sock.recv(min(65536, n - len(buf)))
        if not chunk:
            raise FrameError(f"connection closed inside a frame ({len(buf)} of {n} bytes)")
        buf += chunk
    return bytes(buf)


def parse_address(address: str) -> tuple[str, object]:
    """("unix", path) or ("tcp", (host, port)); refuses what is not explicit."""
    if not isinstance(address, str):
        raise ValueError(f"address {address!r}: use unix:/path or tcp:ADDR:PORT")
    kind, _, rest = address.partition(":")
    if kind == "unix":
        if not rest.startswith("/"):
            raise ValueError(f"address {address!r}: a unix socket needs an absolute path")
        return "unix", rest
    if kind == "tcp":
        host, _, port = rest.rpartition(":")
        host = host.strip("[]")
        if not host:
            raise ValueError(f"address {address!r}: name the address to bind or reach (tcp:ADDR:PORT); "
                             "there is no all-interfaces default")
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"address {address!r}: port must be 1..65535")
        return "tcp", (host, int(port))
    raise ValueError(f"address {address!r}: use unix:/path or tcp:ADDR:PORT")


def listen(address: str, backlog: int = 64) -> socket.socket:
    kind, target = parse_address(address)
    if kind == "unix":
        path = Path(target)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            path.unlink()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)       # the socket is created 0600, never world-reachable for an instant
        try:
            s.bind(str(path))
        finally:
            os.umask(old)
    else:
        host, port = target
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        s = socket.socket(family, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
    s.listen(backlog)
    return s


def connect(address: str, timeout: float = 5.0) -> socket.socket:
    kind, target = parse_address(address)
    if kind == "unix":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    else:
        s = socket.socket(socket.AF_INET6 if ":" in target[0] else socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(target)
    return s


@dataclass
class ServerStats:
    accepted: int = 0
    refused_busy: int = 0          # over max_connections: closed at once
    accept_errors: int = 0
    handler_errors: int = 0
    timeouts: int = 0
    bad_frames: int = 0
    active: int = 0
    last_error: str | None = None


@dataclass
class FrameServer:
    """Serves ``handler(frame) -> reply frame`` on every connection."""
    handler: Callable[[bytes], bytes]
    max_connections: int = 16
    first_frame_timeout_s: float = 10.0
    frame_timeout_s: float = 10.0
    idle_timeout_s: float = 300.0
    stats: ServerStats = field(default_factory=ServerStats)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()

    def close_all(self) -> None:
        """Close every open connection (shutting down: peers see it at once)."""
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def serve(self, server: socket.socket) -> None:
        server.settimeout(0.5)      # so that ``stop`` is seen
        backoff = 0.01
        while not self.stop.is_set():
            try:
                conn, _ = server.accept()
            except socket.timeout:
                continue
            except OSError as exc:
                if self.stop.is_set():
                    return
                self.stats.accept_errors += 1
                self.stats.last_error = f"accept: {exc}"
                log.warning("accept failed (%s); retrying in %.2f s", exc, backoff)
                time.sleep(backoff)
                backoff = min(1.0, backoff * 2)
                continue
            except Exception as exc:  # noqa: BLE001 - the accept loop never returns on an error
                self.stats.accept_errors += 1
                self.stats.last_error = f"accept: {type(exc).__name__}: {exc}"
                log.exception("accept loop")
                time.sleep(backoff)
                continue
            backoff = 0.01
            if not self._slots.acquire(blocking=False):
                self.stats.refused_busy += 1
                _close(conn)
                continue
            self.stats.accepted += 1
            try:
                threading.Thread(target=self._connection, args=(conn,), daemon=True).start()
            except Exception as exc:  # noqa: BLE001 - e.g. no more threads: drop this one, go on
                self._slots.release()
                self.stats.accept_errors += 1
                self.stats.last_error = f"thread: {exc}"
                _close(conn)

    def _connection(self, conn: socket.socket) -> None:
        with self._lock:
            self.stats.active += 1
            self._conns.add(conn)
        try:
            idle = self.first_frame_timeout_s
            while not self.stop.is_set():
                raw = recv_frame(conn, self.frame_timeout_s, idle)
                if raw is None:
                    return
                send_frame(conn, self.handler(raw))
                idle = self.idle_timeout_s
        except socket.timeout:
            self.stats.timeouts += 1
        except FrameError as exc:
            self.stats.bad_frames += 1
            log.info("connection closed: %s", exc)
        except OSError as exc:
            log.info("connection closed: %s", exc)
        except Exception as exc:  # noqa: BLE001 - a handler bug closes one connection, nothing else
            self.stats.handler_errors += 1
            self.stats.last_error = f"handler: {type(exc).__name__}: {exc}"
            log.exception("connection handler")
        finally:
            _close(conn)
            with self._lock:
                self.stats.active -= 1
                self._conns.discard(conn)
            self._slots.release()


def _close(conn: socket.socket) -> None:
    try:
        conn.close()
    except OSError:
        pass
