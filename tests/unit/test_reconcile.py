"""A (re)connected switch is read back and reconciled make-before-break,
never wiped (issue #34 section 4): the routing and LESSOR logic on the fake
fabric's tables, the read-back's conversion from os-ken's parser objects,
and the adapter's read-back (parts, errors, time-outs, stale connections)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from os_ken.ofproto import ofproto_v1_3 as ofp, ofproto_v1_3_parser as parser

from apps.routing.logic import DestinationRouting
from bwtesting.fakenet import FakeNetwork
from controller import ofmsg, ofread
from controller.network_view import NetworkView
from controller.pipeline import (APP_LESSOR, APP_PRIO_QUEUES, APP_ROUTING, COOKIE_APP_MASK, METER_LESSOR_BASE,
                                 TABLE_CLASSIFY, TABLE_FORWARD, cookie)
from controller.topology import TopologyDescription
from mininet_topos import builders


def _topo_with_vms():
    base = builders.fattree(4)
    hosts = [replace(h, vm_prefix="10.1.9.0/28") if h.name == "h9" else h for h in base.hosts]
    return TopologyDescription.from_dict({**base.to_dict(), "hosts": [
        {k: v for k, v in vars(h).items() if v is not None} for h in hosts]})


def _installed(multipath=True, down=()):
    """A fabric whose switches a controller installed (with links ``down``)."""
    view = NetworkView(_topo_with_vms())
    for sw, port in down:
        view.set_port_state(sw, port, False)
    logic = DestinationRouting(view, multipath=multipath, accounting=True)
    net = FakeNetwork(view)
    for sw in view.switches:
        net.apply(sw, logic.switch_connected(sw))
    assert not net.errors()
    return view, logic, net


def _routing_entries(net, sw):
    return {k: e.flow for k, e in net.switches[sw].entries.items()
            if e.flow.cookie & COOKIE_APP_MASK == cookie(APP_ROUTING)}


def _layouts(net, sw):
    """A switch's routing state with group ids replaced by their layouts (the
    ids are the switch's, not the view's)."""
    groups = {gid: tuple(b.actions[0].port for b in gm.buckets) for gid, gm in net.switches[sw].groups.items()}

    def plain(fm):
        ins = tuple(ofmsg.ApplyActions(tuple(("group", groups[a.group_id]) if isinstance(a, ofmsg.GroupAction)
                                             else a for a in i.actions)) if isinstance(i, ofmsg.ApplyActions)
                    else i for i in fm.instructions)
        return replace(fm, instructions=ins)
    return {k: plain(fm) for k, fm in _routing_entries(net, sw).items()}, sorted(groups.values())


def _apply_watching(net, sw, msgs, keep):
    """Apply one message at a time; after each, every key in ``keep`` must
    still be in the switch (make-before-break). Returns the deletes sent."""
    deletes = []
    for m in msgs:
        net.apply(sw, [m])
        if getattr(m, "command", "").startswith("delete"):
            deletes.append(m)
        missing = [k for k in keep if k not in net.switches[sw].entries]
        assert not missing, (m, missing[:3])
    return deletes


def _all_delivered(view, net):
    for src in view.hosts:
        for dst in view.hosts:
            if src != dst:
                assert net.trace(src, net.packet(src, dst)).delivered_to == dst, (src, dst)


# ---- the routing logic ------------------------------------------------------------------
@pytest.mark.parametrize("multipath", [True, False])
def test_a_controller_restart_keeps_every_entry_and_group_and_deletes_nothing(multipath):
    """A new controller (fresh logic) meets switches that hold what the old
    one installed: each entry is added over itself, the group ids are kept,
    and not one delete is sent."""
    view, old, net = _installed(multipath)
    before = {sw: (set(net.switches[sw].entries), dict(net.switches[sw].groups)) for sw in view.switches}
    new = DestinationRouting(view, multipath=multipath, accounting=True)
    for sw in view.switches:
        msgs = new.switch_reconciled(sw, net.held(sw))
        assert _apply_watching(net, sw, msgs, before[sw][0]) == []
        assert not any(isinstance(m, ofmsg.GroupMod) for m in msgs)          # every group adopted as it is
        assert (set(net.switches[sw].entries), net.switches[sw].groups) == before[sw]
    assert not net.errors()
    _all_delivered(view, net)
    # the new logic's state is the switch's: a later update is a plain diff
    assert all(new.switch_update(sw) == [] for sw in view.switches)


def test_a_switch_that_lost_its_tables_gets_what_a_fresh_install_gives():
    view, logic, net = _installed()
    want = {sw: _layouts(net, sw) for sw in view.switches}
    for sw in view.switches:
        net.restart(sw)
        msgs = logic.switch_reconciled(sw, net.held(sw))
        assert not any(getattr(m, "command", "").startswith("delete") for m in msgs)
        net.apply(sw, msgs)
        assert _layouts(net, sw) == want[sw]
    assert not net.errors()
    _all_delivered(view, net)


def test_a_link_that_failed_while_the_controller_was_away_is_routed_around_without_a_gap():
    """The switches hold routes through a link that went down meanwhile:
    the entries are replaced in place, the groups whose layout lost the link
    are replaced by new ones (ids above every held id), the old groups go last."""
    _, _, net = _installed()
    port = net.view.port("a0_0", "c1")
    view = NetworkView(_topo_with_vms())
    view.set_port_state("a0_0", port, False)
    view.set_port_state("c1", view.port("c1", "a0_0"), False)
    fresh = FakeNetwork(view)
    logic = DestinationRouting(view, multipath=True, accounting=True)
    for sw in view.switches:
        fresh.apply(sw, DestinationRouting(view, multipath=True, accounting=True).switch_connected(sw))
    net.view = view
    for sw in view.switches:
        held = net.held(sw)
        wanted = set(_routing_entries(fresh, sw))
        msgs = logic.switch_reconciled(sw, held)
        _apply_watching(net, sw, msgs, wanted & set(held.flows))
        new_ids = {m.group_id for m in msgs if isinstance(m, ofmsg.GroupMod) and m.command == "add"}
        assert all(gid > max(held.groups, default=0) for gid in new_ids)
        dead = [m.group_id for m in msgs if isinstance(m, ofmsg.GroupMod) and m.command == "delete"]
        assert msgs[-len(dead):] == [ofmsg.group_delete(g) for g in dead] if dead else True
        assert _layouts(net, sw) == _layouts(fresh, sw), sw
    assert not net.errors()
    _all_delivered(view, net)


def test_a_link_that_came_back_while_the_controller_was_away_gets_new_groups_above_the_held_ids():
    """The switches were installed with a0_0 - c1 down; the new view has it up:
    a0_0's and c1's new multi-hop layouts get fresh group ids, above every
    id held, so no add collides with a group the switch holds."""
    view_old, _, net = _installed(down=[("a0_0", NetworkView(builders.fattree(4)).port("a0_0", "c1")),
                                        ("c1", NetworkView(builders.fattree(4)).port("c1", "a0_0"))])
    view = NetworkView(_topo_with_vms())
    fresh = FakeNetwork(view)
    for sw in view.switches:
        fresh.apply(sw, DestinationRouting(view, multipath=True, accounting=True).switch_connected(sw))
    logic = DestinationRouting(view, multipath=True, accounting=True)
    net.view = view
    net.apply("a0_0", [ofmsg.GroupMod("add", "all", 1, (ofmsg.Bucket((ofmsg.Output(1),)),))])  # nobody's group
    added = 0
    for sw in view.switches:
        held = net.held(sw)
        msgs = logic.switch_reconciled(sw, held)
        new_ids = {m.group_id for m in msgs if isinstance(m, ofmsg.GroupMod) and m.command == "add"}
        assert all(gid > max(held.groups, default=0) for gid in new_ids), sw
        added += len(new_ids)
        _apply_watching(net, sw, msgs, set(_routing_entries(fresh, sw)) & set(held.flows))
        assert _layouts(net, sw) == _layouts(fresh, sw), sw
    assert added > 0 and not net.errors()
    _all_delivered(view, net)


def test_other_apps_entries_and_unknown_groups_are_left_alone_or_replaced():
    view, _, net = _installed()
    sw = "e0_0"
    theirs = ofmsg.flow_add(TABLE_CLASSIFY, 100, ofmsg.Match.of(eth_type=0x800, ip_dscp=8), goto=TABLE_FORWARD,
                            cookie=cookie(APP_PRIO_QUEUES, 3))
    stale = ofmsg.flow_add(TABLE_FORWARD, 100, ofmsg.Match.of(eth_type=0x800, ipv4_dst="10.9.9.9"),
                           [ofmsg.Output(1)], cookie=cookie(APP_ROUTING))
    odd = ofmsg.GroupMod("add", "all", 77, (ofmsg.Bucket((ofmsg.Output(1), ofmsg.Output(2))),))
    net.apply(sw, [theirs, stale, odd])
    held = net.held(sw)
    assert held.groups[77] is None
    msgs = DestinationRouting(view, multipath=True, accounting=True).switch_reconciled(sw, held)
    assert msgs[-2:] == [ofmsg.flow_delete_strict(TABLE_FORWARD, 100, stale.match, cookie(APP_ROUTING),
                                                  COOKIE_APP_MASK), ofmsg.group_delete(77)]
    net.apply(sw, msgs)
    entries = net.switches[sw].entries
    assert (TABLE_CLASSIFY, 100, theirs.match) in entries and (TABLE_FORWARD, 100, stale.match) not in entries
    assert 77 not in net.switches[sw].groups and not net.errors()


_SWITCHES = sorted(NetworkView(builders.fattree(4)).switches)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sw=st.sampled_from(_SWITCHES), keep=st.integers(0, 2**32), junk=st.lists(st.tuples(
    st.sampled_from([APP_ROUTING, APP_PRIO_QUEUES, APP_LESSOR]), st.integers(1, 250)), max_size=6),
    junk_groups=st.lists(st.tuples(st.integers(1, 40), st.lists(st.integers(1, 4), min_size=1, max_size=4)),
                         max_size=4),
    multipath=st.booleans())
def test_any_held_state_ends_as_the_view_wants_and_never_loses_a_wanted_entry(sw, keep, junk, junk_groups,
                                                                              multipath):
    """Hypothesis: a switch holding any subset of its entries, routing
    entries nobody wants, other apps' entries and any groups (ids colliding
    with routing's included) ends with exactly the wanted routing entries and
    groups, the other apps' entries untouched, no error, and no wanted entry
    it held is ever missing between two messages."""
    view, logic, net = _installed(multipath)
    want = _layouts(net, sw)
    s = net.switches[sw]
    for i, key in enumerate(sorted(s.entries, key=repr)):
        if not keep >> (i % 32) & 1:
            del s.entries[key]
    for gid, ports in junk_groups:
        if gid not in s.groups:
            s.apply(ofmsg.group_select(gid, ports))
    theirs = set()
    for app, n in junk:
        fm = ofmsg.flow_add(TABLE_FORWARD, 50 + n, ofmsg.Match.of(eth_type=0x800, ipv4_dst=f"10.200.{app}.{n}"),
                            [ofmsg.Output(1)], cookie=cookie(app))
        s.apply(fm)
        if app != APP_ROUTING:
            theirs.add(fm.match)
    held = net.held(sw)
    new = DestinationRouting(view, multipath=multipath, accounting=True)
    msgs = new.switch_reconciled(sw, held)
    wanted_held = set(want[0]) & set(held.flows)
    _apply_watching(net, sw, msgs, wanted_held)
    assert _layouts(net, sw) == want
    assert {k[2] for k, e in s.entries.items() if e.flow.cookie >> 48 != APP_ROUTING and k[1] != 0} >= theirs
    assert not net.errors()


# ---- LESSOR's own entries and meters -------------------------------------------------------
def _exact(src, dst, port, sport=1):
    return ofmsg.flow_add(TABLE_FORWARD, 1000, ofmsg.Match.of(eth_type=0x800, ip_proto=6, ipv4_src=src,
                                                               ipv4_dst=dst, tcp_src=sport, tcp_dst=2),
                          [ofmsg.Output(port)], cookie=cookie(APP_LESSOR), idle_timeout=10)


def test_lessor_adopts_the_entries_a_restarted_controller_meets_but_not_those_on_a_dead_link():
    """After a controller restart LESSOR owns no flow: the exact entries the
    switches hold keep their flows where they are (not all moved back to the
    routes at once), except those that output to a link that is down; LESSOR
    meters no policed flow wants go (with the entries using them);
    prio_queues' meters (below the LESSOR range) stay."""
    from apps.lessor.logic import LessorLogic
    view = NetworkView(builders.fattree(4))
    net = FakeNetwork(view)
    for sw in view.switches:
        net.apply(sw, LessorLogic(view).switch_connected(sw))
    sw = "e0_0"
    up, dead = view.port(sw, "a0_0"), view.port(sw, "a0_1")
    kept, on_dead = _exact("10.0.0.1", "10.0.0.16", up), _exact("10.0.0.2", "10.0.0.15", dead)
    metered = _exact("10.0.0.1", "10.0.0.12", up, sport=7)
    net.apply(sw, [kept, on_dead, ofmsg.MeterMod("add", METER_LESSOR_BASE + 3, 1000, 100),
                   ofmsg.MeterMod("add", 2, 500, 50),
                   replace(metered, instructions=(ofmsg.MeterInstruction(METER_LESSOR_BASE + 3),
                                                  *metered.instructions))])
    view.set_port_state(sw, dead, False)
    held = net.held(sw)
    msgs = LessorLogic(view).switch_reconciled(sw, held)       # a restarted controller: no flow of its own yet
    assert ofmsg.flow_delete(cookie(APP_LESSOR), COOKIE_APP_MASK, TABLE_FORWARD, out_port=dead) in msgs
    assert msgs[-1] == ofmsg.MeterMod("delete", METER_LESSOR_BASE + 3)
    assert not any(isinstance(m, ofmsg.FlowMod) and m.command == "delete_strict" for m in msgs)
    before = net.switches[sw].entries[(TABLE_FORWARD, 1000, kept.match)]
    net.apply(sw, msgs)
    entries = net.switches[sw].entries
    assert entries[(TABLE_FORWARD, 1000, kept.match)] is before                    # untouched
    assert (TABLE_FORWARD, 1000, on_dead.match) not in entries
    assert (TABLE_FORWARD, 1000, metered.match) not in entries
    assert net.switches[sw].meters.keys() == {2} and not net.errors()


