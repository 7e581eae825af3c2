"""Controller <-> agent channel: forged and replayed messages are refused."""

import json

import pytest

from bwcommon.channel import ChannelError, ReplayGuard, Receiver, Sender, host_key

MASTER = bytes(range(32))


def _pair(tmp_path=None, clock=lambda: 1000.0):
    key = host_key(MASTER, "h1")
    guard = ReplayGuard(tmp_path / "seq" if tmp_path else None)
    return (Sender(key, "h1", clock=clock, clock_ns=lambda: 5), Receiver(key, "h1", guard, clock=clock))


def test_authentic_messages_pass_in_order():
    tx, rx = _pair()
    assert rx.open(tx.seal("config", {"guarantee_mbps": 35})) == ("config", {"guarantee_mbps": 35})
    assert rx.open(tx.seal("rates", {"r": 1.5})) == ("rates", {"r": 1.5})


def test_forged_messages_are_refused():
    tx, rx = _pair()
    msg = json.loads(tx.seal("config", {"guarantee_mbps": 35}))
    msg["body"]["guarantee_mbps"] = 1000                       # tampered body
    with pytest.raises(ChannelError, match="bad MAC"):
        rx.open(json.dumps(msg).encode())
    other = Sender(host_key(MASTER, "h2"), "h1", clock=lambda: 1000.0)  # h2's key claiming h1
    with pytest.raises(ChannelError, match="bad MAC"):
        rx.open(other.seal("config", {}))
    for_h2 = Sender(host_key(MASTER, "h1"), "h2", clock=lambda: 1000.0)
    with pytest.raises(ChannelError, match="for host 'h2'"):
        rx.open(for_h2.seal("config", {}))
    with pytest.raises(ChannelError, match="not a JSON"):
        rx.open(b"\xff garbage")
    with pytest.raises(ChannelError, match="lacks mac"):
        rx.open(json.dumps({k: v for k, v in json.loads(tx.seal("x", {})).items() if k != "mac"}).encode())
    # a refused message does not advance the replay guard: the next real one passes
    assert rx.open(tx.seal("config", {"ok": 1}))[1] == {"ok": 1}


def test_replayed_and_stale_messages_are_refused_even_after_restart(tmp_path):
    tx, rx = _pair(tmp_path)
    first = tx.seal("config", {"a": 1})
    second = tx.seal("config", {"a": 2})
    rx.open(second)
    with pytest.raises(ChannelError, match="replayed"):
        rx.open(second)
    with pytest.raises(ChannelError, match="replayed"):
        rx.open(first)                                          # older, never seen: still refused
    restarted = Receiver(rx.key, "h1", ReplayGuard(tmp_path / "seq"), clock=lambda: 1000.0)
    with pytest.raises(ChannelError, match="replayed"):
        restarted.open(second)
    late = Receiver(rx.key, "h1", ReplayGuard(), clock=lambda: 1000.0 + 31)
    with pytest.raises(ChannelError, match="clock skew"):
        late.open(tx.seal("config", {}))


def test_keys_differ_per_host_and_short_secrets_are_refused():
    assert host_key(MASTER, "h1") != host_key(MASTER, "h2")
    with pytest.raises(ChannelError, match="at least 16"):
        host_key(b"short", "h1")


def test_a_reply_cannot_be_reflected_back_as_a_command():
    key = host_key(MASTER, "h1")
    agent_reply = Sender(key, "h1", direction="a2c", clock=lambda: 1000.0).seal("config", {"x": 1})
    agent_inbox = Receiver(key, "h1", clock=lambda: 1000.0)               # expects c2a
    with pytest.raises(ChannelError, match="bad MAC"):
        agent_inbox.open(agent_reply)
    controller_inbox = Receiver(key, "h1", direction="a2c", clock=lambda: 1000.0)
    assert controller_inbox.open(agent_reply) == ("config", {"x": 1})


def test_key_lengths_at_their_edge_and_refusals_in_words(tmp_path):
    """16 bytes is the shortest master secret and the shortest key file;
    15 are refused by name; a key others may read names its mode."""
    import os

    import pytest

    from bwcommon.channel import ChannelError, host_key, load_secret
    assert len(host_key(b"m" * 16, "h1")) == 32
    with pytest.raises(ChannelError, match="^the master secret must be at least 16 bytes$"):
        host_key(b"m" * 15, "h1")
    path = tmp_path / "k"
    path.write_text((b"k" * 16).hex() + "\n")
    os.chmod(path, 0o600)
    assert load_secret(path, private=True) == b"k" * 16
    path.write_text((b"k" * 15).hex())
    with pytest.raises(ChannelError, match=rf"^{path}: key too short \(15 bytes, need >= 16\)$"):
        load_secret(path)
    path.write_text((b"k" * 16).hex())
    os.chmod(path, 0o640)
    with pytest.raises(ChannelError, match=rf"^{path}: mode 640 lets others read or change the key; chmod 600 {path}$"):
        load_secret(path, private=True)


def test_a_replay_state_that_cannot_be_written_is_reported_by_file_and_why(tmp_path):
    """The guard still refuses replays in memory; what it could not persist
    is said (the file and the kernel's words), and clears once it can."""
    from bwcommon.channel import ReplayGuard
    state = tmp_path / "missing-dir" / "seq"
    g = ReplayGuard(state_file=state)
    g.accept(5)
    assert g.persist_error == f"{state}: No such file or directory" and g.last_seq == 5
    state.parent.mkdir()
    g.accept(6)
    assert g.persist_error is None and state.read_text() == "6"


