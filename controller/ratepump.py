"""One thread that sends LRC's rate factors to the idle agent sessions and
reads their replies, many in flight at once.

A session's own thread pushes configurations and asks for status, one
blocking request at a time; that is what a session needs for those, rare
as they are. Rate factors are different: every agent, every τ_r (100 ms).
Through the sessions' threads each push cost two thread wake-ups and a
blocking read among a thousand threads contending for the interpreter:
0.45 ms of controller CPU a push at 1 000 agents (docs/results.md), so
one process could not push every 100 ms to more than ~200 agents.

So a session whose socket is idle (its thread asleep, the socket in the
idle watch, :mod:`controller.sockwatch`) *lends* the socket to this pump
when new factors arrive. The pump seals the message with the session's
channel (its sequence numbers: nobody else uses the channel meanwhile),
writes it, and reads the reply as it comes, without blocking, from one
epoll set for all sessions. With the reply in, the session's state is
updated under its lock exactly as its own thread would
(:meth:`Session._rates_reply`); if newer factors arrived meanwhile they
go out at once (the latest-value slot is unchanged); otherwise the socket
goes back to the idle watch, the session's thread never having woken.
Anything else the session must do (a configuration, a status read that is
due) ends the loan and wakes its thread. A failure (the agent closed the
connection, sent garbage, did not answer within the session's timeout)
ends the loan too: the thread closes the connection and reconnects, as it
does for a failure of its own.
"""

from __future__ import annotations

import collections
import logging
import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

from bwcommon.transport import MAX_FRAME
from controller.sockwatch import WakeableSelector, process_singleton

log = logging.getLogger("bwfabric.agents")


@dataclass(eq=False)
class _Job:
    session: object
    sock: socket.socket
    out: bytes
    deadline: float
    rates: dict
    token: float | None
    fd: int = -1
    inbuf: bytearray = field(default_factory=bytearray)


class RatePump(WakeableSelector):
    def __init__(self):
        super().__init__()
        self._lock = threading.Lock()
        self._queue: collections.deque = collections.deque()
        self._jobs: dict[int, _Job] = {}          # fd -> the request in flight on it
        self.sent = 0                             # requests written
        self.replies = 0                          # replies taken
        self.failures = 0                         # loans ended by a failure (the session reconnects)
        self.errors = 0                           # bugs caught (logged with their traceback)
        self._thread = threading.Thread(target=self._run, name="agent-ratepump", daemon=True)
        self._thread.start()

    def submit(self, session) -> None:
        """``session`` has lent its socket (``session.lent``): send its
        pending factors."""
        with self._lock:
            self._queue.append(session)
        self.wake()

    def in_flight(self) -> int:
        with self._lock:
            return len(self._jobs)

    # ---- the pump's thread ----------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            try:
                self._round()
            except Exception:                     # noqa: BLE001 - the pump outlives any one bug
                self.errors += 1
                log.exception("rate pump: a round failed")
                time.sleep(0.01)

    def _round(self) -> None:
        with self._lock:
            waiting = list(self._queue)
            self._queue.clear()
        for s in waiting:
            self._guarded(self._start, s)
        now = time.monotonic()
        timeout = min((j.deadline for j in self._jobs.values()), default=now + 1.0) - now
        for key, mask in self._sel.select(max(0.0, timeout)):
            if self.drained(key):
                continue
            job = key.data
            if mask & selectors.EVENT_WRITE:
                self._guarded(self._write, job)
            if mask & selectors.EVENT_READ and self._jobs.get(job.fd) is job:
                self._guarded(self._read, job)
        now = time.monotonic()
        for job in [j for j in self._jobs.values() if j.deadline <= now]:
            self._fail(job, f"TimeoutError: no reply to rates within {job.session.client.timeout:g} s")

    def _guarded(self, step, arg) -> None:
        """A step for one session; a bug in it ends that session's loan
        (logged, counted), never the pump."""
        try:
            step(arg)
        except Exception as exc:                  # noqa: BLE001
            self.errors += 1
            log.exception("rate pump: %s failed", step.__name__)
            job = arg if isinstance(arg, _Job) else None
            if job is not None:
                self._fail(job, f"internal error: {exc}")
            else:
                arg.end_loan(f"internal error: {exc}")

    def _start(self, s) -> None:
        """Seal the session's pending factors and start writing them."""
        taken = s.take_rates()
        if taken is None:                         # nothing to send after all (or the loan must end)
            return
        rates, token = taken
        sock = s.client.sock
        raw = s.client.tx.seal("rates", {"generation": s.generation, **rates})
        if len(raw) > MAX_FRAME:
            s.end_loan(f"FrameError: frame of {len(raw)} bytes exceeds {MAX_FRAME}", rates, token)
            return
        job = _Job(s, sock, struct.pack("!I", len(raw)) + raw, time.monotonic() + s.client.timeout, rates, token,
                   sock.fileno())
        sock.setblocking(False)
        self._jobs[job.fd] = job
        self._sel.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, job)
        self._write(job)

    def _write(self, job: _Job) -> None:
        if not job.out:
            return
        try:
            n = job.sock.send(job.out)
        except BlockingIOError:
            return
        except OSError as exc:
            self._fail(job, f"{type(exc).__name__}: {exc}")
            return
        job.out = job.out[n:]
        if not job.out:
            self.sent += 1
            self._sel.modify(job.sock, selectors.EVENT_READ, job)

    def _read(self, job: _Job) -> None:
        try:
            chunk = job.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError as exc:
            self._fail(job, f"{type(exc).__name__}: {exc}")
            return
        if not chunk:
            self._fail(job, f"ConnectionError: agent {job.session.endpoint.host} closed the connection")
            return
        job.inbuf += chunk
        if len(job.inbuf) < 4:
            return
        (n,) = struct.unpack("!I", job.inbuf[:4])
        if n > MAX_FRAME:
            self._fail(job, f"FrameError: announced frame of {n} bytes exceeds {MAX_FRAME}")
            return
        if len(job.inbuf) < 4 + n:
            return
        if job.out or len(job.inbuf) > 4 + n:     # a reply before the request was written, or more than one
            self._fail(job, "FrameError: the agent sent more than the one reply asked for")
            return
        try:
            _, body = job.session.client.rx.open(bytes(job.inbuf[4:]))
        except Exception as exc:                  # noqa: BLE001 - ChannelError and whatever else a bad reply raises
            self._fail(job, f"{type(exc).__name__}: {exc}")
            return
        self._release(job)
        self.replies += 1
        if job.session.rates_replied(body, job.token):
            self._start(job.session)             # newer factors waiting: the loan goes on

    def _release(self, job: _Job) -> None:
        """The socket out of the pump's set, blocking again as the session's
        thread uses it."""
        self._jobs.pop(job.fd, None)
        try:
            self._sel.unregister(job.sock)
        except (KeyError, ValueError, OSError):
            pass
        try:
            job.sock.settimeout(job.session.client.timeout)
        except OSError:
            pass

    def _fail(self, job: _Job, why: str) -> None:
        self._release(job)
        self.failures += 1
        job.session.end_loan(why, job.rates, job.token)


rate_pump = process_singleton(RatePump)
