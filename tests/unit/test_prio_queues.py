"""BG/WC classification on the fake network, composed with a routing app:
each ToS reaches the right queue at every hop; unknown ToS is rewritten to
WC at the first switch; UDP is BG whatever its ToS; forwarding is untouched."""

import struct

import pytest

from apps.prio_queues.logic import DSCP_BG, DSCP_WC, QUEUE_BG, QUEUE_WC, PrioQueuesLogic
from apps.routing.logic import DestinationRouting
from bwtesting.fakenet import FakeNetwork
from controller.network_view import NetworkView
from mininet_topos import builders


@pytest.fixture(params=["ecmp", "lessor"])
def net(request):
    view = NetworkView(builders.fattree(4, link_mbps=10))
    routing = DestinationRouting(view, multipath=True, accounting=request.param == "lessor")
    prio = PrioQueuesLogic()
    fake = FakeNetwork(view)
    for sw in view.switches:
        # either order: the two apps own different cookies and tables
        fake.apply(sw, prio.switch_connected(sw))
        fake.apply(sw, routing.switch_connected(sw))
        fake.apply(sw, prio.switch_connected(sw))   # a reconnect replaces, never duplicates
    assert fake.errors() == {}
    return fake


def test_bg_and_wc_tos_go_to_their_queues_at_every_hop(net):
    for dscp, queue in ((DSCP_BG, QUEUE_BG), (DSCP_WC, QUEUE_WC)):
        trace = net.trace("h1", net.packet("h1", "h16", proto="tcp", dscp=dscp))
        assert trace.delivered_to == "h16" and len(trace.hops) == 5
        assert [h.queue_id for h in trace.hops] == [queue] * 5
        assert all(h.pkt["ip_dscp"] == dscp for h in trace.hops)


@pytest.mark.parametrize("dscp", [DSCP_BG, DSCP_WC, 46, 10, 63])
def test_udp_counts_as_bg_whatever_its_tos(net, dscp):
    trace = net.trace("h1", net.packet("h1", "h16", proto="udp", dscp=dscp))
    assert trace.delivered_to == "h16" and len(trace.hops) == 5
    assert [h.queue_id for h in trace.hops] == [QUEUE_BG] * 5
    assert all(h.pkt["ip_dscp"] == DSCP_BG for h in trace.hops)     # rewritten at the first switch


@pytest.mark.parametrize("dscp", [46, 10, 1, 63, 9, 7])   # EF, AF11, odd values next to 0x20
def test_unknown_tos_is_rewritten_to_wc_at_the_first_switch(net, dscp):
    trace = net.trace("h2", net.packet("h2", "h9", dscp=dscp))
    assert trace.delivered_to == "h9"
    assert trace.hops[0].pkt["ip_dscp"] == DSCP_WC                 # first switch rewrote it
    assert [h.queue_id for h in trace.hops] == [QUEUE_WC] * len(trace.hops)


def test_non_ip_is_forwarded_on_the_default_queue(net):
    trace = net.trace("h1", net.packet("h1", "h16", proto="arp"))
    assert trace.delivered_to == "h16" and all(h.queue_id in (None, QUEUE_BG) for h in trace.hops)
    assert net.packet_ins == []


def test_tc_backend_plan_guarantees_bg_and_lets_wc_borrow():
    from mininet_topos.queues import BackendError, PortQueues, ovsdb_plan, tc_plan
    from hostagent import plan as P
    q = PortQueues.of("e0_0-eth3", 10e6, 225000)
    steps = tc_plan(q)
    classes = {s.classid: s for s in steps if isinstance(s, P.TcClass)}
    assert classes[P.CLASS_BG].rate_bps == 9_900_000 and classes[P.CLASS_BG].prio == 0
    assert classes[P.CLASS_WC].rate_bps == 100_000 and classes[P.CLASS_WC].ceil_bps == 10_000_000
    assert classes[P.CLASS_WC].prio == 1
    assert [s for s in steps if isinstance(s, P.TcFilter)] == [P.TcFilter("e0_0-eth3", 1, (0x20, 0xFC), P.CLASS_WC)]
    assert steps[0] == P.TcQdisc("e0_0-eth3", "1:", P.CLASS_BG)          # non-IP and ToS 0 -> BG
    assert {s.limit_bytes for s in steps if isinstance(s, P.TcLeaf)} == {225000}
    args = ovsdb_plan(q)
    assert "queues:0=@bg" in args and "queues:1=@wc" in args and "other-config:priority=1" in args
    assert "other-config:min-rate=9900000" in args
    with pytest.raises(BackendError, match="e0_0-eth3"):
        PortQueues.of("e0_0-eth3", 0, 1000)


def test_a_reconnect_with_new_guarantees_leaves_no_stale_meter_or_entry():
    """The controller restarts with s4's guarantee gone while the switch
    kept its tables: s4's meter and metered entries must go (the wipe), s1's
    stay, nothing duplicated; and a restarted (empty) switch gets it all."""
    view = NetworkView(builders.bgwc_testbed(link_mbps=100))
    routing = DestinationRouting(view, multipath=False)
    before = PrioQueuesLogic(view, {"s1": 35, "s4": 10})
    after = PrioQueuesLogic(view, {"s1": 35})
    fake = FakeNetwork(view)
    sl = "sl"
    for sw in view.switches:
        fake.apply(sw, routing.switch_connected(sw))
        fake.apply(sw, before.switch_connected(sw))
    port_s4 = view.host_switch("s4")[1]
    assert port_s4 in fake.switches[sl].meters
    fake.apply(sl, after.switch_connected(sl))               # tables kept: a controller reconnect
    assert fake.errors() == {}
    sw = fake.switches[sl]
    assert port_s4 not in sw.meters and all(e.match.as_dict().get("in_port") != port_s4
                                            for e in sw.flows(0))
    bg = fake.trace("s4", fake.packet("s4", "s5", dscp=DSCP_BG))
    assert bg.hops[0].meters == ()
    fake.restart(sl)                                          # a switch restart: empty tables
    fake.apply(sl, routing.switch_connected(sl))
    fake.apply(sl, after.switch_connected(sl))
    s1 = fake.trace("s1", fake.packet("s1", "s5", dscp=DSCP_BG))
    assert s1.delivered_to == "s5" and s1.hops[0].meters == (view.host_switch("s1")[1],)


