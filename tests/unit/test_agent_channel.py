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
