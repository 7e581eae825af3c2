"""Per-flow counters at the ToR: learned in the data plane, no PacketIn."""

from apps.routing.logic import DestinationRouting
from controller import ofmsg
from bwtesting.fakenet import FakeNetwork
from controller.network_view import NetworkView
from controller.pipeline import APP_ACCOUNT, TABLE_ACCOUNT, cookie
from mininet_topos import builders


def _net():
    view = NetworkView(builders.fattree(4, link_mbps=10))
    routing = DestinationRouting(view, multipath=True, accounting=True)
    net = FakeNetwork(view)
    for sw in view.switches:
        net.apply(sw, routing.switch_connected(sw))
    assert net.errors() == {}
    return view, net


def _counters(net, switch):
    return {e.flow.match: e.packets for e in net.switches[switch].entries.values()
            if e.flow.table_id == TABLE_ACCOUNT and e.flow.cookie == cookie(APP_ACCOUNT)}


def test_first_packet_learns_a_counter_and_is_forwarded_at_once():
    view, net = _net()
    for i in range(3):
        trace = net.trace("h1", net.packet("h1", "h16", sport=1000))
        assert trace.delivered_to == "h16" and not trace.packet_in
    counters = _counters(net, "e0_0")
    want = ofmsg.Match.of(in_port=view.port("e0_0", "h1"), ipv4_src="10.0.0.1", ipv4_dst="10.0.0.16",
                          tcp_src=1000, tcp_dst=80, eth_type=0x800, ip_proto=6)
    assert counters == {want: 2}         # learned by packet 1, counted packets 2 and 3
    assert net.packet_ins == []


def test_counters_only_at_the_source_tor_and_per_five_tuple():
    view, net = _net()
    for sport in (1000, 1001):
        net.trace("h1", net.packet("h1", "h16", sport=sport))
        net.trace("h1", net.packet("h1", "h16", sport=sport))
    net.trace("h2", net.packet("h2", "h16", proto="udp", sport=5000, dport=6000))
    net.trace("h2", net.packet("h2", "h16", proto="udp", sport=5000, dport=6000))
    net.trace("h1", net.packet("h1", "h16", proto="arp"))
    assert len(_counters(net, "e0_0")) == 3                 # two TCP 5-tuples + one UDP
    for sw in view.switches:
        if sw != "e0_0":
            assert _counters(net, sw) == {}                 # not at the destination ToR, not in the core
    assert net.packet_ins == []


def test_every_pair_still_reachable_with_accounting():
    view, net = _net()
    for a in view.hosts:
        for b in view.hosts:
            if a != b:
                for proto in ("tcp", "udp", "arp"):
                    assert net.trace(a, net.packet(a, b, proto=proto)).delivered_to == b
    assert net.packet_ins == []
