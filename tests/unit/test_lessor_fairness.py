"""Receiver fairness (apps/lessor/fairness.py, LessorLogic.police): the
water level, and meters at the source ToRs of the fake fabric that hold the
flows into a saturated host to its max-min share -- never a flow below it,
never a packet off its path while a meter comes or goes."""

import math

import pytest
from hypothesis import given, settings, strategies as st

from apps.lessor import fairness
from apps.lessor.fairness import FairnessError, receiver_caps, water_level
from controller.network_view import NetworkView
from controller.pipeline import METER_LESSOR_BASE
from mininet_topos import builders
from tests.unit.test_lessor_fakenet import _poll, _setup    # the k = 4 fat tree at 10 Mb/s, every switch connected

MB = 1e6
# lessor-permutation seed 11's receiver: h9 -> h10 shares e2_0, h3 -> h10 and h11 -> h10 come from other ToRs
INTO_H10 = [("h9", "h10", 1000), ("h3", "h10", 1000), ("h11", "h10", 1000)]
PKT_BYTES = 12500                                      # 0.1 Mbit: a packet per 0.1 Mb/s over a 1 s round


# ---- the pure part -------------------------------------------------------------------------
def test_water_level_fills_the_capacity_over_the_demands():
    assert water_level(10, [3, 6, 6]) == 3.5
    assert water_level(10, [5, 5]) == 5
    assert water_level(10, [1, 2]) == math.inf           # they fit: no level
    assert water_level(9, [1, 100, 100]) == 4


def test_a_flow_below_the_level_is_never_policed_and_the_others_share_what_it_leaves():
    # the intra-ToR flow at 2 of 10 Mb/s beside two at 4: its demand is 3 (x 1.5), the level 3.5
    assert receiver_caps({"a": 2 * MB, "b": 4 * MB, "c": 4 * MB}, 10 * MB) == {"b": 3.5 * MB, "c": 3.5 * MB}
    # at equal shares every flow is held at the share
    assert receiver_caps({"a": 3.3 * MB, "b": 3.3 * MB, "c": 3.3 * MB}, 10 * MB) == \
        pytest.approx({"a": 10 * MB / 3, "b": 10 * MB / 3, "c": 10 * MB / 3})
    # a host not saturated, or one flow alone: nothing
    assert receiver_caps({"a": 2 * MB, "b": 4 * MB}, 10 * MB) == {}
    assert receiver_caps({"a": 9.9 * MB}, 10 * MB) == {}
    assert fairness.police_rate(3.5 * MB) == pytest.approx(3.675 * MB)
    assert fairness.rate_moved(1000, 1051) and not fairness.rate_moved(1000, 1049)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -1.0, True, "3", None])
def test_bad_numbers_are_refused_by_name(bad):
    with pytest.raises(FairnessError, match="rate of 'a'"):
        receiver_caps({"a": bad, "b": 1.0}, 10.0)
    with pytest.raises(FairnessError, match="capacity"):
        receiver_caps({"a": 1.0, "b": 1.0}, bad)
    with pytest.raises(FairnessError, match="demand"):
        water_level(10.0, [1.0, bad])
    with pytest.raises(FairnessError, match="headroom"):
        receiver_caps({"a": 1.0}, 10.0, headroom=bad)
    with pytest.raises(FairnessError, match="level"):
        fairness.police_rate(bad)


@pytest.mark.parametrize("busy", [0.0, 1.5, math.nan])
def test_busy_outside_its_range_is_refused(busy):
    with pytest.raises(FairnessError, match="busy"):
        receiver_caps({"a": 1.0, "b": 1.0}, 10.0, busy=busy)


rates_st = st.dictionaries(st.integers(0, 20), st.floats(0, 20e6), min_size=0, max_size=12)


