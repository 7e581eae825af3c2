"""PRE's Algorithm 1 and its schedule where the mutation pass of 2026-11-29
found them untested: what each decision records and why, the RTT the
schedule passes on, the next poll's time, refusals at their edges, and the
flow table's small ends."""

from __future__ import annotations

import math

import pytest

from apps.lessor.pre import MAX_RTT_S, AdaptivePolling, PollSchedule
from apps.lessor.settings import PollingConfig


def test_each_decision_records_cpu_period_and_why():
    p = AdaptivePolling(PollingConfig(initial_s=8.0, alpha=0.05, alpha_step=0.01, alpha_min=0.01))
    p.record_rtt(0.01)
    assert p.decide(0.2) == 4.0                                    # idle
    assert p.decide(0.6, rtt_s=0.05) == pytest.approx(4.0 * 1.05)  # busy, echo 5x the average: lengthen
    assert p.decide(0.6, rtt_s=0.01) == pytest.approx(4.2 * 0.96)  # busy, echo as usual: shorten (alpha 0.04)
    assert p.decide(0.9) == pytest.approx(4.032 * 2)               # overloaded
    assert [(c, round(t, 6), why) for c, t, why in p.history] == [
        (0.2, 4.0, "idle: halve"), (0.6, 4.2, "busy: lengthen (slow echo)"),
        (0.6, round(4.2 * 0.96, 6), "busy: shorten"), (0.9, round(4.032 * 2, 6), "overloaded: double")]


def test_an_echo_exactly_at_the_factor_is_not_slow():
    p = AdaptivePolling(PollingConfig(initial_s=8.0, rtt_factor=2.0))
    p.record_rtt(0.5)
    p.decide(0.6, rtt_s=1.0)                                       # exactly 2 x the average
    assert p.history[-1][2] == "busy: shorten"


def test_the_schedule_passes_the_echo_on_and_polls_a_period_after_the_last_poll():
    p = AdaptivePolling(PollingConfig(initial_s=8.0))
    p.record_rtt(0.01)
    s = PollSchedule(p)
    s.poll_sent(100.0)
    nxt = s.decide(101.0, cpu=0.6, rtt_s=0.05)                     # a slow echo: the period lengthens
    assert p.history[-1][2] == "busy: lengthen (slow echo)"
    assert nxt == pytest.approx(100.0 + 8.0 * 1.05)
    s2 = PollSchedule(AdaptivePolling(PollingConfig(initial_s=8.0)))
    assert s2.decide(50.0, cpu=0.9, rtt_s=None) == pytest.approx(50.0 + 16.0)   # never polled: from now


@pytest.mark.parametrize("rtt", [math.nan, math.inf, -0.001, MAX_RTT_S * 1.0001, "0.1", None])
def test_a_bad_rtt_is_refused_and_one_at_the_bound_taken(rtt):
    p = AdaptivePolling()
    with pytest.raises((ValueError, TypeError)) if rtt is None else pytest.raises(ValueError, match="rtt"):
        p.record_rtt(rtt)
    if rtt is not None:
        with pytest.raises(ValueError, match="rtt"):
            p.decide(0.6, rtt_s=rtt)
    assert p.history == [] and p.rtt_average is None
    p.record_rtt(MAX_RTT_S)
    p.decide(0.6, rtt_s=MAX_RTT_S)
    assert p.rtt_average == MAX_RTT_S and len(p.history) == 1


@pytest.mark.parametrize("cpu", [math.nan, math.inf, -0.01, "0.5", None])
def test_a_bad_cpu_is_refused_and_nothing_changes(cpu):
    p = AdaptivePolling()
    with pytest.raises(ValueError, match="cpu"):
        p.decide(cpu)
    assert p.history == [] and p.period_s == PollingConfig().initial_s


def test_long_flows_come_in_key_order_and_a_flow_past_its_size_has_nothing_left():
    from apps.lessor.pre import FlowTable
    t = FlowTable(long_bytes=1000)
    for key in ("c", "a", "b"):
        t.update(key, "e0_0", "e1_0", 0, 0.0)
        t.update(key, "e0_0", "e1_0", 5000, 1.0)
    assert [s.key for s in t.long_flows()] == ["a", "b", "c"]
    t.label("a", "e0_0", "e1_0", 3000)
    assert t.remaining_bytes("a") == 0                   # 5000 sent of a 3000-byte label: none left, not 1
    t.label("b", "e0_0", "e1_0", 5001)
    assert t.remaining_bytes("b") == 1
