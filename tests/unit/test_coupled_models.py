"""The coupled congestion controls' reference models (issue #23) against
hand-derived windows."""

import math

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bwtesting.coupled_models import BucketMax, Lia, LiaVm, ModelError, MptcpD, lia_increase


def primed(model, rtts: dict, cwnd: float = 10.0):
    """Subflows in congestion avoidance with their sRTT/RTT already at ``rtts``."""
    for r, rtt in rtts.items():
        model.add(r, cwnd)
        s = model.subflows[r]
        s.ssthresh, s.srtt, s.rtt, s.min_rtt, s.samples = 0.0, rtt, rtt, rtt, 1
    return model


def test_lia_alpha_and_increase_by_hand():
    m = primed(Lia(), {"a": 0.01, "b": 0.02})
    # α = w_total·max(w/rtt²)/(Σ w/rtt)² = 20·(10/1e-4)/(1000 + 500)² = 2e6/2.25e6
    assert m.alpha() == pytest.approx(2e6 / 2.25e6)
    # per ACK: min(α/w_total, 1/w_r) = min(0.8889/20, 0.1)
    assert m.on_ack("a", 0.01) == pytest.approx(10 + (2e6 / 2.25e6) / 20)


def test_lia_alone_is_reno_and_slow_start_adds_one():
    m = primed(Lia(), {"a": 0.05})
    assert m.alpha() == pytest.approx(1.0)
    assert m.on_ack("a", 0.05) == pytest.approx(10 + 1 / 10)
    s = Lia()
    s.add("a", 4)
    assert s.on_ack("a", 0.01) == 5                       # below ssthresh (inf)
    s.on_loss("a")
    assert s.windows()["a"] == 2.5 and s.subflows["a"].ssthresh == 2.5


def test_srtt_is_an_ewma_with_gamma_7_8():
    m = Lia()
    m.add("a")
    m.on_ack("a", 0.010)
    m.on_ack("a", 0.018)
    assert m.subflows["a"].srtt == pytest.approx(7 / 8 * 0.010 + 1 / 8 * 0.018)


def test_mptcp_d_increase_by_hand():
    m = primed(MptcpD(ese=False), {"a": 0.01, "b": 0.02})
    denom = (10 / 0.01 + 10 / 0.02) ** 2
    assert m.psi("b") == pytest.approx(0.5)
    assert m.on_ack("a", 0.01) == pytest.approx(10 + (1.0 * 10 / 0.01 ** 2) / denom)
    m2 = primed(MptcpD(ese=False), {"a": 0.01, "b": 0.02})
    assert m2.on_ack("b", 0.02) == pytest.approx(10 + (0.5 * 10 / 0.02 ** 2) / denom)


def test_ese_closes_a_second_subflow_on_the_same_bottleneck_only():
    m = primed(MptcpD(confirm=1), {"a": 0.01, "b": 0.01, "c": 0.01, "d": 0.01})
    m.on_ack("a", 0.014)                 # > 1.3 x base: TRIG, the reference 14 ms
    assert m.trig and m.ref_rtt == 0.014 and m.closed_by_ese == []
    m.on_ack("c", 0.020)                 # inflated too, but 6 ms from the reference: another bottleneck
    m.on_ack("d", 0.012)                 # not inflated (< 13 ms)
    m.on_ack("b", 0.0145)                # inflated, within 0.1 x base (1 ms) of the reference: shared
    assert m.closed_by_ese == ["b"] and m.subflows["b"].closed
    with pytest.raises(ModelError, match="closed"):
        m.on_ack("b", 0.0145)
    # the reference subflow itself is never closed
    m.on_ack("a", 0.0141)
    assert "a" not in m.closed_by_ese


def test_ese_compares_with_the_reference_subflows_latest_sample_and_waits_for_confirm_matches():
    live, frozen = (primed(MptcpD(confirm=2, frozen=f), {"a": 0.01, "b": 0.01}) for f in (False, True))
    for m in (live, frozen):
        m.on_ack("a", 0.014)             # TRIG: reference subflow a at 14 ms
        m.on_ack("a", 0.020)             # a's queue grew: its latest sample 20 ms
        m.on_ack("b", 0.0205)            # 0.5 ms from a's latest, 6.5 ms from the sample that set TRIG
    assert live.matches["b"] == 1 and frozen.matches["b"] == 0
    live.on_ack("b", 0.0112)             # back near the base (< 1.3 x): the run of matches starts over
    live.on_ack("b", 0.0203)
    assert live.closed_by_ese == [] and live.matches["b"] == 1
    live.on_ack("b", 0.0198)             # the second match in a row closes b
    assert live.closed_by_ese == ["b"]


