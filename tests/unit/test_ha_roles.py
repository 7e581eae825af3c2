"""controller.ha in the controller (no etcd here: the election's verdicts
are given to the runtime as the launcher's election gives them): a standby
asks switches for SLAVE and writes nothing, a leader asks for MASTER with its
generation and reads every switch back, agent sessions and the API follow
the role; bad settings are refused by name. The election itself runs
against a real etcd in tests/integration/test_ha_election.py."""

from __future__ import annotations

import math

import pytest
from os_ken.controller import ofp_event
from os_ken.ofproto import ofproto_v1_3 as ofp

from apps.lessor.app import LessorApp
from bwtesting.readback import Msg, answer
from controller import config, runtime
from controller.ha import GENERATION_BASE, Election, validate
from controller.network_view import NetworkView
from mininet_topos import builders
from tests.unit.test_apps_smoke import RecordingDatapath

GEN = GENERATION_BASE + 7


@pytest.fixture
def standby(app_config):
    topo = builders.fattree(4, link_mbps=10)
    path = app_config(topo, routing="lessor", controller={
        "ha": {"etcd": "http://127.0.0.1:2379", "node": "ctl-a"}})
    rt = runtime.start(config.load(path))
    rt.role = "standby"
    inst = LessorApp()
    view = NetworkView(topo)
    dps = {sw: RecordingDatapath(view.dpid(sw)) for sw in view.switches}
    return rt, inst, dps


def _names(msgs):
    return [type(m).__name__ for m in msgs]


def test_a_standby_that_knows_no_leader_asks_nothing_and_writes_nothing(standby):
    rt, inst, dps = standby
    dp = dps["e0_0"]
    inst._switch_features(ofp_event.EventOFPSwitchFeatures(Msg(dp)))
    assert _names(dp.sent) == ["OFPPortDescStatsRequest"]       # a warm view of the ports, no read-back
    assert inst.readings == {} and "e0_0" in inst.datapaths
    inst.send("e0_0", inst.logic.switch_connected("e0_0"))      # whatever it would write
    assert _names(dp.sent) == ["OFPPortDescStatsRequest"] and inst.sent["not_leading"] > 0
    assert inst._poll_round() > 0 and inst.polls == 0            # LESSOR measures nothing


def test_roles_follow_the_election_slave_then_master_with_the_generation_then_slave(standby):
    rt, inst, dps = standby
    for dp in dps.values():
        inst._switch_features(ofp_event.EventOFPSwitchFeatures(Msg(dp)))
    rt.set_role("standby", GEN, "ctl-b")                        # the leader seen: SLAVE with its generation
    dp = dps["a0_0"]
    slave = [m for m in dp.sent if type(m).__name__ == "OFPRoleRequest"]
    assert [(m.role, m.generation_id) for m in slave] == [(ofp.OFPCR_ROLE_SLAVE, GEN)]
    assert rt.leader_name == "ctl-b" and not rt.leading()
    mark = {sw: len(d.sent) for sw, d in dps.items()}
    rt.set_role("leader", GEN + 5, "ctl-a")                     # elected
    assert rt.generation == GEN + 5 and rt.leading()
    new = dp.sent[mark["a0_0"]:]
    assert _names(new)[:4] == ["OFPRoleRequest", "OFPGroupDescStatsRequest", "OFPMeterConfigStatsRequest",
                               "OFPFlowStatsRequest"]
    assert (new[0].role, new[0].generation_id) == (ofp.OFPCR_ROLE_MASTER, GEN + 5)
    assert set(inst.readings) == set(dps)
    for sw, d in dps.items():                                   # every switch answers: reconciled, written
        answer(inst, d, d.sent[mark[sw]:], None)
    assert inst.reconciles == {"read": len(dps)} and inst.lessor.routing._state.keys() == set(dps)
    # every switch grants MASTER: logged once, as the failover's end
    for sw, d in dps.items():
        inst._role_reply(ofp_event.EventOFPRoleReply(Msg(d, role=ofp.OFPCR_ROLE_MASTER, generation_id=GEN + 5)))
    assert inst.all_master_logged == GEN + 5
    # a newer leader elsewhere: SLAVE with its generation, nothing more written, state forgotten
    mark = {sw: len(d.sent) for sw, d in dps.items()}
    rt.set_role("standby", GEN + 9, "ctl-b")
    new = dps["e0_0"].sent[mark["e0_0"]:]
    assert [(m.role, m.generation_id) for m in new] == [(ofp.OFPCR_ROLE_SLAVE, GEN + 9)]
    assert inst.lessor.routing._state == {} and inst.readings == {}


def test_the_api_of_a_standby_answers_reads_and_refuses_changes(app_config, tmp_path):
    from werkzeug.test import Client

    from controller.api import Api
    path = app_config(builders.fattree(4), routing="lessor",
                      controller={"ha": {"etcd": "http://127.0.0.1:2379", "node": "ctl-a"}},
                      api={"listen": "127.0.0.1:18999", "token_file": str(tmp_path / "tok"),
                           "state_file": str(tmp_path / "api-state.yaml")})
    rt = runtime.start(config.load(path))
    rt.role = "standby"
    token = "t" * 32
    api = Api(rt, None, token)
    c = Client(api)
    auth = {"Authorization": f"Bearer {token}"}
    r = c.get("/v1/status", headers=auth)
    assert r.status_code == 200 and r.json["role"] == "standby"
    r = c.put("/v1/tenants/x", json={"vms": {}}, headers=auth)
    assert r.status_code == 503 and "standby" in r.json["error"]
    rt.set_role("standby", GEN, "ctl-b")
    assert "ctl-b" in c.delete("/v1/tenants/x", headers=auth).json["error"]
    rt.set_role("leader", GEN + 1, "ctl-a")
    assert c.delete("/v1/tenants/nope", headers=auth).status_code != 503


