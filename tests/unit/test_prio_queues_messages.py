"""prio_queues' messages as the module's table specifies them, entry by
entry, and the edges of what it accepts (mutmut 3 left 93 of 315 mutants
of apps/prio_queues/logic.py alive with the behavioural tests alone: a
dropped cookie, the NIC bound as >=, the burst range's ends ...)."""

import math

import pytest

from apps.prio_queues import logic as L
from bwcommon import contract
from controller import ofmsg
from controller.network_view import NetworkView
from controller.pipeline import APP_PRIO_QUEUES, COOKIE_APP_MASK, TABLE_CLASSIFY, TABLE_FORWARD, cookie
from mininet_topos import builders

CK = cookie(APP_PRIO_QUEUES)
IP = ofmsg.ETH_TYPE_IP


@pytest.fixture(scope="module")
def view():
    return NetworkView(builders.fattree(4, link_mbps=10))


def _entry(prio, match, actions):
    return ofmsg.FlowMod(TABLE_CLASSIFY, prio, ofmsg.Match.of(**match),
                         (ofmsg.ApplyActions(tuple(actions)), ofmsg.GotoTable(TABLE_FORWARD)), "add", CK)


def test_the_classification_table_is_the_four_entries_of_the_docstring():
    assert L.classification_entries() == [
        _entry(303, dict(eth_type=IP, ip_proto=ofmsg.IPPROTO_UDP),
               [ofmsg.SetField("ip_dscp", 0), ofmsg.SetQueue(contract.QUEUE_BG)]),
        _entry(302, dict(eth_type=IP, ip_dscp=0), [ofmsg.SetQueue(contract.QUEUE_BG)]),
        _entry(302, dict(eth_type=IP, ip_dscp=8), [ofmsg.SetQueue(contract.QUEUE_WC)]),
        _entry(301, dict(eth_type=IP), [ofmsg.SetField("ip_dscp", 8), ofmsg.SetQueue(contract.QUEUE_WC)]),
    ]
    assert (L.PRIO_UDP, L.PRIO_KNOWN, L.PRIO_REWRITE, L.PRIO_METERED, L.PRIO_METERED_UDP) == (303, 302, 301, 310, 311)


def _metered(port, rate_kbps, burst_kbit):
    ins = lambda *actions: (ofmsg.MeterInstruction(port), ofmsg.ApplyActions(actions), ofmsg.GotoTable(TABLE_FORWARD))
    return [ofmsg.MeterMod("add", port, rate_kbps, burst_kbit),
            ofmsg.FlowMod(TABLE_CLASSIFY, 310, ofmsg.Match.of(in_port=port, eth_type=IP, ip_dscp=0),
                          ins(ofmsg.SetQueue(contract.QUEUE_BG)), "add", CK),
            ofmsg.FlowMod(TABLE_CLASSIFY, 311, ofmsg.Match.of(in_port=port, eth_type=IP, ip_proto=ofmsg.IPPROTO_UDP),
                          ins(ofmsg.SetField("ip_dscp", 0), ofmsg.SetQueue(contract.QUEUE_BG)), "add", CK)]


@pytest.mark.parametrize("burst", [None, 77])
def test_a_tor_gets_wiped_classified_its_host_ports_meters_cleared_and_its_guarantees_metered(view, burst):
    lg = L.PrioQueuesLogic(view, {"h1": 2.5, "h2": 0.5, "h16": 1.0}, burst_kbit=burst)
    sw, p1 = view.host_switch("h1")
    _, p2 = view.host_switch("h2")
    want = [ofmsg.flow_delete(CK, COOKIE_APP_MASK),
            *(ofmsg.MeterMod("delete", p) for p in sorted((p1, p2))),
            *_metered(p1, 2500, burst or contract.meter_burst_kbit(2500)),
            *_metered(p2, 500, burst or contract.meter_burst_kbit(500)),
            *L.classification_entries()]
    got = lg.switch_connected(sw)
    assert sorted(map(repr, got)) == sorted(map(repr, want))
    assert got == ofmsg.ordered(got)                     # meters exist before the entries that use them
    core = lg.switch_connected("c1")                     # no host behind it: no meter of any kind
    assert not any(isinstance(m, ofmsg.MeterMod) for m in core) and len(core) == 5