def test_a_link_going_down_takes_every_lessor_entry_that_outputs_to_it_on_both_ends():
    from apps.lessor.logic import LessorLogic
    view = NetworkView(builders.fattree(4))
    net = FakeNetwork(view)
    lessor = LessorLogic(view)
    for sw in view.switches:
        net.apply(sw, lessor.switch_connected(sw))
    p_e, p_a = view.port("e0_0", "a0_0"), view.port("a0_0", "e0_0")
    adopted_up = _exact("10.0.0.1", "10.0.0.16", p_e)              # no flow LESSOR knows
    adopted_down = _exact("10.0.0.16", "10.0.0.1", p_a)
    other = _exact("10.0.0.1", "10.0.0.12", view.port("e0_0", "a0_1"))
    net.apply("e0_0", [adopted_up, other])
    net.apply("a0_0", [adopted_down])
    out = lessor.link_changed("e0_0", p_e, False)
    for sw, msgs in out.items():
        net.apply(sw, msgs)
    assert (TABLE_FORWARD, 1000, adopted_up.match) not in net.switches["e0_0"].entries
    assert (TABLE_FORWARD, 1000, adopted_down.match) not in net.switches["a0_0"].entries
    assert (TABLE_FORWARD, 1000, other.match) in net.switches["e0_0"].entries
    assert not net.errors()
    # a host's port: the edge switch alone
    out = lessor.link_changed("e0_0", view.port("e0_0", "h1"), False)
    assert ofmsg.flow_delete(cookie(APP_LESSOR), COOKIE_APP_MASK, TABLE_FORWARD,
                             out_port=view.port("e0_0", "h1")) in out["e0_0"]
    assert "h1" not in out


