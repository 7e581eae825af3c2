"""Fire LESSOR's os-ken handlers with real os-ken event/parser classes."""

import json
import struct
import time

import pytest
from os_ken.controller import ofp_event
from os_ken.ofproto import ofproto_v1_3_parser as parser

from apps.lessor.app import LessorApp
from controller.network_view import NetworkView
from mininet_topos import builders
from tests.unit.test_apps_smoke import Msg, RecordingDatapath, connect


@pytest.fixture
def app(tmp_path, app_config):
    topo = builders.fattree(4, link_mbps=10)
    app_config(topo, controller={"routing": "lessor", "state_file": str(tmp_path / "state.json")},
               lessor={"epsilon": 0.05, "polling": {"min_s": 0.5}})
    return LessorApp(), NetworkView(topo), tmp_path


def _stats(match_fields, byte_count):
    match = parser.OFPMatch(**match_fields)
    return parser.OFPFlowStats(table_id=3, duration_sec=1, duration_nsec=0, priority=100, idle_timeout=10,
                               hard_timeout=0, flags=0, cookie=5 << 48, packet_count=10,
                               byte_count=byte_count, match=match, instructions=[])


def test_handlers(app):
    inst, view, tmp = app
    dps = {sw: RecordingDatapath(view.dpid(sw)) for sw in view.switches}
    for sw, dp in dps.items():
        connect(inst, dp)
        assert dp.sent, sw
    names = {type(m).__name__ for m in dps["e0_0"].sent}
    assert {"OFPFlowMod", "OFPGroupMod", "OFPPortDescStatsRequest"} <= names
    fields = dict(eth_type=0x800, ip_proto=6, in_port=1, ipv4_src="10.0.0.1", ipv4_dst="10.0.0.16",
                  tcp_src=1000, tcp_dst=80)
    e00 = dps["e0_0"]
    inst._flow_stats(ofp_event.EventOFPFlowStatsReply(Msg(e00, body=[_stats(fields, 0)])))
    assert inst.decide_at is not None
    time.sleep(0.01)
    inst._flow_stats(ofp_event.EventOFPFlowStatsReply(Msg(e00, body=[_stats(fields, 500_000)])))
    st = inst.lessor.table.flows[("10.0.0.1", "10.0.0.16", 6, 1000, 80)]
    assert st.long and st.src_tor == "e0_0" and st.dst_tor == "e3_1"
    inst._echo_reply(ofp_event.EventOFPEchoReply(Msg(e00, data=struct.pack("!d", time.monotonic() - 0.002))))
    assert 0.002 <= inst.last_rtt < 1
    inst._packet_in(ofp_event.EventOFPPacketIn(Msg(e00)))
    assert inst.packet_ins == 1
    inst._reallocate()          # PMPT in a real thread, then install
    assert inst.lessor.installed
    inst._write_state()
    state = json.loads((tmp / "state.json").read_text())
    assert state["packet_ins"] == 1 and len(state["installed"]) == 1
    inst._disconnected(ofp_event.EventOFPStateChange(e00))
    assert "e0_0" not in inst.datapaths


def test_settings_come_from_the_configuration(tmp_path, app_config):
    app_config(builders.fattree(4, link_mbps=10), routing="lessor",
               lessor={"epsilon": 0.1, "long_flow_bytes": 5000, "polling": {"min_s": 1, "max_s": 30}})
    inst = LessorApp()
    assert inst.lessor.epsilon == 0.1 and inst.lessor.table.long_bytes == 5000
    assert (inst.lessor.polling.config.min_s, inst.lessor.polling.config.max_s) == (1, 30)


def test_bg_policy_follows_the_declared_tenants(tmp_path, app_config):
    key = tmp_path / "agent.key"
    key.write_bytes(b"k" * 32)
    key.chmod(0o600)
    AGENTS = {"hosts": {h: {"address": f"unix:{tmp_path}/{h}.sock", "key_file": str(key)} for h in ("h1", "h2")}}
    """With prio queues the app's LESSOR knows every VM's guarantee and join
    ports (apps.lessor.bg); a reload with other guarantees replaces them;
    without prio queues nothing is BG."""
    from apps.lessor.app import bg_policy
    from controller import config
    topo = builders.fattree(4, link_mbps=10, fabric_mbps=5)
    tenants = {"t": {"vms": {"a": {"host": "h1", "guarantee_mbps": 4.0}, "b": {"host": "h2", "guarantee_mbps": 1.5}}}}
    app_config(topo, controller={"routing": "lessor", "prio_queues": True}, tenants=tenants,
               agents={**AGENTS, "defaults": {"join_port_base": 12000}},
               admission={"mu": 0.8})
    inst = LessorApp()
    view = NetworkView(topo)
    h1, h2 = view.ip("h1"), view.ip("h2")
    pol = inst.lessor.bg
    assert pol.guarantee_bps == {h1: 4e6, h2: 1.5e6} and pol.mu == 0.8
    assert pol.carries_bg((h1, view.ip("h5"), 6, 40000, 5001))
    assert not pol.carries_bg((h1, h2, 6, 40000, 12000))
    tenants["t"]["vms"]["a"]["guarantee_mbps"] = 2.0
    path = app_config(topo, controller={"routing": "lessor", "prio_queues": True}, tenants=tenants,
                      agents=AGENTS, admission={"mu": 0.8})
    new = config.load(path)
    inst.config_changed(inst.config, new)
    assert inst.lessor.bg.guarantee_bps[h1] == 2e6 and inst.lessor.bg.join_port_base[h1] == 10100
    app_config(topo, controller={"routing": "lessor", "prio_queues": False}, tenants=tenants,
               agents=AGENTS)
    assert bg_policy(config.load(path)).guarantee_bps == {}
    app_config(topo, controller={"routing": "lessor", "prio_queues": True}, tenants=tenants,
               agents=AGENTS, lessor={"bg_first": False})
    assert bg_policy(config.load(path)).guarantee_bps == {}