def test_tor_meters_cap_bg_from_hosts_with_a_guarantee():
    view = NetworkView(builders.bgwc_testbed(link_mbps=100))
    prio = PrioQueuesLogic(view, {"s1": 35, "s4": 10})
    routing = DestinationRouting(view, multipath=False)
    fake = FakeNetwork(view)
    for sw in view.switches:
        fake.apply(sw, routing.switch_connected(sw))
        fake.apply(sw, prio.switch_connected(sw))
        fake.apply(sw, prio.switch_connected(sw))          # reconnect: meters re-created, no error
    assert fake.errors() == {}
    sl = fake.switches["sl"]
    port_s1 = view.host_switch("s1")[1]
    assert sl.meters[port_s1].rate_kbps == 35000 and len(sl.meters) == 2
    # bucket: 50 ms at 35 Mb/s = 1750 kbit; s4's 10 Mb/s would give 500 kbit,
    # under two 64 KiB GSO super-packets -> the floor of 1048 kbit
    assert sl.meters[port_s1].burst_kbit == 1750
    assert sl.meters[view.host_switch("s4")[1]].burst_kbit == 1048
    bg = fake.trace("s1", fake.packet("s1", "s5", dscp=DSCP_BG))
    assert bg.delivered_to == "s5" and bg.hops[0].meters == (port_s1,) and bg.hops[0].queue_id == QUEUE_BG
    assert all(h.meters == () for h in bg.hops[1:])               # metered once, at the ToR
    wc = fake.trace("s1", fake.packet("s1", "s5", dscp=DSCP_WC))
    assert wc.hops[0].meters == () and wc.hops[0].queue_id == QUEUE_WC
    free = fake.trace("s2", fake.packet("s2", "s6", dscp=DSCP_BG))  # no guarantee configured: not metered
    assert free.hops[0].meters == ()
    for dscp in (DSCP_BG, DSCP_WC, 46):          # UDP is BG whatever its marking, so it meets the meter
        udp = fake.trace("s1", fake.packet("s1", "s5", proto="udp", dscp=dscp))
        assert udp.delivered_to == "s5" and udp.hops[0].meters == (port_s1,)
        assert [h.queue_id for h in udp.hops] == [QUEUE_BG] * len(udp.hops)
        assert all(h.pkt["ip_dscp"] == DSCP_BG for h in udp.hops)


def test_bad_guarantees_are_refused_naming_them():
    view = NetworkView(builders.bgwc_testbed(link_mbps=100))
    with pytest.raises(ValueError) as exc:
        PrioQueuesLogic(view, {"s9": 10, "s1": -1, "s2": 500, "sl": 5})
    for part in ("'s9' is not a host", "s1: guarantee -1", "s2: guarantee 500 Mb/s exceeds", "'sl' is not a host"):
        assert part in str(exc.value)


def test_the_meters_come_from_the_declared_tenants(app_config):
    from apps.prio_queues.app import PrioQueuesApp
    app_config(builders.bgwc_testbed(link_mbps=100), controller={"routing": "single_path"},
               agents={"master_key_file": "/nonexistent", "address_template": "unix:/x/{host}.sock"},
               tenants={"t": {"vms": {"v1": {"host": "s1", "guarantee_mbps": 35},
                                      "v2": {"host": "s5", "guarantee_mbps": 20}}}},
               prio_queues={"meter_headroom": 1.1})
    assert PrioQueuesApp().logic.guarantees == {"s1": pytest.approx(38.5), "s5": pytest.approx(22)}


def test_wc_aqm_parameters_and_map_value_layout():
    from mininet_topos.queues import aqm
    p = aqm.AqmParams.for_queue(225000)
    assert (p.min_bytes, p.max_bytes, p.max_p) == (75000, 150000, 0.1)
    assert aqm.AqmParams.for_queue(6000).min_bytes == 3000          # floors keep min < max
    for bad in ((0, 10, 0.1), (10, 10, 0.1), (10, 20, 0.0), (10, 20, 1.5)):
        with pytest.raises(aqm.AqmError):
            aqm.AqmParams(*bad)
    # struct aqm_port in bwf_aqm.bpf.c: 72 bytes, rate at 8, thresholds at 16/20, max_p at 24, counters
    # (seen, dropped, marked) last
    assert aqm._VALUE.size == 72
    raw = aqm._VALUE.pack(0, 100_000_000, 1, 2, 100_000, 0, 0, 0, 7, 3, 5)
    assert struct.unpack_from("<Q", raw, 8)[0] == 100_000_000 and struct.unpack_from("<II", raw, 16) == (1, 2)
    assert struct.unpack_from("<QQQ", raw, 48) == (7, 3, 5)