def test_agent_sessions_lead_with_the_new_generation_and_follow_by_stopping(app_config, tmp_path):
    from controller.agent_sessions import AgentSessions
    from experiments import configs
    topo = builders.fattree(4, link_mbps=10)
    topo.save(tmp_path / "topo.json")
    path = configs.write(tmp_path / "c.yaml", tmp_path / "topo.json", "lessor", 6653, agents_dir=tmp_path / "ag",
                         tenants={"t": {"vms": {"v": {"host": "h1", "guarantee_mbps": 2}}}})
    loaded = config.load(path)
    s = AgentSessions(123, timeout_s=0.2, retry_s=0.05)
    try:
        s.lead(GEN, loaded, 1)
        assert s.generation == GEN and set(s.sessions) == {"h1"} and s.sessions["h1"].generation == GEN
        old = s.sessions["h1"]
        s.follow()                                   # returns at once; the session stops behind it
        assert s.sessions == {} and s.configs == {}
        old.thread.join(10)
        assert not old.thread.is_alive() and old.stopping
        s.lead(GEN + 2, loaded, 1)
        assert s.sessions["h1"].generation == GEN + 2
    finally:
        s.stop()


@pytest.mark.parametrize("kw,name", [
    (dict(key="leader"), "key"), (dict(key="/" + "x" * 300), "key"), (dict(node=""), "node"),
    (dict(node=7), "node"), (dict(ttl_s=0.5), "ttl_s"), (dict(ttl_s=math.nan), "ttl_s"),
    (dict(ttl_s=math.inf), "ttl_s"), (dict(ttl_s=True), "ttl_s"), (dict(poll_s=0), "poll_s"),
    (dict(poll_s=math.nan), "poll_s")])
def test_bad_election_settings_are_refused_by_name(kw, name):
    args = dict(key="/bwfabric/leader", node="ctl-a", ttl_s=2, poll_s=0.2) | kw
    with pytest.raises(ValueError, match=name):
        validate(**args)
    with pytest.raises(ValueError, match=name):
        Election(None, args["key"], args["node"], args["ttl_s"], args["poll_s"])


@pytest.mark.parametrize("ha,problem", [
    ({"etcd": "127.0.0.1:2379", "node": "a"}, "etcd"), ({"etcd": "http://127.0.0.1", "node": "a"}, "etcd"),
    ({"etcd": "ftp://h:1", "node": "a"}, "etcd"), ({"etcd": "http://h:1/x", "node": "a"}, "etcd"),
    ({"etcd": "http://h:99999", "node": "a"}, "etcd"), ({"etcd": "http://h:1"}, "node"),
    ({"etcd": "http://h:1", "node": "a b"}, "node"), ({"etcd": "http://h:1", "node": "a", "ttl_s": 0}, "ttl_s"),
    ({"etcd": "http://h:1", "node": "a", "ttl_s": float("nan")}, "ttl_s"),
    ({"etcd": "http://h:1", "node": "a", "key": "no-slash"}, "key"),
    ({"etcd": "http://h:1", "node": "a", "extra": 1}, "extra")])
def test_bad_ha_configuration_is_refused_by_name(app_config, ha, problem):
    path = app_config(builders.fattree(4), controller={"ha": ha})
    with pytest.raises(config.ConfigError, match=problem):
        config.load(path)


def test_the_role_is_a_restart_only_key_and_a_bad_role_is_refused(app_config):
    path = app_config(builders.fattree(4), controller={"ha": {"etcd": "http://127.0.0.1:2379", "node": "a"}})
    rt = runtime.start(config.load(path))
    with pytest.raises(ValueError, match="role"):
        rt.set_role("master", GEN)
    assert rt.role == "single"
    assert "controller.ha" in runtime.RESTART_ONLY



def test_a_leader_asks_for_master_before_it_reads_a_connecting_switch_back(standby):
    rt, inst, dps = standby
    rt.set_role("leader", GEN + 3, "ctl-a")
    dp = dps["c1"]
    inst._switch_features(ofp_event.EventOFPSwitchFeatures(Msg(dp)))
    assert _names(dp.sent) == ["OFPRoleRequest", "OFPGroupDescStatsRequest", "OFPMeterConfigStatsRequest",
                               "OFPFlowStatsRequest", "OFPPortDescStatsRequest"]
    assert (dp.sent[0].role, dp.sent[0].generation_id) == (ofp.OFPCR_ROLE_MASTER, GEN + 3)
    # a role reply from a switch for another generation does not end the failover
    inst._role_reply(ofp_event.EventOFPRoleReply(Msg(dp, role=ofp.OFPCR_ROLE_MASTER, generation_id=GEN)))
    assert inst.all_master_logged is None
