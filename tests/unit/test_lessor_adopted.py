"""Exact entries a switch holds when it (re)connects that no flow of this
controller owns are adopted only while they send their flow downhill (one
hop nearer its destination): an entry left at a ToR whose aggregation
switch has lost its uplinks would be sent straight back down by that
switch's routes -- a forwarding loop (found by the LESSOR fuzz test, seen
once in ~1 500 seeds: the entry's deletion went out while the ToR was
disconnected)."""

from __future__ import annotations

import pytest

from controller import ofmsg
from controller.pipeline import APP_LESSOR, PRIO_EXACT_FLOW, TABLE_FORWARD, cookie

SRC, DST, SPORT, DPORT = "h15", "h7", 40000, 5201


@pytest.fixture
def fabric():
    from tests.unit.test_lessor_fakenet import _setup
    return _setup()          # a FatTree k = 4 with LESSOR's routes installed on every fake switch


def _stale_entry(view, tor, agg):
    """An exact entry of ``tor`` sending SRC -> DST up to ``agg`` (another
    controller's, or one whose deletion never reached the switch)."""
    match = ofmsg.Match.of(eth_type=ofmsg.ETH_TYPE_IP, ip_proto=ofmsg.IPPROTO_TCP, ipv4_src=view.ip(SRC),
                           ipv4_dst=view.ip(DST), tcp_src=SPORT, tcp_dst=DPORT)
    return ofmsg.flow_add(TABLE_FORWARD, PRIO_EXACT_FLOW, match, [ofmsg.Output(view.port(tor, agg))],
                          cookie=cookie(APP_LESSOR))


def _uplinks_down(view, logic, net, agg):
    changes = [(agg, view.port(agg, c), False) for c in view.graph.successors(agg)
               if view.graph.nodes[c].get("role") == "core"]
    for sw, msgs in logic.links_changed(changes).items():
        net.apply(sw, msgs)


def _trace(view, net):
    return net.trace(SRC, net.packet(SRC, DST, sport=SPORT, dport=DPORT))


def _tor_agg(view):
    tor = view.host_switch(SRC)[0]
    agg = sorted(n for n in view.graph.successors(tor) if view.graph.nodes[n].get("role") == "aggregation")[0]
    return tor, agg


def test_an_entry_sending_its_flow_uphill_is_not_adopted(fabric):
    view, logic, net = fabric
    tor, agg = _tor_agg(view)
    _uplinks_down(view, logic, net, agg)                 # agg now reaches DST only back through the ToRs
    net.apply(tor, [_stale_entry(view, tor, agg)])
    net.apply(tor, logic.switch_reconciled(tor, net.held(tor)))
    assert _trace(view, net).delivered_to == DST
    assert logic.adopted[tor] == {} and logic.adopted_deleted == 1


def test_an_adopted_entry_is_deleted_when_a_link_change_makes_it_uphill(fabric):
    view, logic, net = fabric
    tor, agg = _tor_agg(view)
    net.apply(tor, [_stale_entry(view, tor, agg)])
    net.apply(tor, logic.switch_reconciled(tor, net.held(tor)))
    assert len(logic.adopted[tor]) == 1                   # downhill now: kept (no flush on reconnect)
    trace = _trace(view, net)
    assert trace.delivered_to == DST and trace.path[1] == agg
    _uplinks_down(view, logic, net, agg)
    assert _trace(view, net).delivered_to == DST
    assert logic.adopted[tor] == {} and logic.state()["adopted_deleted"] == 1


def test_an_entry_whose_output_or_destination_is_unknown_is_deleted(fabric):
    view, logic, net = fabric
    tor, agg = _tor_agg(view)
    e = _stale_entry(view, tor, agg)
    elsewhere = ofmsg.flow_add(TABLE_FORWARD, PRIO_EXACT_FLOW, ofmsg.Match.of(
        eth_type=ofmsg.ETH_TYPE_IP, ip_proto=ofmsg.IPPROTO_TCP, ipv4_src=view.ip(SRC), ipv4_dst="10.99.0.1",
        tcp_src=1, tcp_dst=2), [ofmsg.Output(view.port(tor, agg))], cookie=cookie(APP_LESSOR))
    held = net.held(tor)
    net.apply(tor, [e, elsewhere])
    held = net.held(tor)
    no_output = ofmsg.Held(flows=held.flows, groups=held.groups, meters=held.meters,
                           outputs={k: p for k, p in held.outputs.items() if k[2] != e.match})
    msgs = logic.switch_reconciled(tor, no_output)
    deleted = {m.match for m in msgs if isinstance(m, ofmsg.FlowMod) and m.command == "delete_strict"}
    assert {e.match, elsewhere.match} <= deleted and logic.adopted[tor] == {}


def test_a_disconnected_switch_forgets_what_it_adopted(fabric):
    view, logic, net = fabric
    tor, agg = _tor_agg(view)
    net.apply(tor, [_stale_entry(view, tor, agg)])
    net.apply(tor, logic.switch_reconciled(tor, net.held(tor)))
    logic.switch_disconnected(tor)
    assert tor not in logic.adopted