def test_update_touches_only_the_hosts_whose_guarantee_moved(view):
    lg = L.PrioQueuesLogic(view, {"h1": 2.0, "h2": 1.0, "h5": 1.0})
    sw1, p1 = view.host_switch("h1")
    _, p2 = view.host_switch("h2")
    sw5, p5 = view.host_switch("h5")
    sw16, p16 = view.host_switch("h16")
    out = lg.update({"h1": 3.0, "h2": 1.0, "h16": 0.5})      # h1 moved, h2 kept, h5 gone, h16 new
    assert out[sw1] == [ofmsg.MeterMod("modify", p1, 3000, contract.meter_burst_kbit(3000))]
    assert out[sw5] == [*(ofmsg.flow_delete_strict(TABLE_CLASSIFY, prio, m, cookie=CK) for prio, m in (
        (310, ofmsg.Match.of(in_port=p5, eth_type=IP, ip_dscp=0)),
        (311, ofmsg.Match.of(in_port=p5, eth_type=IP, ip_proto=ofmsg.IPPROTO_UDP)))),
        ofmsg.MeterMod("delete", p5)]
    assert out[sw16] == ofmsg.ordered(_metered(p16, 500, contract.meter_burst_kbit(500)))
    assert set(out) == {sw1, sw5, sw16} and lg.guarantees == {"h1": 3.0, "h2": 1.0, "h16": 0.5}
    assert lg.update({"h1": 3.0, "h2": 1.0, "h16": 0.5}) == {}                      # nothing moved
    # a new burst changes every metered host's meter, and only the meter
    out = lg.update({"h1": 3.0, "h2": 1.0, "h16": 0.5}, burst_kbit=200)
    assert out[sw1] == [ofmsg.MeterMod("modify", p1, 3000, 200), ofmsg.MeterMod("modify", p2, 1000, 200)]
    assert out[sw16] == [ofmsg.MeterMod("modify", p16, 500, 200)] and lg.burst_kbit == 200
    assert lg.update({"h1": 3.0, "h2": 1.0, "h16": 0.5}, burst_kbit=200) == {}
    # a refused set changes nothing
    with pytest.raises(ValueError, match="h2"):
        lg.update({"h1": 1.0, "h2": 11.0})
    with pytest.raises(ValueError, match="burst_kbit"):
        lg.update({"h1": 1.0}, burst_kbit=0)
    assert lg.guarantees == {"h1": 3.0, "h2": 1.0, "h16": 0.5} and lg.burst_kbit == 200


@pytest.mark.parametrize("mbps", [0.001, 0.5, 1.0, 10.0])
def test_any_positive_guarantee_up_to_the_nic_is_accepted(view, mbps):
    assert L.PrioQueuesLogic(view, {"h3": mbps}).guarantees == {"h3": mbps}


@pytest.mark.parametrize("mbps", [0, -1.0, 10.000001, 11, math.nan, math.inf, "1", None])
def test_a_guarantee_outside_it_is_refused_naming_the_host(view, mbps):
    with pytest.raises(ValueError, match="h3"):
        L.PrioQueuesLogic(view, {"h3": mbps})


@pytest.mark.parametrize("burst", [None, 1, 2**32 - 1])
def test_bursts_from_1_to_2_32_less_1_kilobits_are_accepted(view, burst):
    assert L.PrioQueuesLogic(view, {"h3": 1.0}, burst_kbit=burst).burst_kbit == burst


@pytest.mark.parametrize("burst", [0, -5, 2**32, True, 1.5, "100"])
def test_any_other_burst_is_refused(view, burst):
    with pytest.raises(ValueError, match="burst_kbit"):
        L.PrioQueuesLogic(view, {"h3": 1.0}, burst_kbit=burst)


def test_every_problem_is_named_in_one_refusal_that_names_its_section(view):
    with pytest.raises(ValueError) as err:
        L.PrioQueuesLogic(view, {"h3": 0, "nobody": 1.0}, burst_kbit=0)
    assert str(err.value) == ("prio_queues: h3: guarantee 0 must be a positive number of Mb/s; 'nobody' is not "
                              "a host of the topology; burst_kbit 0 must be a positive integer (kilobits) "
                              "below 2^32")
    with pytest.raises(ValueError, match="^prio_queues: guarantees need the network view$"):
        L.PrioQueuesLogic(None, {"h1": 1.0})
    with pytest.raises(ValueError, match="meter command 'ADD'"):
        L.PrioQueuesLogic(view, {"h1": 1.0})._meter_entries("h1", 1.0, "ADD")


def test_unknown_hosts_and_guarantees_without_a_view_are_refused(view):
    with pytest.raises(ValueError, match="'e0_0' is not a host"):
        L.PrioQueuesLogic(view, {"e0_0": 1.0})
    with pytest.raises(ValueError, match="'nobody' is not a host"):
        L.PrioQueuesLogic(view, {"nobody": 1.0})
    with pytest.raises(ValueError, match="need the network view"):
        L.PrioQueuesLogic(None, {"h1": 1.0})
    assert L.PrioQueuesLogic(None).switch_connected("s1") == ofmsg.ordered(
        [ofmsg.flow_delete(CK, COOKIE_APP_MASK), *L.classification_entries()])