def test_lessor_modifies_a_meter_the_switch_holds_and_adds_one_it_lacks():
    from apps.lessor.logic import LessorLogic, Policed
    view = NetworkView(builders.fattree(4))
    lessor = LessorLogic(view)
    key = ("10.0.0.1", "10.0.0.16", 6, 1, 2)
    path = ("h1", "e0_0", "a0_0", "c1", "a3_0", "e3_1", "h16")
    pol = Policed(path=path, meter_id=METER_LESSOR_BASE, rate_kbps=2000)
    lessor.policed[key] = pol
    held = ofmsg.Held(meters={METER_LESSOR_BASE})
    meters = [m for m in lessor.switch_reconciled("e0_0", held) if isinstance(m, ofmsg.MeterMod)]
    assert [m.command for m in meters] == ["modify"]
    meters = [m for m in lessor.switch_reconciled("e0_0", ofmsg.Held()) if isinstance(m, ofmsg.MeterMod)]
    assert [m.command for m in meters] == ["add"]


# ---- what comes back from a switch ---------------------------------------------------------
def test_every_match_routing_installs_reads_back_equal_through_os_kens_wire_format():
    view, logic, net = _installed()
    seen = 0
    for sw in view.switches:
        for (table, prio, match), fm in _routing_entries(net, sw).items():
            buf = bytearray()
            parser.OFPMatch(**match.as_dict()).serialize(buf, 0)
            back = parser.OFPMatch.parser(bytes(buf), 0)
            assert ofread.match_of(back) == match, match
            seen += any(isinstance(v, tuple) for _, v in match.fields)
    assert seen > 0                                       # masked (VM block) matches among them