@settings(max_examples=300, deadline=None)
@given(capacity=st.floats(1e3, 1e8), demands=st.lists(st.floats(0, 1e8), max_size=12))
def test_the_level_is_max_min(capacity, demands):
    level = water_level(capacity, demands)
    if sum(demands) < capacity * (1 - 1e-9):
        assert level == math.inf
    else:
        assert math.isfinite(level)
        assert sum(min(d, level) for d in demands) == pytest.approx(capacity, rel=1e-9)


@settings(max_examples=300, deadline=None)
@given(rates=rates_st, capacity=st.floats(1e6, 1e8))
def test_policed_flows_sit_at_the_level_and_the_rest_keep_their_headroom(rates, capacity):
    caps = receiver_caps(rates, capacity)
    if len(rates) < 2 or sum(rates.values()) < fairness.BUSY * capacity:
        assert caps == {}
        return
    levels = set(caps.values())
    assert len(levels) <= 1                              # one level per receiving link
    for key, r in rates.items():
        demand = r * (1 + fairness.HEADROOM)
        if key in caps:
            assert demand >= caps[key] * (1 - 1e-12)     # only flows that would take the level are held
        elif levels:
            assert demand < next(iter(levels))
    if caps:                                             # what is held plus what is left is the link
        held = sum(caps.values()) + sum(r * (1 + fairness.HEADROOM) for k, r in rates.items() if k not in caps)
        assert held == pytest.approx(capacity, rel=1e-9)


# ---- LESSOR on the fake fabric --------------------------------------------------------------
def _second(logic, net, mbps: dict[str, float], t: float, flows=INTO_H10):
    """One second at these rates (Mb/s by sender), then a poll, an allocation if one is needed, and police()."""
    for s, d, sport in flows:
        for _ in range(round(mbps[s] * 10)):
            trace = net.trace(s, net.packet(s, d, sport=sport, length=PKT_BYTES))
            assert trace.delivered_to == d
    _poll(logic, net, t)
    long_flows = logic.long_flows()
    if logic.allocation_needed(long_flows):
        for sw, msgs in logic.install(logic.allocate(long_flows), long_flows):
            net.apply(sw, msgs)
    out = logic.police()
    for sw, msgs in out.items():
        net.apply(sw, msgs)
    assert net.errors() == {}
    return out


def _meters_met(net, s, d, sport=1000):
    """The meters (id -> rate kb/s) a packet of s -> d passes, and where it went."""
    trace = net.trace(s, net.packet(s, d, sport=sport))
    assert trace.delivered_to == d
    return {m: net.switches[h.switch].meters[m].rate_kbps for h in trace.hops for m in h.meters}, trace.path


def test_flows_into_a_saturated_host_are_held_to_its_share_and_released_when_it_is_not():
    view, logic, net = _setup()
    _poll(logic, net, 0.0)
    for t in (1.0, 2.0, 3.0):                            # the intra-ToR flow at 2, the others at 4
        _second(logic, net, {"h9": 2, "h3": 4, "h11": 4}, t)
    meters = {s: _meters_met(net, s, d)[0] for s, d, _ in INTO_H10}
    assert meters["h9"] == {}                            # below the level: never policed
    # demands 3, 6, 6 over 10 Mb/s: level 3.5, policed at 3.5 x 1.05
    assert list(meters["h3"].values()) == [3675] and list(meters["h11"].values()) == [3675]
    assert set(meters["h3"]) == {METER_LESSOR_BASE}      # at each source ToR, the first of LESSOR's ids
    assert _meters_met(net, "h3", "h10")[1] == logic.installed[(view.ip("h3"), view.ip("h10"), 6, 1000, 80)].path[1:-1]
    state = logic.state()
    assert sorted(p[0] for p in state["policed"]) == sorted([view.ip("h3"), view.ip("h11")])

    for t in (4.0, 5.0, 6.0):                            # the room taken: all three at the equal share
        _second(logic, net, {"h9": 3.3, "h3": 3.3, "h11": 3.3}, t)
    meters, path = _meters_met(net, "h9", "h10")
    assert list(meters.values()) == [3500] and path == ("e2_0",)   # an exact entry of its own at its ToR
    assert list(_meters_met(net, "h3", "h10")[0].values()) == [3675]  # within 5 %: left alone

    for t in (7.0, 8.0, 9.0):                            # the host is not saturated any more: all released
        _second(logic, net, {"h9": 1, "h3": 1, "h11": 1}, t)
    assert logic.policed == {}
    for s, d, _ in INTO_H10:
        assert _meters_met(net, s, d)[0] == {}
    assert all(m < METER_LESSOR_BASE for sw in net.switches.values() for m in sw.meters)
    assert logic.state()["meter_changes"] == {"add": 3, "modify": 0, "delete": 3}
    # the intra-ToR flow is back on the defaults: LESSOR holds no entry for it
    key9 = (view.ip("h9"), view.ip("h10"), 6, 1000, 80)
    assert not any(f.match == logic._match(key9) for f in net.switches["e2_0"].flows(1))


