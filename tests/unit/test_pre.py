import math

import pytest

from apps.lessor.pre import (AdaptivePolling, FlowTable, PollingConfig, PollSchedule, available_bandwidth,
                             link_loads, predict_rate)
from controller.network_view import NetworkView
from mininet_topos import builders


def test_algorithm_1_transitions():
    p = AdaptivePolling()
    assert p.period_s == 5.0 and p.alpha == 0.05
    assert p.decide(cpu=0.2) == 2.5                  # CU < LT: halve
    assert p.decide(cpu=0.9) == 5.0                  # CU > UT: double
    p.record_rtt(0.010)
    p.record_rtt(0.010)
    assert p.decide(cpu=0.6, rtt_s=0.011) == pytest.approx(5.0 * 0.95)   # in band, RTT normal: dir -1
    assert p.alpha == pytest.approx(0.04)
    t = p.period_s
    assert p.decide(cpu=0.6, rtt_s=0.030) == pytest.approx(t * 1.04)     # RTT > 2x average: dir +1
    assert p.alpha == pytest.approx(0.03)
    for _ in range(10):
        p.decide(cpu=0.5, rtt_s=0.001)               # LT itself is in the band
    assert p.alpha == pytest.approx(0.01)             # floor
    assert p.decide(cpu=0.70, rtt_s=0.001) < t        # UT itself is in the band too


def test_period_bounds_and_config_errors():
    p = AdaptivePolling(PollingConfig(min_s=1.0, max_s=8.0))
    for _ in range(10):
        p.decide(cpu=0.0)
    assert p.period_s == 1.0
    for _ in range(10):
        p.decide(cpu=1.0)
    assert p.period_s == 8.0
    with pytest.raises(ValueError, match="lower"):
        AdaptivePolling(PollingConfig(lower=0.8, upper=0.7))
    with pytest.raises(ValueError, match="min_s"):
        AdaptivePolling(PollingConfig(min_s=10, initial_s=5))


def test_next_period_is_decided_half_a_period_after_the_first_reply():
    sched = PollSchedule(AdaptivePolling())
    sched.poll_sent(100.0)
    assert sched.first_reply(100.2) == pytest.approx(102.7)   # T/2 = 2.5 s later
    assert sched.first_reply(100.4) == pytest.approx(102.7)   # later replies change nothing
    nxt = sched.decide(102.7, cpu=0.1, rtt_s=None)            # idle: T -> 2.5
    assert nxt == pytest.approx(102.7)                        # 100 + 2.5 is already past


def test_eq4_prediction():
    assert predict_rate(100, 105) == 102.5
    assert predict_rate(100, 89) is None                # outside +-10 %: recheck
    assert predict_rate(100, 89, 92) == pytest.approx(93.6666, rel=1e-4)
    assert predict_rate(100, 110) == 105 and predict_rate(100, 90) == 95


def test_flow_table_rates_rechecks_and_classes():
    t = FlowTable()
    k = ("10.0.0.1", "10.0.0.2", 6, 1000, 80)
    t.update(k, "e0", "e1", 0, now=0.0)
    st = t.update(k, "e0", "e1", 12_500, now=1.0)       # 100 kb/s, 12.5 KB: still short
    assert st.predicted == pytest.approx(100_000) and not st.long
    st = t.update(k, "e0", "e1", 25_500, now=2.0)       # 104 kb/s: within 10 %
    assert st.predicted == pytest.approx(102_000) and t.rechecks() == []
    st = t.update(k, "e0", "e1", 75_500, now=3.0)       # 400 kb/s: recheck needed
    assert t.rechecks() == [k] and st.predicted == pytest.approx(102_000)
    st = t.update(k, "e0", "e1", 100_500, now=3.5)      # recheck: 400 kb/s
    assert st.predicted == pytest.approx((104_000 + 400_000 + 400_000) / 3)
    assert st.long and t.rechecks() == []               # passed 100 KB
    assert [s.key for s in t.long_flows()] == [k]