def test_group_layouts_read_back_and_anything_else_is_none():
    b = [parser.OFPBucket(1, p, ofp.OFPG_ANY, [parser.OFPActionOutput(p)]) for p in (3, 3, 4, 4)]
    assert ofread.layout(parser.OFPGroupDescStats(ofp.OFPGT_SELECT, 5, b)) == (3, 3, 4, 4)
    assert ofread.layout(parser.OFPGroupDescStats(ofp.OFPGT_ALL, 5, b)) is None
    two = [parser.OFPBucket(1, 3, ofp.OFPG_ANY, [parser.OFPActionOutput(3), parser.OFPActionOutput(4)])]
    assert ofread.layout(parser.OFPGroupDescStats(ofp.OFPGT_SELECT, 5, two)) is None
    other = [parser.OFPBucket(1, 3, ofp.OFPG_ANY, [parser.OFPActionSetQueue(1)])]
    assert ofread.layout(parser.OFPGroupDescStats(ofp.OFPGT_SELECT, 5, other)) is None
    assert ofread.layout(parser.OFPGroupDescStats(ofp.OFPGT_SELECT, 5, [])) == ()
    assert ofread.groups([parser.OFPGroupDescStats(ofp.OFPGT_SELECT, 9, b[:1])]) == {9: (3,)}
    assert ofread.meters([parser.OFPMeterConfigStats(0, 1025, []), parser.OFPMeterConfigStats(0, 7, [])]) == {
        7, 1025}
    fs = parser.OFPFlowStats(table_id=1, duration_sec=0, duration_nsec=0, priority=100, idle_timeout=0,
                             hard_timeout=0, flags=0, cookie=cookie(APP_ROUTING), packet_count=0, byte_count=0,
                             match=parser.OFPMatch(eth_type=0x800, ipv4_dst=("10.1.9.0", "255.255.255.240")),
                             instructions=[])
    assert ofread.flows([fs]) == {(1, 100, ofmsg.Match.of(eth_type=0x800, ipv4_dst=("10.1.9.0", "255.255.255.240"))):
                                  cookie(APP_ROUTING)}


