"""The idle-socket watch (controller/sockwatch.py): a watched socket's
callback runs once when the socket turns readable (its peer closed it),
never after it was taken back, at once for a socket already closed; many
threads handing sockets over at once each get their one call."""

from __future__ import annotations

import socket
import threading
import time

from controller.sockwatch import IdleWatch
from tests.unit.agents_inprocess import until


def test_a_watched_socket_is_reported_once_when_its_peer_closes():
    w = IdleWatch()
    a, b = socket.socketpair()
    calls = []
    w.watch(a, lambda: calls.append("a"))
    time.sleep(0.05)
    assert calls == [] and w.watching() == 1
    b.close()
    assert until(lambda: calls == ["a"])
    time.sleep(0.05)
    assert calls == ["a"] and w.watching() == 0 and w.events == 1      # forgotten after its one event
    a.close()


def test_a_socket_taken_back_is_not_reported_and_a_closed_one_is_at_once():
    w = IdleWatch()
    a, b = socket.socketpair()
    calls = []
    w.watch(a, lambda: calls.append("a"))
    w.unwatch(a)
    b.close()
    time.sleep(0.1)
    assert calls == [] and w.watching() == 0
    a.close()
    w.watch(a, lambda: calls.append("closed"))      # closed under us: readable as far as anyone cares
    assert calls == ["closed"]
    w.unwatch(None)


def test_a_failing_callback_is_counted_and_the_watch_goes_on():
    w = IdleWatch()
    pairs = [socket.socketpair() for _ in range(2)]
    got = []
    w.watch(pairs[0][0], lambda: 1 / 0)
    w.watch(pairs[1][0], lambda: got.append(1))
    for _, b in pairs:
        b.close()
    assert until(lambda: got == [1] and w.errors == 1)


def test_racing_hand_overs_each_get_their_one_call():
    w = IdleWatch()
    n, threads = 200, 8
    pairs = [socket.socketpair() for _ in range(n)]
    counts = [0] * n
    lock = threading.Lock()

    def bump(i):
        with lock:
            counts[i] += 1

    def hand_over(part):
        for i in part:
            a = pairs[i][0]
            w.watch(a, lambda i=i: bump(i))
            w.unwatch(a)                              # taken back at once ...
            w.watch(a, lambda i=i: bump(i))           # ... and handed over again
    ts = [threading.Thread(target=hand_over, args=(range(k, n, threads),)) for k in range(threads)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert w.watching() == n
    for _, b in pairs:
        b.close()
    assert until(lambda: sum(counts) == n)
    time.sleep(0.05)
    assert counts == [1] * n and w.watching() == 0
    for a, _ in pairs:
        a.close()
