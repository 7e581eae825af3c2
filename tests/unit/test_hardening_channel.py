"""Issue #20 §3: the agent channel before and after authentication. Bounded
parsing, non-finite numbers, timeouts, a connection limit, an accept loop
that survives running out of descriptors, explicit bind addresses, key
files that others cannot read."""

import json
import os
import socket
import stat
import struct
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from hypothesis import given, settings, strategies as st

from bwcommon.channel import ChannelError, ReplayGuard, Receiver, Sender, load_secret, write_secret
from bwcommon.transport import FrameError, FrameServer, connect, listen, parse_address, recv_frame, send_frame

KEY = b"k" * 32


def _rx():
    return Receiver(KEY, "h1", ReplayGuard(), clock=lambda: 1000.0)


def _sealed(**fields):
    tx = Sender(KEY, "h1", clock=lambda: 1000.0, clock_ns=lambda: 1)
    msg = json.loads(tx.seal("status", {}))
    msg.update(fields)
    return json.dumps(msg).encode()


@pytest.mark.parametrize("raw", [b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 5000 + b"1" + b"}" * 5000,
                                 b"\xff\xfe\x00garbage", b'{"v": NaN}', b"Infinity"])
def test_hostile_bytes_before_authentication_are_refused_by_name(raw):
    with pytest.raises(ChannelError, match=r"^not a JSON message \(message: "):   # RecursionError killed the thread
        _rx().open(raw)


def test_a_nan_timestamp_does_not_skip_the_freshness_check():
    # the MAC is computed over the fields as sent: a peer with the key could
    # send NaN; without the key the MAC fails first, so sign it properly
    from bwcommon import channel as C
    fields = {"v": 1, "host": "h1", "seq": 5, "ts": float("nan"), "type": "status", "body": {}}
    raw = json.dumps({**fields, "mac": C._mac(C.direction_key(KEY, "c2a"), fields)}).encode()
    with pytest.raises(ChannelError):
        _rx().open(raw)


@pytest.mark.parametrize("seq", [True, 0, -5, 2**64, 1.5])
def test_sequence_numbers_out_of_range_are_refused(seq):
    from bwcommon import channel as C
    fields = {"v": 1, "host": "h1", "seq": seq, "ts": 1000.0, "type": "status", "body": {}}
    raw = json.dumps({**fields, "mac": C._mac(C.direction_key(KEY, "c2a"), fields)}).encode()
    with pytest.raises(ChannelError, match="seq"):
        _rx().open(raw)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_any_bytes_give_a_named_channel_error_and_leave_the_guard_alone(raw):
    rx = _rx()
    with pytest.raises(ChannelError):
        rx.open(raw)
    assert rx.guard.last_seq == 0


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=20),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                    max_leaves=30))
def test_any_json_value_in_any_field_is_refused_without_the_key(value):
    rx = _rx()
    for name in ("v", "host", "seq", "ts", "type", "body", "mac"):
        msg = json.loads(_sealed())
        if msg[name] == value and type(msg[name]) is type(value):
            continue                                 # unchanged: the authentic message
        msg[name] = value
        try:
            raw = json.dumps(msg, allow_nan=True).encode()
        except (TypeError, ValueError):
            continue
        with pytest.raises(ChannelError):
            rx.open(raw)
    assert rx.guard.last_seq == 0


def test_tcp_listeners_need_an_explicit_address():
    for bad in ("tcp::7000", "tcp:7000", "tcp:[]:7000", "tcp:127.0.0.1:0", "tcp:127.0.0.1:99999", "udp:x",
                "unix:relative/path"):
        with pytest.raises(ValueError):
            parse_address(bad)
    assert parse_address("tcp:0.0.0.0:7000") == ("tcp", ("0.0.0.0", 7000))    # only when written out
    assert parse_address("tcp:[::1]:7000") == ("tcp", ("::1", 7000))


def test_secret_files_are_private_from_creation_and_others_readable_keys_refused(tmp_path):
    path = tmp_path / "master"
    write_secret(path, "ab" * 32)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):          # never reuses (or widens) an existing file
        write_secret(path, "cd" * 32)
    assert load_secret(path, private=True) == bytes.fromhex("ab" * 32)
    path.chmod(0o644)
    with pytest.raises(ChannelError, match="chmod 600"):
        load_secret(path, private=True)
    (tmp_path / "bin").write_bytes(b"\xff\xfe")
    with pytest.raises(ChannelError, match="not a hex key"):
        load_secret(tmp_path / "bin")


def test_a_corrupt_replay_state_file_is_a_clear_error(tmp_path):
    (tmp_path / "seq").write_text("not a number")
    with pytest.raises(ChannelError, match="corrupt replay state"):
        ReplayGuard(tmp_path / "seq")