def test_ese_candidates_are_a_subflows_first_samples():
    m = primed(MptcpD(candidates=3), {"a": 0.01, "b": 0.01})
    m.on_ack("a", 0.014)
    for _ in range(3):
        m.on_ack("b", 0.010)             # b's samples 2, 3, 4: past its first 3
    m.on_ack("b", 0.0142)
    assert m.closed_by_ese == []


def test_ese_candidates_include_the_last_of_the_first_samples():
    m = primed(MptcpD(candidates=3, confirm=1), {"a": 0.01, "b": 0.01})
    m.on_ack("a", 0.014)                 # TRIG, reference a
    m.on_ack("b", 0.010)                 # b's sample 2
    m.on_ack("b", 0.0142)                # b's sample 3: still one of its first 3, matches: closed
    assert m.closed_by_ese == ["b"]


def test_ese_never_closes_the_connections_first_subflow_even_when_it_matches():
    m = primed(MptcpD(confirm=1), {"a": 0.01, "b": 0.01, "c": 0.01})
    m.on_ack("b", 0.014)                 # TRIG by b: b is the reference, a (added first) is not
    m.on_ack("a", 0.0142)                # a matches the reference: it shares b's bottleneck...
    assert m.closed_by_ese == [] and not m.subflows["a"].closed     # ...but it is the first subflow
    m.on_ack("c", 0.0142)                # the same match on c closes it
    assert m.closed_by_ese == ["c"]


def test_lia_vm_ignores_a_descheduled_period():
    vm, plain = primed(LiaVm(), {"a": 0.001, "b": 0.001}), primed(Lia(), {"a": 0.001, "b": 0.001})
    # α = 20·(10/1e-6)/(2·10/0.001)² = 0.5; the ACK adds min(0.5/20, 0.1)
    assert vm.on_ack("a", 0.001, now=0.0) == pytest.approx(10.025)
    vm.on_ack("a", 0.020, now=0.5)       # 20 x minRTT > θ = 10: off, not congestion
    plain.on_ack("a", 0.001)
    plain.on_ack("a", 0.020)
    assert vm.off_periods == 1
    assert vm.subflows["a"].srtt == pytest.approx(0.001)                       # Eq. 15: not updated
    assert plain.subflows["a"].srtt == pytest.approx(7 / 8 * 0.001 + 1 / 8 * 0.020)
    # the increase used the largest α of the last second (0.5)
    assert vm.windows()["a"] == pytest.approx(10.025 + 0.5 / 20.025)


def test_lia_vm_takes_the_largest_alpha_of_the_last_delta():
    vm = primed(LiaVm(), {"a": 0.001, "b": 0.001})
    box = vm.recent["a"] = BucketMax(1.0)
    box.put(0.05, 0.5)
    box.put(0.9, 0.7)
    vm.on_ack("a", 0.05, now=1.0)        # off: max(0.5, 0.7) -- both within the last 8 buckets of 1/8 s
    assert vm.windows()["a"] == pytest.approx(10 + 0.7 / 20)
    before = vm.windows()["a"]
    box.put(1.5, 0.6)
    vm.on_ack("a", 0.05, now=2.0)        # 0.7 (at 0.9 s) is 1.1 s old: its bucket was cleared
    assert box.best.count(0.0) == 7 and max(box.best) == 0.6
    assert vm.windows()["a"] == pytest.approx(before + 0.6 / (before + 10))


def test_bucket_max_keeps_between_seven_eighths_and_all_of_delta():
    box = BucketMax(0.8)                 # buckets of 0.1 s
    box.put(0.00, 3.0)
    box.put(0.35, 2.0)
    assert box.max(0.79) == 3.0          # 0.79 s back: still the first bucket
    assert box.max(0.80) == 2.0          # bucket 8 reuses bucket 0's slot
    assert box.max(1.05) == 2.0          # bucket 10: 3 is the oldest of the 8 kept
    assert box.max(1.10) == 0.0          # bucket 11: bucket 3 (0.35 s) is gone
    box.put(5.0, 1.0)                    # a jump of many buckets clears everything once
    assert box.max(5.0) == 1.0