def test_a_release_never_takes_a_packet_off_its_path():
    """An installed flow's entry drops its meter before the meter goes
    (deleting a meter deletes the entries that use it): after every single
    message the flow still follows its installed path."""
    view, logic, net = _setup()
    _poll(logic, net, 0.0)
    for t in (1.0, 2.0, 3.0):
        _second(logic, net, {"h9": 2, "h3": 4, "h11": 4}, t)
    key3 = (view.ip("h3"), view.ip("h10"), 6, 1000, 80)
    want = logic.installed[key3].path[1:-1]
    for s, d, sport in INTO_H10:                          # one quiet second: nothing is saturated
        for _ in range(10):
            net.trace(s, net.packet(s, d, sport=sport, length=PKT_BYTES))
    _poll(logic, net, 4.0)
    _poll(logic, net, 5.0)
    out = logic.police()
    assert out and logic.policed == {}
    for sw, msgs in out.items():
        for msg in msgs:
            net.apply(sw, [msg])
            assert net.trace("h3", net.packet("h3", "h10", sport=1000)).path == want, msg
            # on its exact entries all along (the defaults might hash it onto the same path by chance)
            assert all(any(f.match == logic._match(key3) for f in net.switches[hop].flows(1)) for hop in want), msg
    assert net.errors() == {}


def test_a_restarted_tor_gets_its_meters_back_before_the_entries_that_use_them():
    view, logic, net = _setup()
    _poll(logic, net, 0.0)
    for t in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0):
        _second(logic, net, {"h9": 3.3, "h3": 3.3, "h11": 3.3}, t)
    before = {s: _meters_met(net, s, d) for s, d, _ in INTO_H10}
    assert all(meters for meters, _ in before.values())
    for sw in ("e2_0", "e0_1"):
        net.restart(sw)
        net.apply(sw, logic.switch_connected(sw))
    assert net.errors() == {}
    assert {s: _meters_met(net, s, d) for s, d, _ in INTO_H10} == before


def test_turned_off_it_releases_every_flow_and_holds_none():
    view, logic, net = _setup()
    _poll(logic, net, 0.0)
    for t in (1.0, 2.0, 3.0):
        _second(logic, net, {"h9": 2, "h3": 4, "h11": 4}, t)
    assert logic.policed
    logic.fair_receivers = False
    _second(logic, net, {"h9": 2, "h3": 4, "h11": 4}, 4.0)
    assert logic.policed == {} and all(_meters_met(net, s, d)[0] == {} for s, d, _ in INTO_H10)
    assert _second(logic, net, {"h9": 2, "h3": 4, "h11": 4}, 5.0) == {}


