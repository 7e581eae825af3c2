"""The rate pump (controller/ratepump.py): one thread sends the idle
sessions' rate factors and reads the replies without blocking.

Framing and failures against a peer the test writes byte by byte (a
socketpair and the real channel); the sessions' side against real agents
(tests.unit.agents_inprocess): factors go out without waking the session's
thread, the latest value wins, and a hung, closing or garbling agent ends
the loan and the session reconnects; configurations, status reads and
factors from racing threads never interleave on one channel."""

from __future__ import annotations

import copy
import logging
import socket
import struct
import threading
import time

import pytest

from bwcommon.channel import ReplayGuard, Receiver, Sender
from bwcommon.transport import MAX_FRAME
from controller import config
from controller.agent_sessions import AgentSessions
from controller.ratepump import RatePump
from tests.unit.agents_inprocess import LocalAgent, fabric_data, until

KEY = bytes(range(32, 64))


class _Client:
    def __init__(self, sock, timeout):
        self.sock, self.timeout = sock, timeout
        self.tx = Sender(KEY, "h1", direction="c2a")
        self.rx = Receiver(KEY, "h1", ReplayGuard(), direction="a2c")


class _Endpoint:
    host = "h1"


class _Session:
    """What the pump asks of a session, recorded."""

    def __init__(self, sock, timeout=2.0, rates=({"factors": {"a": 1}},)):
        self.client = _Client(sock, timeout)
        self.generation = 7
        self.endpoint = _Endpoint()
        self.pending = list(rates)
        self.replies, self.ended = [], []

    def take_rates(self):
        return (self.pending.pop(0), 1.5) if self.pending else None

    def rates_replied(self, body, token):
        self.replies.append((body, token))
        return bool(self.pending)

    def end_loan(self, why, rates=None, token=None):
        self.ended.append((why, rates, token))


def _agent_side(peer):
    """(read the pump's request frame, a function sealing a reply)."""
    peer.settimeout(5)
    hdr = peer.recv(4)
    (n,) = struct.unpack("!I", hdr)
    raw = b""
    while len(raw) < n:
        raw += peer.recv(n - len(raw))
    rx = Receiver(KEY, "h1", ReplayGuard(), direction="c2a")
    tx = Sender(KEY, "h1", direction="a2c")
    return rx.open(raw), lambda body: tx.seal("rates", body)


def _frame(raw):
    return struct.pack("!I", len(raw)) + raw


def test_a_reply_written_byte_by_byte_is_taken_and_the_next_factors_go_out():
    pump = RatePump()
    a, b = socket.socketpair()
    s = _Session(a, rates=({"factors": {"a": 1}}, {"factors": {"a": 2}}))
    pump.submit(s)
    (mtype, body), seal = _agent_side(b)
    assert (mtype, body) == ("rates", {"generation": 7, "factors": {"a": 1}})
    for byte in _frame(seal({"ok": True, "n": 1})):
        b.send(bytes([byte]))
        time.sleep(0.001)
    assert until(lambda: len(s.replies) == 1)
    assert s.replies[0][0]["n"] == 1 and s.replies[0][1] == 1.5
    (_, body2), _ = _agent_side(b)                  # the loan went on: the newer factors, at once
    assert body2["factors"] == {"a": 2}
    b.sendall(_frame(seal({"ok": True, "n": 2})))
    assert until(lambda: len(s.replies) == 2) and s.ended == []
    assert until(lambda: pump.in_flight() == 0)
    assert a.gettimeout() == 2.0                    # blocking again, as the session's thread uses it
    assert (pump.sent, pump.replies, pump.failures, pump.errors) == (2, 2, 0, 0)


@pytest.mark.parametrize("answer,why", [
    (lambda seal: b"", "closed the connection"),
    (lambda seal: struct.pack("!I", MAX_FRAME + 1), "exceeds"),
    (lambda seal: _frame(b"not a sealed message"), "Error"),
    (lambda seal: _frame(seal({"ok": True})) + b"\0", "more than the one reply"),
    (lambda seal: _frame(seal({"ok": True}))[:-3], "no reply to rates within 0.3 s"),
])
def test_a_bad_or_missing_reply_ends_the_loan_with_the_factors_kept(answer, why):
    pump = RatePump()
    a, b = socket.socketpair()
    s = _Session(a, timeout=0.3 if "no reply" in why else 30.0)    # only the time-out case waits for it
    pump.submit(s)
    _, seal = _agent_side(b)
    data = answer(seal)
    if data:
        b.sendall(data)
    else:
        b.close()
    assert until(lambda: s.ended)
    (reason, rates, token), = s.ended
    assert why in reason and rates == {"factors": {"a": 1}} and token == 1.5
    assert s.replies == [] and pump.failures == 1 and pump.in_flight() == 0 and pump.errors == 0


