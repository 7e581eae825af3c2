"""The agent's persisted state (issue #31 §3): a corrupt generation file
stops it by name (read as 0 it would take a stale controller for a new
one); a state directory it cannot write answers status and refuses, by
name, everything that would change the kernel; a seq far ahead of the
clock neither passes nor locks the channel out across restarts."""

import os
import time

import pytest

from hostagent.agent import Agent
from bwcommon.channel import DEFAULT_MAX_SKEW_S, ChannelError, Receiver, ReplayGuard, Sender, host_key
from bwtesting.executors import RecordingExecutor
from tests.unit.agents_inprocess import MASTER

KEY = host_key(MASTER, "h1")


def _agent(state_dir):
    return Agent("h1", KEY, state_dir, executor=RecordingExecutor())


def _ask(agent, msg_type, body, sender=None):
    sender = sender or Sender(KEY, "h1")
    raw = agent.handle(sender.seal(msg_type, body))
    return Receiver(KEY, "h1", direction="a2c").open(raw)[1]


@pytest.mark.parametrize("text", ["garbage\n", "-5\n", str(2 ** 64) + "\n", ""])
def test_a_corrupt_generation_file_stops_the_agent_by_name(tmp_path, text):
    (tmp_path / "generation").write_text(text)
    with pytest.raises(ValueError, match="generation: corrupt agent state"):
        _agent(tmp_path)


def test_a_missing_generation_file_is_generation_zero_and_a_written_one_survives_a_restart(tmp_path):
    a = _agent(tmp_path)
    assert a.max_generation == 0
    reply = _ask(a, "config", {"generation": 7, "version": 1, "config": None})
    assert reply["ok"], reply
    assert _agent(tmp_path).max_generation == 7


def test_a_state_dir_it_cannot_write_answers_status_and_refuses_changes_by_name(tmp_path):
    a = _agent(tmp_path)
    (tmp_path / "last-seq.tmp").mkdir()            # every write of the replay guard fails from now on
    status = _ask(a, "status", {})
    assert status.get("ok", True) is not False and "in_force" in status, status
    reply = _ask(a, "config", {"generation": 1, "version": 1, "config": None})
    assert reply["ok"] is False and "cannot persist the replay guard" in reply["error"], reply
    assert a.max_generation == 0                   # nothing changed
    os.rmdir(tmp_path / "last-seq.tmp")
    assert _ask(a, "config", {"generation": 1, "version": 1, "config": None})["ok"]   # recovers by itself


def test_a_seq_a_day_ahead_of_the_clock_is_refused():
    rx = Receiver(KEY, "h1")
    ahead = Sender(KEY, "h1", clock_ns=lambda: time.time_ns() + 86400 * 10**9)   # ts now, seq a day ahead
    with pytest.raises(ChannelError, match="ahead of this clock"):
        rx.open(ahead.seal("status", {}))
    assert rx.guard.last_seq == 0
    assert rx.open(Sender(KEY, "h1").seal("status", {}))[0] == "status"


def test_a_persisted_seq_a_day_ahead_does_not_lock_the_channel_out_after_a_restart(tmp_path):
    """Brought back to now + skew at start: the channel is shut for at most
    the skew (30 s), not the day."""
    now = [1.8e9]
    (tmp_path / "last-seq").write_text(str(int((now[0] + 86400) * 1e9)))
    guard = ReplayGuard(tmp_path / "last-seq", clock=lambda: now[0])
    assert guard.last_seq == int((now[0] + DEFAULT_MAX_SKEW_S) * 1e9)
    rx = Receiver(KEY, "h1", guard, clock=lambda: now[0])
    with pytest.raises(ChannelError, match="replayed"):
        rx.open(Sender(KEY, "h1", clock=lambda: now[0]).seal("status", {}))
    now[0] += DEFAULT_MAX_SKEW_S + 1
    assert rx.open(Sender(KEY, "h1", clock=lambda: now[0]).seal("status", {}))[0] == "status"


class _GatedExecutor(RecordingExecutor):
    """apply blocks until released; every call is recorded in order."""

    def __init__(self):
        super().__init__()
        import threading
        self.entered, self.release = threading.Event(), threading.Event()
        self.events: list[str] = []

    def apply(self, plan) -> int:
        self.entered.set()
        self.release.wait(10)
        self.events.append("apply done")
        return super().apply(plan)

    def teardown(self) -> None:
        self.events.append("teardown")
        super().teardown()


def test_shutdown_waits_for_an_apply_in_progress_and_nothing_is_put_in_force_after_it(tmp_path):
    import threading
    ex = _GatedExecutor()
    a = Agent("h1", KEY, tmp_path, executor=ex)
    cfg = dict(host="h1", interface="h1-eth0", address="10.0.0.1", nic_mbps=100, guarantee_mbps=10)
    pushing = threading.Thread(target=_ask, args=(a, "config", {"generation": 1, "version": 1, "config": cfg}))
    pushing.start()
    assert ex.entered.wait(10)
    stopping = threading.Thread(target=a.shutdown)
    stopping.start()
    stopping.join(0.5)           # unlocked, the teardown would run now, under the apply
    ex.release.set()
    pushing.join(10), stopping.join(10)
    assert ex.events == ["apply done", "teardown"]
    reply = _ask(a, "config", {"generation": 1, "version": 2, "config": {**cfg, "guarantee_mbps": 20}})
    assert reply["ok"] is False and "shutting down" in reply["error"], reply
    assert len(ex.applied) == 1 and ex.torn_down == 1
    assert a.lrc_round(entries=[]) == "idle" and a.refresh_buffer("") is False


def test_an_older_version_of_the_generation_in_force_is_refused_and_changes_nothing(tmp_path):
    a = _agent(tmp_path)
    assert _ask(a, "config", {"generation": 3, "version": 5, "config": None})["ok"]
    reply = _ask(a, "config", {"generation": 3, "version": 4, "config": None})
    assert reply["ok"] is False and "version 4 refused" in reply["error"] and "version 5" in reply["error"], reply
    assert (a.generation, a.version) == (3, 5)
    # the same version again (a controller resending after a reconnect) and a newer one pass
    assert _ask(a, "config", {"generation": 3, "version": 5, "config": None})["ok"]
    assert _ask(a, "config", {"generation": 3, "version": 6, "config": None})["ok"]
    assert (a.generation, a.version) == (3, 6)
    # a newer generation starts its versions afresh
    assert _ask(a, "config", {"generation": 4, "version": 1, "config": None})["ok"]


def test_a_restarted_agent_still_refuses_the_generations_before_the_one_it_followed(tmp_path):
    a = _agent(tmp_path)
    assert _ask(a, "config", {"generation": 7, "version": 2, "config": None})["ok"]
    again = _agent(tmp_path)                         # a restart: nothing in force yet, the file read back
    reply = _ask(again, "config", {"generation": 6, "version": 9, "config": None})
    assert reply["ok"] is False and "generation 6 refused" in reply["error"], reply
    assert reply["max_generation"] == 7
    reply = _ask(again, "rates", {"generation": 6, "factors": {}})
    assert reply["ok"] is False and "follows generation 7" in reply["error"], reply
    assert _ask(again, "config", {"generation": 7, "version": 1, "config": None})["ok"]