def test_a_reload_racing_a_link_change_leaves_the_switches_as_lessor_holds_them(tmp_path, app_config):
    """A reload that repacks the default BG routes and a port-down event that
    repacks them again, the event let in while the reload is sending: what
    the switches end with (every message applied in the order sent) is what
    LESSOR's final state installs on a fresh switch -- the reload's older
    updates must not land after the event's newer ones and revert them."""
    import threading

    from controller import config, ofmsg
    from bwtesting.fakenet import FakeNetwork
    from controller.pipeline import PRIO_BG_BELOW, PRIO_BG_UP

    key = tmp_path / "agent.key"
    key.write_bytes(b"k" * 32)
    key.chmod(0o600)
    topo = builders.fattree(4, link_mbps=10, fabric_mbps=5)
    hosts = [f"h{i}" for i in range(1, 17)]
    agents = {"hosts": {h: {"address": f"unix:{tmp_path}/{h}.sock", "key_file": str(key)}
                        for h in hosts[0::4] + hosts[1::4]}}

    def write(with_a):
        tenants = {"b": {"vms": {h: {"host": h, "guarantee_mbps": 4.0} for h in hosts[1::4]}}}
        if with_a:
            tenants["a"] = {"vms": {h: {"host": h, "guarantee_mbps": 4.0} for h in hosts[0::4]}}
        return app_config(topo, controller={"routing": "lessor", "prio_queues": True}, tenants=tenants,
                          agents={"hosts": {h: agents["hosts"][h] for t in tenants.values() for h in t["vms"]}},
                          admission={"mu": 0.9})

    write(False)
    inst = LessorApp()
    view = NetworkView(topo)
    net = FakeNetwork(view)
    applied = threading.Lock()
    reloading, event_sent, event_ran = threading.Event(), threading.Event(), threading.Event()
    reload_thread: list[threading.Thread] = []

    def send(sw, msgs):
        if reload_thread and threading.current_thread() is reload_thread[0] and not reloading.is_set():
            reloading.set()
            event_sent.wait(timeout=1.0)     # a correct app holds its lock: the event cannot run meanwhile
        with applied:
            net.apply(sw, [m for m in msgs if isinstance(m, (ofmsg.FlowMod, ofmsg.GroupMod, ofmsg.MeterMod))])

    inst.send = send
    for sw in view.switches:
        inst.datapaths[sw] = RecordingDatapath(view.dpid(sw))
        send(sw, inst.logic.switch_connected(sw))
    before = dict(inst.lessor.bg_routes.up)
    assert before

    def fail_a_link_of_a_bg_route():     # the up-path of a VM the reload brought
        path = min(p for vm, p in inst.lessor.bg_routes.up.items() if vm not in before)
        inst._port_changed(path[1], view.port(path[1], path[2]), False)
        event_ran.set()

    def event():
        reloading.wait(timeout=10)
        inst.handle("port_status", fail_a_link_of_a_bg_route)
        event_sent.set()

    new = config.load(write(True))
    reload_thread.append(threading.Thread(target=inst.config_changed, args=(inst.config, new)))
    ev_thread = threading.Thread(target=event)
    reload_thread[0].start(), ev_thread.start()
    reload_thread[0].join(timeout=20), ev_thread.join(timeout=20)
    assert reloading.is_set() and event_ran.is_set(), "the reload sent nothing, or the event never ran"
    assert inst.lessor.bg_routes.up != before
    assert net.errors() == {}

    fresh = FakeNetwork(view)
    for sw in view.switches:
        fresh.apply(sw, [m for m in inst.logic.switch_connected(sw)
                         if isinstance(m, (ofmsg.FlowMod, ofmsg.GroupMod, ofmsg.MeterMod))])

    def tables(n, prios=None):
        return {sw: (sorted(repr(f) for f in n.switches[sw].flows() if prios is None or f.priority in prios),
                     sorted(map(repr, n.switches[sw].groups.values())) if prios is None else [])
                for sw in view.switches}
    assert tables(net, (PRIO_BG_UP, PRIO_BG_BELOW)) == tables(fresh, (PRIO_BG_UP, PRIO_BG_BELOW))
    assert tables(net) == tables(fresh)