def test_a_bug_in_one_session_ends_its_loan_and_not_the_pump():
    pump = RatePump()
    a, b = socket.socketpair()
    broken = _Session(a)
    broken.take_rates = lambda: 1 / 0
    pump.submit(broken)
    assert until(lambda: broken.ended)
    assert "internal error" in broken.ended[0][0] and pump.errors == 1
    c, d = socket.socketpair()
    s = _Session(c)
    pump.submit(s)
    _, seal = _agent_side(d)
    d.sendall(_frame(seal({"ok": True})))
    assert until(lambda: len(s.replies) == 1)


# ---- sessions against real agents ----------------------------------------------------------------

@pytest.fixture
def fabric(tmp_path):
    # a reply may take long on a loaded machine (CI, a mutation pass): only the hung-agent test times out
    data = fabric_data(tmp_path, {"vh1": {"host": "h1", "guarantee_mbps": 2}}, status_interval_s=60,
                       request_timeout_s=30)
    agent = LocalAgent(tmp_path, "h1").start()
    made = []

    def make(request_timeout_s=None):
        s = AgentSessions(1000)
        made.append(s)
        d = copy.deepcopy(data)
        if request_timeout_s is not None:
            d["agents"]["request_timeout_s"] = request_timeout_s
        loaded = config.from_data(d)
        s.start(loaded, version=1)
        return s, loaded
    yield agent, make, data
    for s in made:
        s.stop()
    agent.stop()


def _idle(session):
    """Connected, configured, status read, its socket in the idle watch."""
    return until(lambda: session.watched is not None and session.st.version_in_force == 1
                  and session.st.status_at is not None)


def test_factors_to_an_idle_session_go_through_the_pump_without_waking_its_thread(fabric):
    from controller.ratepump import rate_pump
    agent, make, _ = fabric
    sessions, loaded = make()
    s = sessions.session("h1")
    assert _idle(s)
    rounds, replies = s.guard.stats["session"].rounds, rate_pump().replies
    for i in range(50):
        s.push_rates({"factors": {"i": i}}, token=float(i))
        time.sleep(0.004)
    assert until(lambda: agent.agent.rates == {"i": 49}, timeout=15)
    assert until(lambda: s.lrc_report() is not None and s.lrc_report()[0] == 49.0)
    assert rate_pump().replies > replies                      # however many: the latest value wins
    assert s.guard.stats["session"].rounds == rounds          # the thread never ran a round
    assert s.st.rate_pushes >= 1 and s.st.last_error is None
    assert until(lambda: s.watched is not None and not s.lent)   # back in the idle watch
    samples = {(n, tuple(sorted(lab.items()))): v for n, lab, v in sessions.samples(loaded)}
    assert samples[("bwfabric_agent_rate_pushes", (("host", "h1"),))] == s.st.rate_pushes
    assert samples[("bwfabric_rate_pump_failures", ())] == rate_pump().failures
    assert samples[("bwfabric_rate_pump_errors", ())] == rate_pump().errors


def test_a_hung_agent_times_the_loan_out_and_the_session_reconnects_with_the_newest_factors(fabric):
    agent, make, _ = fabric
    sessions, _ = make(request_timeout_s=0.5)
    s = sessions.session("h1")
    assert _idle(s)
    original = agent.agent.handle
    first = threading.Event()
    release = threading.Event()

    def handle(raw):
        if not first.is_set():
            first.set()
            release.wait(20)                      # no answer until the session has given up on it
            raise ConnectionError("hung")         # and none then: the agent drops the connection
        return original(raw)
    agent.agent.handle = handle
    agent.agent.server.handler = handle
    s.push_rates({"factors": {"x": 1}})
    try:
        assert until(lambda: s.st.last_error is not None and "no reply to rates" in s.st.last_error, timeout=15)
    finally:
        release.set()
    # no newer factors came: the ones that timed out are sent again once the session has reconnected
    assert until(lambda: agent.agent.rates == {"x": 1}, timeout=15)
    assert s.st.connects >= 2


def test_a_stream_of_factors_does_not_starve_the_status_reads(fabric):
    """The loan ends when a status read is due: with factors every 2 ms and
    status every 0.2 s, status replies keep coming."""
    agent, make, _ = fabric
    sessions, _ = make()
    s = sessions.session("h1")
    assert _idle(s)
    s.status_interval_s = 0.2
    s.next_status = 0.0                           # the minute-long wait drawn before is over
    s.push_rates({"factors": {"i": -1}})
    seen = set()
    end = time.monotonic() + 15.0                # 0.8 s on a quiet machine; ends as soon as four are seen
    i = 0
    while time.monotonic() < end and len(seen) < 4:
        s.push_rates({"factors": {"i": i}})
        seen.add(s.state()["status_at"])
        i += 1
        time.sleep(0.002)
    assert len(seen) >= 4, seen
    assert s.st.rate_pushes > 0