def test_held_owned_lists_one_apps_keys_in_order():
    m = [ofmsg.Match.of(ipv4_dst=f"10.0.0.{i}") for i in range(3)]
    held = ofmsg.Held(flows={(1, 100, m[2]): cookie(APP_ROUTING), (1, 100, m[0]): cookie(APP_ROUTING, 7),
                             (0, 5, m[1]): cookie(APP_LESSOR), (1, 1, m[1]): cookie(APP_ROUTING)})
    assert held.owned(cookie(APP_ROUTING)) == [(1, 1, m[1]), (1, 100, m[0]), (1, 100, m[2])]
    assert held.owned(cookie(APP_LESSOR, 99)) == [(0, 5, m[1])]
    assert held.owned(cookie(APP_PRIO_QUEUES)) == []


# ---- the adapter: read-back in parts, refusals, time-outs, stale connections --------------
@pytest.fixture
def ecmp(tmp_path, monkeypatch):
    from apps.routing.ecmp import EcmpApp
    path = tmp_path / "t.json"
    _topo_with_vms().save(path)
    monkeypatch.setenv("BWFABRIC_TOPOLOGY", str(path))
    inst = EcmpApp()
    return inst, inst.view


def _features(inst, dp):
    from os_ken.controller import ofp_event
    from bwtesting.readback import Msg
    inst._switch_features(ofp_event.EventOFPSwitchFeatures(Msg(dp)))
    return {type(m).__name__: m for m in dp.sent}