def test_acked_segments_count_as_many_increases():
    one, four = primed(Lia(), {"a": 0.01, "b": 0.02}), primed(Lia(), {"a": 0.01, "b": 0.02})
    for _ in range(4):
        one.subflows["a"].cwnd += lia_increase(one.alpha(), 20, 10)
    four.on_ack("a", 0.01, acked=4)
    # RFC 6356: bytes_acked times the per-segment increase, from the state at the ACK
    assert four.windows()["a"] == pytest.approx(10 + 4 * (2e6 / 2.25e6) / 20)
    assert one.windows()["a"] == pytest.approx(four.windows()["a"], rel=1e-3)


@given(st.one_of(st.just(float("nan")), st.just(float("inf")), st.floats(max_value=0), st.text(max_size=2),
                 st.booleans()))
def test_bad_rtt_refused_by_name(bad):
    for m in (primed(Lia(), {"a": 0.01}), primed(MptcpD(), {"a": 0.01}), primed(LiaVm(), {"a": 0.01})):
        with pytest.raises(ModelError, match="rtt"):
            m.on_ack("a", bad)
        assert m.windows()["a"] == 10 and m.subflows["a"].srtt == 0.01


def test_unknown_subflows_refused():
    m = Lia()
    with pytest.raises(ModelError, match="no subflow"):
        m.on_ack("z", 0.01)
    m.add("a")
    with pytest.raises(ModelError, match="exists"):
        m.add("a")
    assert math.isinf(m.subflows["a"].ssthresh)


@given(st.sampled_from(["delay_us", "jitter_us", "on_ms", "off_ms", "off_gap_us", "step_us", "step_every_s"]),
       st.one_of(st.just(float("nan")), st.just(float("inf")), st.floats(max_value=-1e-9), st.text(max_size=2)))
def test_delay_line_options_refused_by_name(name, bad):
    from mininet_topos.delayline import DelayLine, DelayLineError
    line = DelayLine("xa", "xb", 1000)
    setattr(line, name, bad)
    with pytest.raises(DelayLineError, match=name):
        line.args()


@given(st.one_of(st.just(float("nan")), st.just(float("inf")), st.floats(max_value=-1e-9),
                 st.floats(min_value=10000.001, allow_infinity=False), st.text(max_size=2), st.just(True)))
def test_delay_line_spin_refused_by_name(bad):
    from mininet_topos.delayline import DelayLine, DelayLineError
    with pytest.raises(DelayLineError, match="spin_us"):
        DelayLine("xa", "xb", 1000, spin_us=bad).args()


def test_delay_line_spin_passed_only_when_given():
    from mininet_topos.delayline import DelayLine
    assert "--spin-us" not in DelayLine("xa", "xb", 1000).args()
    args = DelayLine("xa", "xb", 1000, spin_us=0).args()
    assert args[args.index("--spin-us") + 1] == "0"


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf")])
def test_scheduler_weights_refused_by_name(bad):
    from experiments.coupled.weights import weights
    with pytest.raises(ValueError, match="weight"):
        weights(1.0, 1, [bad], 30.0)


def test_machine_cpu_counts_busy_time_not_sleep():
    """The energy proxy's clock: the machine's busy time (wall x CPUs less
    the kernel's idle time) grows by a busy second, not by an idle one. On
    /proc/stat lines given to the formula: what else the machine runs
    cannot move it (the live reading it replaced failed whenever another
    process kept a core busy)."""
    from experiments.coupled.testbed import busy_cpu_s, machine_cpu_s
    line = "cpu  100 0 50 {idle} {iowait} 0 0 0 0 0"
    hz, cpus = 100, 2
    # 0.5 s of wall time on 2 CPUs, both idle the whole time: 100 ticks of idle, no busy time
    slept = (busy_cpu_s(line.format(idle=1100, iowait=10), 10.5, cpus, hz)
             - busy_cpu_s(line.format(idle=1000, iowait=10), 10.0, cpus, hz))
    # 0.5 s with one CPU busy: 50 ticks of idle (the other CPU): 0.5 s busy
    spun = (busy_cpu_s(line.format(idle=1050, iowait=10), 10.5, cpus, hz)
            - busy_cpu_s(line.format(idle=1000, iowait=10), 10.0, cpus, hz))
    waited = (busy_cpu_s(line.format(idle=1000, iowait=110), 10.5, cpus, hz)   # iowait is idle too
              - busy_cpu_s(line.format(idle=1000, iowait=10), 10.0, cpus, hz))
    assert (slept, spun, waited) == pytest.approx((0.0, 0.5, 0.0))
    a = machine_cpu_s()                 # the live reading: this machine's /proc/stat, monotonic, bounded
    b = machine_cpu_s()
    assert -0.05 <= b - a <= 0.05 * (os.cpu_count() or 1)