# ---- the wire format, pinned (a change here is a protocol change: bump channel.VERSION) -------------
KEY = bytes(range(32))


def test_the_wire_format_is_pinned_by_test_vectors():
    """Keys: HMAC-SHA256(master, "bwfabric agent key " + host), then per
    direction HMAC-SHA256(key, "bwfabric direction " + c2a|a2c); a message:
    canonical JSON (sorted keys, no spaces) with its MAC over the same."""
    from bwcommon import channel as C
    assert C.host_key(b"m" * 16, "h1").hex() == "3400272d73edca9fef58ed8b3774aca7d76ba6cf089c9c07bb753a927f059eb1"
    assert C.direction_key(KEY, "a2c").hex() == "e493d12ae9524ae4cea2b50ed34752e8ca1f0b54db88f29379baeaf898aaf0f2"
    sealed = C.Sender(KEY, "h1", clock=lambda: 1000.5).seal("status", {"b": [1, 2], "a": "x"})
    assert sealed == (b'{"body":{"a":"x","b":[1,2]},"host":"h1",'
                      b'"mac":"c85db7caaa4c6df37a3368c9d0d59208c7c901248a9c60885ea1c7e87eb09407",'
                      b'"seq":1000500000000,"ts":1000.5,"type":"status","v":1}')
    import pytest
    with pytest.raises(C.ChannelError, match=r"^direction 'up' must be one of \('c2a', 'a2c'\)$"):
        C.direction_key(KEY, "up")


def test_seqs_are_the_clock_in_ns_and_never_repeat():
    from bwcommon import channel as C
    s = C.Sender(KEY, "h1", clock=lambda: 2.5)
    r = C.Receiver(KEY, "h1", clock=lambda: 2.5)
    seqs = [r.guard.last_seq for _ in range(3) if r.open(s.seal("x", {}))]
    assert seqs == [2_500_000_000, 2_500_000_001, 2_500_000_002]


def _signed(**fields):
    """A message signed with the right key whatever its fields hold."""
    import json

    from bwcommon import channel as C
    base = {"v": 1, "host": "h1", "seq": 5, "ts": 100.0, "type": "status", "body": {}}
    f = {**base, **fields}
    return json.dumps({**f, "mac": C._mac(C.direction_key(KEY, "c2a"), f)}).encode()


def test_every_refusal_of_a_message_says_what_is_wrong():
    import pytest

    from bwcommon import channel as C
    good = _signed()
    cases = [
        (b"[1]", "message must be a JSON object"),
        (b'{"v": 1}', "message lacks host, seq, ts, type, body, mac"),
        (good[:-1] + b', "x": 1, "a": 2}', "unknown message fields ['a', 'x']"),
        (good.replace(b'"mac": "', b'"mac": "0'), "bad MAC: forged, corrupted, or signed with another host's key"),
        (_signed(v=2), "protocol version 2 not supported (this agent speaks 1)"),
        (_signed(host="h2"), "message for host 'h2', this is 'h1'"),
        (_signed(seq=0), "seq must be an integer in 1..2^63-1"),
        (_signed(seq=True), "seq must be an integer in 1..2^63-1"),
        (_signed(type=1), "type must be a string and body an object"),
        (_signed(ts=60.0), "stale or future message: clock skew 40.0 s > 30 s"),
        (_signed(seq=131 * 10**9), "seq 131000000000 is ahead of this clock by more than 30 s"),
        (_signed(seq=130 * 10**9 + 1), "seq 130000000001 is ahead of this clock by more than 30 s"),
        (_signed(seq=2**63), "seq must be an integer in 1..2^63-1"),
        (_signed(ts="x"), "ts must be a finite number (a NaN would pass any freshness check)"),
        (_signed(ts=69.99), "stale or future message: clock skew 30.0 s > 30 s"),
    ]
    for raw, words in cases:
        r = C.Receiver(KEY, "h1", clock=lambda: 100.0)
        with pytest.raises(C.ChannelError) as exc:
            r.open(raw)
        assert str(exc.value) == words, raw
        assert r.guard.last_seq == 0
    r = C.Receiver(KEY, "h1", clock=lambda: 100.0)
    assert r.open(_signed(seq=1)) == ("status", {}) and r.guard.last_seq == 1       # 1 is the first seq
    # the edges themselves are in: a skew of exactly 30 s, a seq exactly 30 s ahead
    assert r.open(_signed(seq=2, ts=70.0)) == ("status", {})
    assert r.open(_signed(seq=130 * 10**9)) == ("status", {}) and r.guard.last_seq == 130 * 10**9


def test_a_replay_state_at_the_ceiling_stays_and_one_past_is_brought_back(tmp_path, caplog):
    import logging

    from bwcommon.channel import DEFAULT_MAX_SKEW_S, ReplayGuard
    state = tmp_path / "seq"
    ceiling = int((100.0 + DEFAULT_MAX_SKEW_S) * 1e9)
    state.write_text(str(ceiling))
    assert ReplayGuard(state_file=state, clock=lambda: 100.0).last_seq == ceiling
    state.write_text(str(ceiling + 5_500_000_000))
    with caplog.at_level(logging.WARNING, logger="bwfabric.agent"):
        g = ReplayGuard(state_file=state, clock=lambda: 100.0)
    assert g.last_seq == ceiling
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        ("bwfabric.agent", f"replay state {ceiling + 5_500_000_000} is 6 s ahead of this clock; brought back to "
                           "now + 30 s")]
    state.write_text("\n")
    assert ReplayGuard(state_file=state, clock=lambda: 100.0).last_seq == 0         # an empty file: nothing yet