def _reply(inst, dp, req, body, more=False):
    from bwtesting.readback import Msg, bodies
    event = bodies(ofmsg.Held())[type(req).__name__][0]
    handler = {"OFPFlowStatsRequest": inst._flow_stats, "OFPGroupDescStatsRequest": inst._group_desc,
               "OFPMeterConfigStatsRequest": inst._meter_config}[type(req).__name__]
    handler(event(Msg(dp, xid=req.xid, flags=ofp.OFPMPF_REPLY_MORE if more else 0, body=body)))


def test_the_adapter_gathers_every_part_then_reconciles_once_without_a_delete(ecmp):
    from bwtesting.readback import bodies
    from tests.unit.test_apps_smoke import RecordingDatapath
    inst, view = ecmp
    _, _, net = _installed()
    held = net.held("a1_0")
    dp = RecordingDatapath(view.dpid("a1_0"))
    reqs = _features(inst, dp)
    got = bodies(held)
    flows = got["OFPFlowStatsRequest"][1]
    assert len(flows) > 4
    _reply(inst, dp, reqs["OFPFlowStatsRequest"], flows[:3], more=True)
    _reply(inst, dp, reqs["OFPGroupDescStatsRequest"], got["OFPGroupDescStatsRequest"][1])
    _reply(inst, dp, reqs["OFPMeterConfigStatsRequest"], [])
    assert len(dp.sent) == 4 and "a1_0" in inst.readings          # the entries are not all in yet
    _reply(inst, dp, reqs["OFPFlowStatsRequest"], flows[3:])
    sent = dp.sent[4:]
    assert "a1_0" not in inst.readings and inst.reconciles == {"read": 1}
    assert len(sent) == len(inst.logic.switch_reconciled("a1_0", held))
    assert not any(type(m).__name__ == "OFPGroupMod" or m.command in (ofp.OFPFC_DELETE, ofp.OFPFC_DELETE_STRICT)
                   for m in sent)
    assert inst.last_reconcile["a1_0"]["held_flows"] == len(held.flows)
    assert inst.last_reconcile["a1_0"]["deletes"] == 0
    # a late duplicate of a part changes nothing
    _reply(inst, dp, reqs["OFPFlowStatsRequest"], flows[3:])
    assert len(dp.sent) == 4 + len(sent)


def test_a_switch_without_meters_is_reconciled_and_one_refusing_its_entries_is_wiped(ecmp):
    from os_ken.controller import ofp_event
    from bwtesting.readback import Msg
    from tests.unit.test_apps_smoke import RecordingDatapath
    inst, view = ecmp
    dp = RecordingDatapath(view.dpid("e1_0"))
    reqs = _features(inst, dp)
    _reply(inst, dp, reqs["OFPGroupDescStatsRequest"], [])
    inst._error(ofp_event.EventOFPErrorMsg(Msg(dp, xid=reqs["OFPMeterConfigStatsRequest"].xid, type=1, code=2)))
    _reply(inst, dp, reqs["OFPFlowStatsRequest"], [])
    assert inst.reconciles == {"read": 1}
    other = RecordingDatapath(view.dpid("e1_1"))
    reqs = _features(inst, other)
    inst._error(ofp_event.EventOFPErrorMsg(Msg(other, xid=reqs["OFPFlowStatsRequest"].xid, type=1, code=2)))
    assert inst.reconciles == {"read": 1, "wiped": 1} and "e1_1" not in inst.readings
    third = RecordingDatapath(view.dpid("e3_1"))
    reqs3 = _features(inst, third)
    inst._error(ofp_event.EventOFPErrorMsg(Msg(third, xid=reqs3["OFPGroupDescStatsRequest"].xid, type=1, code=2)))
    assert inst.reconciles == {"read": 1, "wiped": 2} and "e3_1" not in inst.readings
    wiped = other.sent[4:]
    assert wiped[0].command == ofp.OFPFC_DELETE and wiped[0].cookie == cookie(APP_ROUTING)
    # an error that answers no read-back is nobody's business here
    inst._error(ofp_event.EventOFPErrorMsg(Msg(other, xid=9999, type=1, code=2)))
    assert inst.reconciles == {"read": 1, "wiped": 2}