def test_host_label_makes_a_flow_long_at_once():
    t = FlowTable()
    t.label("f", "e0", "e1", 5_000_000)
    st = t.update("f", "e0", "e1", 1_000, now=0.0)
    assert st.long and t.remaining_bytes("f") == 4_999_000
    t.label("g", "e0", "e1", 50_000)
    assert not t.flows["g"].long
    with pytest.raises(ValueError):
        t.label("h", "e0", "e1", -1)


def test_link_loads_and_available_bandwidth():
    view = NetworkView(builders.fattree(4, link_mbps=10))
    p1 = ("e0_0", "a0_0", "c1", "a3_0", "e3_0")
    loads = link_loads(view, [(p1, 4e6), (("e0_0", "a0_0", "e0_1"), 3e6)])
    assert loads[("e0_0", "a0_0")] == 7e6 and loads[("c1", "a3_0")] == 4e6
    # two uplinks of 10 Mb/s, one carrying 7: 13 Mb/s left between the ToRs
    # (exact: whole bits per second add up exactly; an unloaded link is its whole capacity, not a bit less)
    assert available_bandwidth(view, loads, "e0_0", "e3_0") == 13e6
    assert available_bandwidth(view, {}, "e0_0", "e3_0") == 20e6
    view.set_link_state("e0_0", "a0_1", False)
    assert available_bandwidth(view, loads, "e0_0", "e3_0") == 3e6
    assert math.isinf(available_bandwidth(view, loads, "e0_0", "e0_0"))


def test_a_full_or_overloaded_link_leaves_nothing_not_a_trickle():
    """Residual capacity is never negative and never invented: ToR uplinks
    loaded to (or past) their capacity leave W_sd = 0 exactly."""
    view = NetworkView(builders.fattree(4, link_mbps=10))
    loads = {("e0_0", "a0_0"): 10e6, ("e0_0", "a0_1"): 12e6}
    assert available_bandwidth(view, loads, "e0_0", "e3_0") == 0.0


def test_a_label_at_exactly_the_threshold_is_long_and_zero_is_a_size():
    t = FlowTable(long_bytes=100_000)
    t.label("f", "e0", "e1", 100_000)
    t.label("z", "e0", "e1", 0)                 # an empty transfer is a size, not an error
    assert t.flows["f"].long and not t.flows["z"].long
    assert [s.key for s in t.long_flows()] == ["f"] and t.flows["z"].key == "z"
    assert t.flows["z"].labelled_size == 0


def test_removing_a_flow_the_table_never_saw_changes_nothing():
    t = FlowTable()
    t.update("a", "e0", "e1", 10, 1.0)
    t.remove("never-seen")
    t.remove("a")
    assert t.flows == {}


def test_rechecks_sort_keys_of_any_kind():
    """Flow keys are whatever the caller uses (tuples, strings, numbers):
    the recheck list is ordered by their text, never by comparing them."""
    t = FlowTable()
    for key in (("h1", "h2", 6, 1, 2), "x", 10, 2):
        t.update(key, "e0", "e1", 0, 0.0)
        t.flows[key].needs_recheck = True
    assert t.rechecks() == [("h1", "h2", 6, 1, 2), 10, 2, "x"]


def test_a_labelled_flow_knows_its_tors_and_a_bad_size_is_named():
    t = FlowTable()
    t.label("f", "e0_0", "e1_0", 10)
    assert (t.flows["f"].src_tor, t.flows["f"].dst_tor) == ("e0_0", "e1_0")
    with pytest.raises(ValueError, match=r"^flow g: size -1 must be >= 0$"):
        t.label("g", "e0_0", "e1_0", -1)


def test_a_tor_the_fabric_cannot_reach_has_no_bandwidth():
    view = NetworkView(builders.fattree(4, link_mbps=10))
    for a in ("a3_0", "a3_1"):
        view.set_link_state("e3_0", a, False)
    assert available_bandwidth(view, {}, "e0_0", "e3_0") == 0.0      # the receiver cut off
    assert available_bandwidth(view, {}, "e3_0", "e0_0") == 0.0      # the sender cut off