def test_an_agent_restarting_under_the_pump_gets_its_config_and_the_factors(fabric):
    agent, make, _ = fabric
    sessions, _ = make()
    s = sessions.session("h1")
    assert _idle(s)
    for i in range(20):
        s.push_rates({"factors": {"i": i}})
        if i == 10:
            agent.restart()
        time.sleep(0.01)
    s.push_rates({"factors": {"i": "last"}})
    assert until(lambda: agent.agent.rates == {"i": "last"}, timeout=15)
    assert until(lambda: agent.agent.version == 1, timeout=15)


def test_racing_configs_status_and_factors_never_interleave_on_the_channel(fabric, caplog):
    """Four threads push factors while the configuration changes 30 times
    and status reads fall due: each configuration reaches the agent while
    the factors still stream (a pending configuration ends the loan), the
    agent ends with the last configuration and the last factors, and no
    request failed, was refused or read another's reply (one connection
    throughout, the pump hit no bug)."""
    from controller.ratepump import rate_pump
    agent, make, data = fabric
    sessions, loaded = make()
    s = sessions.session("h1")
    assert _idle(s)
    errors_before, failures_before = rate_pump().errors, rate_pump().failures
    caplog.set_level(logging.WARNING, logger="bwfabric.agents")
    stop = threading.Event()

    def producer(n):
        i = 0
        while not stop.is_set():
            s.push_rates({"factors": {"p": n, "i": i}})
            i += 1
            time.sleep(0.001)
    threads = [threading.Thread(target=producer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    try:
        for version in range(2, 32):
            d = copy.deepcopy(data)
            d["tenants"]["t"]["vms"]["vh1"]["guarantee_mbps"] = 1 + version % 5
            new = config.from_data(d)
            sessions.update(loaded, new, version)
            loaded = new
            s.status_interval_s = 0.05 if version % 3 == 0 else 60
            time.sleep(0.01)
        assert until(lambda: agent.agent.version == 31, timeout=15)    # while the factors still stream
    finally:
        stop.set()
        for t in threads:
            t.join()
    s.push_rates({"factors": {"done": True}})
    assert until(lambda: agent.agent.rates == {"done": True}, timeout=15)
    assert until(lambda: agent.agent.version == 31, timeout=15)
    assert agent.agent.vm().config.guarantee_mbps == 1 + 31 % 5
    assert (s.st.refusals, s.st.report_refusals) == (0, 0), s.st
    # no request read another's reply: nothing the channel or the framing refused, at either end. (A
    # reconnect alone is no such sign: once in a full unit run the session reconnected -- not seen in 12
    # stressed runs of this test alone -- so its reasons are checked, not its count: every warning the
    # sessions and the pump logged, since a later successful push clears last_error.)
    said = [r.getMessage() for r in caplog.records if r.name == "bwfabric.agents"]
    print("\n".join(said) or "no warnings", f"connects {s.st.connects}", sep="\n")
    bad = ("Channel", "Frame", "replay", "sequence", "mac", "MAC")
    assert not any(w in m for m in said for w in bad), said
    assert not any(w in (s.st.last_error or "") for w in bad), s.st
    assert rate_pump().errors == errors_before
    assert agent.agent.server.stats.bad_frames == 0 and agent.agent.server.stats.handler_errors == 0


@pytest.mark.parametrize("other", ["nothing", "config", "status due", "stopping", "no key", "closed"])
def test_the_loan_goes_on_only_while_there_is_nothing_else_to_do(other):
    """A reply in, newer factors waiting: the pump keeps the socket only if
    the session has nothing else to do -- a configuration to push, a status
    read due, a stop, a missing key or a closed connection each end the loan
    (the thread is woken and the factors stay in the slot for it)."""
    from controller.agent_sessions import Session
    from controller.tenancy import Endpoint
    s = Session(Endpoint("h1", "unix:/nonexistent", None), KEY, generation=5)
    a, _b = socket.socketpair()
    s.client.sock = a
    s.lent, s.next_status = True, time.monotonic() + 60
    s.rates = {"factors": {"x": 2}}
    if other == "config":
        s.need_push = True
    elif other == "status due":
        s.next_status = time.monotonic() - 1
    elif other == "stopping":
        s.stopping = True
    elif other == "no key":
        s.key_ok = False
    elif other == "closed":
        s.client.sock = None
    go_on = s.rates_replied({"ok": True}, 1.0)
    assert s.st.rate_pushes == 1 and s.lrc_reply[0] == 1.0
    assert go_on is (other == "nothing")
    assert s.lent is (other == "nothing") and s.rates == {"factors": {"x": 2}}
    assert s.take_rates() == (None if other != "nothing" else ({"factors": {"x": 2}}, None))