# ---- the frame server ----------------------------------------------------------------------------
@pytest.fixture
def server(tmp_path):
    sock = listen(f"unix:{tmp_path}/a.sock")
    assert stat.S_IMODE(os.stat(tmp_path / "a.sock").st_mode) == 0o600
    srv = FrameServer(lambda raw: b"ok:" + raw[:10], max_connections=4, first_frame_timeout_s=0.5,
                      frame_timeout_s=0.5, idle_timeout_s=0.5)
    th = threading.Thread(target=srv.serve, args=(sock,), daemon=True)
    th.start()
    yield srv, f"unix:{tmp_path}/a.sock", th
    srv.stop.set()
    sock.close()
    th.join(2)


def _ask(address, payload=b"hello"):
    s = connect(address, timeout=5)
    try:
        send_frame(s, payload)
        return recv_frame(s, 5, 5)
    finally:
        s.close()


def test_partial_frames_and_idle_peers_are_dropped_after_their_timeouts(server):
    srv, address, _ = server
    partial = connect(address)
    partial.sendall(struct.pack("!I", 100) + b"x" * 10)      # holds a partial frame
    idle = connect(address)                                   # says nothing
    time.sleep(1.2)
    assert partial.recv(1) == b"" and idle.recv(1) == b""     # both closed by the agent
    assert srv.stats.timeouts == 2
    assert _ask(address) == b"ok:hello"


def test_an_oversized_frame_is_refused_before_it_is_read(server):
    srv, address, _ = server
    s = connect(address)
    s.sendall(struct.pack("!I", 2**31))
    assert s.recv(1) == b""
    assert srv.stats.bad_frames == 1 and _ask(address) == b"ok:hello"


def test_connections_over_the_limit_are_closed_at_once(server):
    srv, address, _ = server
    held = [connect(address) for _ in range(4)]
    time.sleep(0.1)
    extra = connect(address)
    assert extra.recv(1) == b""                               # refused, not queued
    assert srv.stats.refused_busy >= 1
    for s in held:
        s.close()
    time.sleep(0.2)
    assert _ask(address) == b"ok:hello"


def test_a_handler_that_raises_closes_one_connection_only(tmp_path):
    sock = listen(f"unix:{tmp_path}/b.sock")
    srv = FrameServer(lambda raw: (_ for _ in ()).throw(RuntimeError("bug")) if raw == b"die" else b"fine")
    threading.Thread(target=srv.serve, args=(sock,), daemon=True).start()
    with pytest.raises((ConnectionError, OSError, ValueError)):
        r = _ask(f"unix:{tmp_path}/b.sock", b"die")
        if r is None:
            raise ConnectionError("closed")
    assert _ask(f"unix:{tmp_path}/b.sock", b"x") == b"fine" and srv.stats.handler_errors == 1
    srv.stop.set()
    sock.close()


def test_the_accept_loop_survives_running_out_of_descriptors(tmp_path):
    """In a child with RLIMIT_NOFILE 64: peers open 150 connections (accept
    fails with EMFILE on the way), close them; the server answers again.
    The child reports its accept loop's counters whenever asked (a line on
    its stdin): the test waits for what it asserts, never a fixed time."""
    code = textwrap.dedent(f'''
        import resource, sys, threading, json
        from bwcommon.transport import FrameServer, listen
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        srv = FrameServer(lambda raw: b"ok", max_connections=1000, first_frame_timeout_s=30)
        sock = listen("unix:{tmp_path}/c.sock", backlog=512)
        th = threading.Thread(target=srv.serve, args=(sock,), daemon=True); th.start()
        print(json.dumps({{"ready": True}}), flush=True)
        for _line in sys.stdin:
            print(json.dumps({{"alive": th.is_alive(), "accept_errors": srv.stats.accept_errors,
                              "accepted": srv.stats.accepted}}), flush=True)
    ''')
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

    def report():
        child.stdin.write("?\n")
        child.stdin.flush()
        return json.loads(child.stdout.readline())

    try:
        assert json.loads(child.stdout.readline())["ready"]
        peers = []
        for _ in range(150):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(f"{tmp_path}/c.sock")
            peers.append(s)
        deadline = time.monotonic() + 20
        while report()["accept_errors"] == 0:          # it runs out of descriptors on the way
            assert time.monotonic() < deadline, "the accept loop never hit EMFILE"
            time.sleep(0.05)
        for s in peers:
            s.close()
        while True:                                    # and answers again once they are closed
            try:
                assert _ask(f"unix:{tmp_path}/c.sock") == b"ok"
                break
            except (OSError, FrameError):
                assert time.monotonic() < deadline, "the server never answered again"
                time.sleep(0.05)
        got = report()
        assert got["alive"] and got["accept_errors"] > 0     # it did run out, and went on
    finally:
        child.kill()
        child.wait()