def test_delay_line_options_checked_together():
    from mininet_topos.delayline import DelayLine, DelayLineError
    with pytest.raises(DelayLineError, match="jitter_us"):
        DelayLine("xa", "xb", 100, jitter_us=200).args()
    with pytest.raises(DelayLineError, match="both on_ms and off_ms"):
        DelayLine("xa", "xb", 100, on_ms=30).args()
    assert DelayLine("xa", "xb", 100, on_ms=30, off_ms=90).args()[-8:] == ["--on-ms", "30", "--off-ms", "90",
                                                                          "--off-gap-us", "0", "--gate", "both"]
    assert DelayLine("xa", "xb", 100, on_ms=30, off_ms=90, gate="ba").args()[-1] == "ba"
    with pytest.raises(DelayLineError, match="gate"):
        DelayLine("xa", "xb", 100, on_ms=30, off_ms=90, gate="up").args()
    # the ToS filters and the delay step
    assert DelayLine("xa", "xb", 100, tos=(0x20, 0xfc), step_us=500, step_every_s=15).args()[-6:] == \
        ["--tos", "0x20/0xfc", "--step-us", "500", "--step-every-s", "15"]
    for bad in ({"tos": (0x20, 0xfc), "not_tos": (0x20, 0xfc)}, {"tos": (256, 0xfc)}, {"not_tos": "0x20"},
                {"step_us": 500}, {"step_every_s": 15}):
        with pytest.raises(DelayLineError, match="tos|step"):
            DelayLine("xa", "xb", 100, **bad).args()


def _rec(**kw):
    from hostagent.bpfring import Record
    base = dict(ts_ns=0, conn=1, type=2, kind=1, sub=1, flags=0, acked=1, acked_ca=1, rtt=1000, srtt8=8000,
                min_rtt=1000, samples=5, cwnd_before=10, cwnd_after=10, frac_before=0, frac_after=0, alpha=0,
                sibs=())
    return Record(**{**base, **kw})


def test_replay_checks_each_increase_against_the_models_rule():
    from hostagent.bpfring import Sib
    from bwtesting.coupled_models import Q30, lia_alpha, replay
    sibs = (Sib(1, 10, 8000, 1000), Sib(2, 10, 16000, 2000))        # sRTT 1 and 2 ms
    per = lia_increase(lia_alpha([10, 10], [1000, 2000]), 20, 10)
    frac = round(per * 3 * Q30)
    # subflow 2, the slower: its LIA and MPTCP-D increases differ (for the fastest they coincide)
    good = _rec(sub=2, acked=3, acked_ca=3, frac_after=frac, sibs=sibs)
    rep = replay([good])
    assert rep.increases == 1 and rep.agrees()
    # a program that added 1/w per segment (Reno's) is caught
    assert not replay([_rec(sub=2, acked=3, acked_ca=3, frac_after=round(3 / 10 * Q30), sibs=sibs)]).agrees()
    # read as MPTCP-D's rule, the same increase is wrong
    assert replay([_rec(sub=2, kind=2, acked=3, acked_ca=3, frac_after=frac, sibs=sibs)]).worst_rel > 1e-2
    # slow start's share is taken off before the comparison
    ss = _rec(sub=2, flags=1, acked=5, acked_ca=3, cwnd_before=8, cwnd_after=10, frac_after=frac, sibs=sibs)
    assert replay([ss]).agrees()


def test_replay_checks_srtt_and_off_period_verdicts():
    from bwtesting.coupled_models import replay
    samples = [_rec(type=1, kind=3, rtt=1000, srtt8=8000), _rec(type=1, kind=3, rtt=1200, srtt8=8200),
               _rec(type=1, kind=3, rtt=50000, srtt8=8200, flags=2)]                  # 50 x min: off, sRTT kept
    rep = replay(samples)
    assert rep.samples == 3 and rep.off_periods == 1 and rep.off_mismatch == 0 and rep.worst_srtt_us < 1
    wrong = samples[:2] + [_rec(type=1, kind=3, rtt=50000, srtt8=14400, flags=0)]      # the program took it in
    assert replay(wrong).off_mismatch == 1