def test_without_a_free_meter_id_a_flow_is_counted_not_policed(monkeypatch):
    import apps.lessor.logic as L
    monkeypatch.setattr(L, "METER_LESSOR_SLOTS", 1)
    view, logic, net = _setup()
    flows = [("h3", "h10", 1000), ("h4", "h10", 1000), ("h9", "h10", 1000)]     # h3 and h4: one ToR
    _poll(logic, net, 0.0)
    for t in (1.0, 2.0, 3.0):
        _second(logic, net, {"h3": 4, "h4": 4, "h9": 2}, t, flows)
    assert len(logic.policed) == 1 and logic.unpoliced >= 1
    assert logic.state()["unpoliced"] == logic.unpoliced


def test_with_prio_queues_lessor_leaves_the_shares_to_the_wc_policy(app_config):
    from apps.lessor.app import fair_receivers
    from controller import config
    topo = builders.fattree(4, link_mbps=10)
    path = app_config(topo, controller={"routing": "lessor", "prio_queues": False})
    assert fair_receivers(config.load(path))
    path = app_config(topo, controller={"routing": "lessor"})          # prio queues are on by default
    assert not fair_receivers(config.load(path))
    path = app_config(topo, controller={"routing": "lessor", "prio_queues": False}, lessor={"fair_receivers": False})
    assert not fair_receivers(config.load(path))


def test_the_app_sends_the_meters_and_the_metered_entries_as_valid_openflow(tmp_path, app_config):
    """The os-ken adapter: one polling round's police() goes out through the
    real os-ken parser classes (serialised on the wire), meter first."""
    from os_ken.controller import ofp_event
    from os_ken.ofproto import ofproto_v1_3_parser as parser

    from apps.lessor.app import LessorApp
    from tests.unit.test_apps_smoke import Msg, RecordingDatapath, connect

    topo = builders.fattree(4, link_mbps=10)
    app_config(topo, controller={"routing": "lessor", "prio_queues": False, "state_file": str(tmp_path / "s.json")})
    inst, view = LessorApp(), NetworkView(topo)
    dps = {sw: RecordingDatapath(view.dpid(sw)) for sw in view.switches}
    for dp in dps.values():
        connect(inst, dp)
    assert inst.lessor.fair_receivers
    sent_bytes = {s: 0 for s, _, _ in INTO_H10}
    for t, mbps in ((0.0, None), (1.0, {"h9": 2, "h3": 4, "h11": 4}), (2.0, {"h9": 2, "h3": 4, "h11": 4})):
        for s, d, sport in INTO_H10:
            sent_bytes[s] += 0 if mbps is None else int(mbps[s] * 1e6 / 8)
            tor, port = view.host_switch(s)
            match = dict(in_port=port, eth_type=0x800, ip_proto=6, ipv4_src=view.ip(s), ipv4_dst=view.ip(d),
                         tcp_src=sport, tcp_dst=80)
            inst.lessor.flow_stats(tor, [(match, sent_bytes[s])], t)
    for dp in dps.values():
        dp.sent.clear()
    inst._reallocate()
    inst._police()
    e01 = dps["e0_1"].sent
    kinds = [type(m).__name__ for m in e01]
    meter = next(m for m in e01 if isinstance(m, parser.OFPMeterMod))
    assert meter.meter_id == METER_LESSOR_BASE and meter.bands[0].rate == 3675
    metered = [m for m in e01 if isinstance(m, parser.OFPFlowMod)
               and any(isinstance(i, parser.OFPInstructionMeter) for i in m.instructions)]
    assert len(metered) == 1 and metered[0].match["ipv4_src"] == view.ip("h3")
    assert kinds.index("OFPMeterMod") < e01.index(metered[0])
    assert not any(isinstance(m, parser.OFPMeterMod) for m in dps["e2_0"].sent)   # h9 -> h10: below the level
    inst._write_state()
    import json
    assert len(json.loads((tmp_path / "s.json").read_text())["policed"]) == 2
    assert dict(((name, tuple(labels.items())), v) for name, labels, v in inst.samples())[
        ("bwfabric_policed_flows", ())] == 2
