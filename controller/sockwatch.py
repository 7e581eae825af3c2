"""One thread that watches the idle agent connections for the agent
closing them (it restarted, or timed the connection out).

Between requests nothing may arrive on a session's socket, so a readable
socket means the peer closed it. Each session used to look at its socket
every 50 ms: at 1000 agents that is 20 000 thread wake-ups a second with no
push to make. Instead an idle session hands its socket to this watcher (an
epoll set, :mod:`selectors`) and sleeps until its next status request; the
watcher wakes it when the socket turns readable, and forgets the socket
(one event per hand-over: a session that works on its socket takes it back
first, and a reply it reads never reaches the watcher).
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
from typing import Callable

log = logging.getLogger("bwfabric.agents")


class WakeableSelector:
    """An epoll set (:mod:`selectors`) with a wake-up socket registered
    under ``None``: :meth:`wake` makes a ``select`` return, :meth:`drained`
    takes the wake-up's bytes when its key comes back."""

    def __init__(self):
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)

    def wake(self) -> None:
        self._wake_w.send(b"\0")

    def drained(self, key) -> bool:
        """Whether ``key`` is the wake-up's (its bytes then read)."""
        if key.data is not None:
            return False
        try:
            self._wake_r.recv(4096)
        except BlockingIOError:
            pass
        return True


def process_singleton(cls):
    """A function returning the process's one ``cls()``, made on first call."""
    lock = threading.Lock()
    made: list = []

    def get():
        with lock:
            if not made:
                made.append(cls())
            return made[0]
    get.__doc__ = f"The process's {cls.__name__}, started on first use."
    return get


class IdleWatch(WakeableSelector):
    def __init__(self):
        super().__init__()
        self._lock = threading.Lock()
        self.events = 0                   # sockets found readable (closed by their peer, or a stray byte)
        self.errors = 0
        self._thread = threading.Thread(target=self._run, name="agent-sockwatch", daemon=True)
        self._thread.start()

    def watch(self, sock: socket.socket, on_readable: Callable[[], None]) -> None:
        """Call ``on_readable()`` once, from the watcher's thread, when
        ``sock`` turns readable (at once if it already is), unless
        :meth:`unwatch` comes first. Watching a socket again replaces the
        callback."""
        with self._lock:
            try:
                self._sel.register(sock, selectors.EVENT_READ, on_readable)
            except KeyError:                       # already watched
                self._sel.modify(sock, selectors.EVENT_READ, on_readable)
            except (ValueError, OSError):          # closed meanwhile: readable as far as anyone cares
                on_readable()
                return
        self.wake()                                # a selector that is not epoll picks it up now

    def unwatch(self, sock: socket.socket | None) -> None:
        if sock is None:
            return
        with self._lock:
            try:
                self._sel.unregister(sock)
            except (KeyError, ValueError, OSError):
                pass

    def watching(self) -> int:
        with self._lock:
            return len(self._sel.get_map()) - 1

    def _run(self) -> None:
        while True:
            try:
                ready = self._sel.select()
            except (OSError, ValueError) as exc:   # a socket closed under the selector: go round again
                self.errors += 1
                log.debug("idle-socket watch: %s", exc)
                continue
            for key, _ in ready:
                if self.drained(key):
                    continue
                with self._lock:
                    current = self._sel.get_map().get(key.fd)
                    if current is None or current.data is not key.data:
                        continue                   # taken back (or handed over anew) meanwhile
                    self._sel.unregister(key.fileobj)
                self.events += 1
                try:
                    key.data()
                except Exception:                  # noqa: BLE001 - one session's callback never stops the watch
                    self.errors += 1
                    log.exception("idle-socket watch: a callback failed")


idle_watch = process_singleton(IdleWatch)
