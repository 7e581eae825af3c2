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
    assert available_bandwidth(view, loads, "e0_0", "e3_0") == pytest.approx(13e6)
    assert available_bandwidth(view, {}, "e0_0", "e3_0") == pytest.approx(20e6)
    view.set_link_state("e0_0", "a0_1", False)
    assert available_bandwidth(view, loads, "e0_0", "e3_0") == pytest.approx(3e6)
    assert math.isinf(available_bandwidth(view, loads, "e0_0", "e0_0"))
