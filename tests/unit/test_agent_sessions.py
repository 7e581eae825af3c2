"""The controller's agent sessions against real agent daemons (channel,
transport, request handling) on unix sockets: pushes, re-pushes after an
agent restart, generations, differences only, a dead agent blocking
nobody, the latest-value slot."""

import copy
import time
from pathlib import Path

import pytest

from controller import config
from controller.agent_sessions import AgentSessions
from tests.unit.agents_inprocess import LocalAgent, fabric_data

ROOT = Path(__file__).resolve().parents[2]
HOSTS = ("h1", "h2", "h5")


def wait_for(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return time.monotonic()
        time.sleep(0.01)
    raise AssertionError("condition not met in time")


@pytest.fixture
def fabric(tmp_path):
    data = fabric_data(tmp_path, {f"v{h}": {"host": h, "guarantee_mbps": 2} for h in HOSTS}, status_interval_s=0.2)
    agents = {h: LocalAgent(tmp_path, h).start() for h in HOSTS}
    sessions = []

    def make(generation=1000, data_=None):
        s = AgentSessions(generation)
        sessions.append(s)
        return s, config.from_data(copy.deepcopy(data_ or data))
    yield agents, make, data
    for s in sessions:
        s.stop()
    for a in agents.values():
        a.stop()


def in_force(agent: LocalAgent):
    """The configuration in force at a host that is its own VM (None: none)."""
    return agent.agent.vm().config if agent.agent.vms else None


def test_every_agent_gets_its_configuration_from_the_tenants(fabric):
    agents, make, _ = fabric
    sessions, loaded = make()
    sessions.start(loaded, version=1)
    wait_for(lambda: all(in_force(a) is not None for a in agents.values()))
    assert {h: in_force(a).guarantee_mbps for h, a in agents.items()} == {h: 2 for h in HOSTS}
    assert all((a.agent.generation, a.agent.version) == (1000, 1) for a in agents.values())
    wait_for(lambda: all(s["version_in_force"] == 1 and s["in_force"] for s in sessions.states()))


def test_a_restarted_agent_gets_its_configuration_back_within_2_s(fabric):
    agents, make, _ = fabric
    sessions, loaded = make()
    sessions.start(loaded, version=1)
    wait_for(lambda: in_force(agents["h2"]) is not None)
    agents["h2"].restart()                       # a new daemon: nothing in force
    t0 = time.monotonic()
    assert in_force(agents["h2"]) is None
    took = wait_for(lambda: in_force(agents["h2"]) is not None, timeout=5) - t0
    print(f"restored in {took * 1000:.0f} ms")
    assert took < 2.0
    assert agents["h2"].agent.version == 1


def test_a_stale_controller_cannot_overwrite_a_newer_one(fabric):
    agents, make, data = fabric
    newer, loaded = make(generation=2000)
    newer.start(loaded, version=1)
    wait_for(lambda: all(in_force(a) is not None for a in agents.values()))
    stale_data = copy.deepcopy(data)
    stale_data["tenants"]["t"]["vms"]["vh1"]["guarantee_mbps"] = 7
    stale, stale_loaded = make(generation=1000, data_=stale_data)
    stale.start(stale_loaded, version=5)
    def h1():
        return next(s for s in stale.states() if s["host"] == "h1")
    # h1's own refusal (waiting for any host's, then reading h1's, failed about 1 run in 7)
    wait_for(lambda: h1()["refusals"] and h1()["superseded_by"] is not None)
    assert in_force(agents["h1"]).guarantee_mbps == 2 and agents["h1"].agent.generation == 2000
    st = h1()
    assert "generation 1000 refused" in st["last_error"] and st["superseded_by"] == 2000
    for _ in range(3):                           # three status rounds later, the stale session pushed no more
        seen = h1()["status_at"]
        wait_for(lambda: h1()["status_at"] != seen)
    assert h1()["refusals"] == st["refusals"] == 1
    # ...and after the agent restarts too: the generation is kept in its state directory
    agents["h1"].restart()
    wait_for(lambda: in_force(agents["h1"]) is not None)
    assert in_force(agents["h1"]).guarantee_mbps == 2


def test_a_change_is_pushed_to_the_hosts_it_changes_only(fabric):
    agents, make, data = fabric
    sessions, loaded = make()
    sessions.start(loaded, version=1)
    wait_for(lambda: all(s["pushes"] == 1 for s in sessions.states()) and len(sessions.states()) == 3)
    changed = copy.deepcopy(data)
    changed["tenants"]["t"]["vms"]["vh5"]["guarantee_mbps"] = 3
    del changed["tenants"]["t"]["vms"]["vh2"]
    what = sessions.update(loaded, config.from_data(changed), version=2)
    assert what == {"h2": "removed", "h5": "changed"}
    wait_for(lambda: in_force(agents["h5"]).guarantee_mbps == 3)
    wait_for(lambda: in_force(agents["h2"]) is None)      # its agent removed what it had put in force
    assert agents["h2"].executor.torn_down == 1
    pushes = {s["host"]: s["pushes"] for s in sessions.states()}
    assert pushes == {"h1": 1, "h5": 2}
    assert len(agents["h1"].executor.applied) == 1


def test_a_dead_agent_blocks_nobody(fabric):
    agents, make, _ = fabric
    agents["h1"].stop()                         # never comes back
    agents["h2"].executor.delay_s = 0.3         # slow
    sessions, loaded = make()
    sessions.start(loaded, version=1)
    wait_for(lambda: in_force(agents["h5"]) is not None, timeout=2)
    st = {s["host"]: s for s in sessions.states()}
    assert not st["h1"]["connected"] and "cannot reach" in st["h1"]["last_error"]
    for i in range(200):
        sessions.session("h5").push_rates({"factors": {"i": i}})
        sessions.session("h1").push_rates({"factors": {"i": i}})
    wait_for(lambda: agents["h5"].agent.rates == {"i": 199})
    assert agents["h5"].agent.rates_received <= 200


def test_the_rate_slot_keeps_only_the_newest_value_for_a_slow_agent(fabric):
    agents, make, _ = fabric
    sessions, loaded = make()
    sessions.start(loaded, version=1)
    wait_for(lambda: in_force(agents["h2"]) is not None)
    agents["h2"].executor.delay_s = 0.0
    slow = agents["h2"].agent
    original = slow.handle

    def slow_handle(raw):
        time.sleep(0.05)
        return original(raw)
    slow.handle = slow_handle
    slow.server.handler = slow_handle
    for i in range(100):
        sessions.session("h2").push_rates({"factors": {"i": i}})
    wait_for(lambda: slow.rates == {"i": 99})
    assert slow.rates_received < 20          # a backlog would have delivered all 100


def test_a_host_of_several_vms_gets_them_all_and_each_is_seen_on_its_own(fabric):
    """Issue #32 §4: h5 carries two VMs in namespaces of their own; its
    session pushes both in one configuration, and the metrics name each."""
    import json

    from controller.topology import TopologyDescription
    agents, make, data = fabric
    topo = json.loads((ROOT / "examples" / "fattree4.json").read_text())
    for h in topo["hosts"]:
        if h["name"] == "h5":
            h["vm_prefix"] = "10.5.0.0/28"
    data = copy.deepcopy(data)
    data["fabric"]["topology"] = TopologyDescription.from_dict(topo).to_dict()
    data["tenants"]["t"]["vms"]["vh5"].update(netns="ns-a", address="10.5.0.1")
    data["tenants"]["u"] = {"vms": {"x": {"host": "h5", "guarantee_mbps": 3, "netns": "ns-b", "address": "10.5.0.2"}}}
    sessions, loaded = make(data_=data)
    sessions.start(loaded, version=1)
    wait_for(lambda: set(agents["h5"].agent.vms) == {"t/vh5", "u/x"})
    assert agents["h5"].agent.vm("u/x").config.guarantee_mbps == 3
    assert set(agents["h5"].vm_executors) == {"t/vh5", "u/x"}
    assert {s.dev for p in agents["h5"].executor.applied for s in p.steps} == {"h5-eth0"}     # the shared NIC
    wait_for(lambda: set(next(s for s in sessions.states() if s["host"] == "h5")["vms"]) == {"t/vh5", "u/x"})
    samples = [(n, lab) for n, lab, _ in sessions.samples(loaded) if n == "bwfabric_vm_in_force"]
    assert sorted((lab["tenant"], lab["vm"], lab["host"]) for _, lab in samples) == [("t", "vh5", "h5"),
                                                                                     ("u", "x", "h5")]
    assert in_force(agents["h1"]).guarantee_mbps == 2                 # hosts that are their own VM: as before


def test_status_requests_are_jittered_so_agents_configured_together_do_not_read_back_together(fabric, monkeypatch):
    """Each wait is status_interval_s x (1 +- STATUS_JITTER), drawn per
    session (16 agents reading their kernels back at one instant stalled
    the emulated fabric), and it is what the sender thread waits."""
    import random

    from controller import agent_sessions as AS
    agents, make, _ = fabric
    sessions, loaded = make()
    sessions.start(loaded, version=1)
    wait_for(lambda: all(s["status_at"] is not None for s in sessions.states()))
    interval = sessions.sessions["h1"].status_interval_s
    draws = {}
    for host, s in sessions.sessions.items():
        s.rng = random.Random(host)                    # reproducible draws, one stream per session
        draws[host] = [s.status_interval() for _ in range(200)]
    for ds in draws.values():
        assert all((1 - AS.STATUS_JITTER) * interval <= d <= (1 + AS.STATUS_JITTER) * interval for d in ds)
        assert max(ds) - min(ds) > 1.5 * AS.STATUS_JITTER * interval     # they fill the band
    assert len({ds[0] for ds in draws.values()}) == len(draws)       # sessions draw apart
    assert len({id(s.rng) for s in sessions.sessions.values()}) == len(sessions.sessions)
    # the sender thread waits what status_interval() says: a long draw holds every status request back
    monkeypatch.setattr(AS.Session, "status_interval", lambda self: 60.0)
    time.sleep(2 * interval * (1 + AS.STATUS_JITTER))  # any request already scheduled has gone out
    before = {s["host"]: s["status_at"] for s in sessions.states()}
    time.sleep(4 * interval)
    assert {s["host"]: s["status_at"] for s in sessions.states()} == before


def test_an_idle_session_sleeps_until_its_status_is_due_and_the_watch_wakes_it_when_the_agent_goes(
        fabric, monkeypatch):
    """With nothing to push and its status a minute away, a session's thread
    sleeps (it used to look at its socket every 50 ms: 20 wake-ups a second,
    20 000 at 1000 agents); when the agent closes the connection (it
    restarted) the process's idle-socket watch wakes it, and it reconnects
    and pushes the configuration again -- no status request needed."""
    from controller import agent_sessions as AS
    from controller.sockwatch import idle_watch
    agents, make, _ = fabric
    monkeypatch.setattr(AS.Session, "status_interval", lambda self: 60.0)
    sessions, loaded = make()
    sessions.start(loaded, version=1)
    wait_for(lambda: all(in_force(a) is not None for a in agents.values()))
    wait_for(lambda: all(s["in_force"] for s in sessions.states()))   # the status after the push read
    s1 = sessions.sessions["h1"]
    wait_for(lambda: s1.watched is not None)
    rounds = s1.guard.stats["session"].rounds
    time.sleep(1.0)
    assert s1.guard.stats["session"].rounds - rounds <= 1          # asleep (before: ~20 rounds)
    assert idle_watch().watching() >= len(HOSTS)
    s2 = sessions.sessions["h2"]
    agents["h2"].restart()
    wait_for(lambda: in_force(agents["h2"]) is not None, timeout=5)
    assert s2.st.connects >= 2 and agents["h2"].agent.version == 1