def test_a_switch_silent_past_the_deadline_is_wiped_and_a_late_reply_is_ignored(ecmp, monkeypatch):
    from controller import app_base
    from tests.unit.test_apps_smoke import RecordingDatapath
    inst, view = ecmp
    # a deadline for a reading already done does nothing
    dp2 = RecordingDatapath(view.dpid("c3"))
    reqs2 = _features(inst, dp2)
    reading = inst.readings["c3"]
    for kind in ("OFPGroupDescStatsRequest", "OFPMeterConfigStatsRequest", "OFPFlowStatsRequest"):
        _reply(inst, dp2, reqs2[kind], [])
    dp = RecordingDatapath(view.dpid("c2"))
    reqs = _features(inst, dp)
    monkeypatch.setattr(app_base.hub, "sleep", lambda s: None)
    inst._reading_deadline("c3", reading)
    assert inst.reconciles == {"read": 1}
    inst._reading_deadline("c2", inst.readings["c2"])
    assert inst.reconciles == {"read": 1, "wiped": 1} and len(dp.sent) > 4
    n = len(dp.sent)
    _reply(inst, dp, reqs["OFPGroupDescStatsRequest"], [])
    _reply(inst, dp, reqs["OFPMeterConfigStatsRequest"], [])
    _reply(inst, dp, reqs["OFPFlowStatsRequest"], [])
    assert len(dp.sent) == n and inst.reconciles == {"read": 1, "wiped": 1}


def test_a_reply_for_a_connection_that_went_away_is_ignored(ecmp):
    from os_ken.controller import ofp_event
    from tests.unit.test_apps_smoke import RecordingDatapath
    inst, view = ecmp
    old = RecordingDatapath(view.dpid("e2_0"))
    reqs = _features(inst, old)
    inst._disconnected(ofp_event.EventOFPStateChange(old))
    assert inst.readings == {}
    new = RecordingDatapath(view.dpid("e2_0"))
    new.xid = 100
    new_reqs = _features(inst, new)
    for kind in ("OFPGroupDescStatsRequest", "OFPMeterConfigStatsRequest", "OFPFlowStatsRequest"):
        _reply(inst, old, reqs[kind], [])
    assert "e2_0" in inst.readings and inst.reconciles == {}
    for kind in ("OFPGroupDescStatsRequest", "OFPMeterConfigStatsRequest", "OFPFlowStatsRequest"):
        _reply(inst, new, new_reqs[kind], [])
    assert inst.reconciles == {"read": 1} and old.sent == list(reqs.values())


def test_an_entrys_single_output_is_read_back_and_others_are_not():
    """ofread.outputs: the port of an entry whose actions output to exactly
    one port (what an adopted LESSOR entry is judged by); none for no
    output, two outputs, or a group."""
    m = parser.OFPMatch(eth_type=0x800, ipv4_dst="10.0.0.7")

    def stats(prio, instructions):
        return parser.OFPFlowStats(table_id=1, duration_sec=0, duration_nsec=0, priority=prio, idle_timeout=0,
                                   hard_timeout=0, flags=0, cookie=0, packet_count=0, byte_count=0, match=m,
                                   instructions=instructions)
    apply = lambda *acts: [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, list(acts))]   # noqa: E731
    bodies = [stats(1, apply(parser.OFPActionOutput(3))),
              stats(2, [parser.OFPInstructionMeter(7), *apply(parser.OFPActionSetQueue(1),
                                                              parser.OFPActionOutput(4))]),
              stats(3, apply(parser.OFPActionOutput(3), parser.OFPActionOutput(4))),
              stats(4, apply(parser.OFPActionGroup(9))),
              stats(5, [parser.OFPInstructionGotoTable(2)])]
    key = lambda prio: (1, prio, ofread.match_of(m))   # noqa: E731
    assert ofread.outputs(bodies) == {key(1): 3, key(2): 4}
    # and the fake switches' read-back (bwtesting.readback) carries them the same way
    from bwtesting.readback import bodies as reply_bodies
    held = ofmsg.Held(flows={key(1): 5, key(6): 5}, outputs={key(1): 3})
    _, flows = reply_bodies(held)["OFPFlowStatsRequest"]
    assert ofread.outputs(flows) == {key(1): 3}
