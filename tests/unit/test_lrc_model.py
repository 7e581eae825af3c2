"""LRC's equations and state, against values worked out by hand."""

import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from bwcommon import lrc as M
from bwtesting.lrc_reference import SenderHalves
from apps.lrc.control import LinkFactors, PairPath
from hostagent.pair_rates import PairRates

INF = math.inf


def test_eq1_pair_weight():
    # w_x/|X^r| + w_y/|Y^s| = 1/2 + 3/3
    assert M.pair_weight(1.0, 2, 3.0, 3) == pytest.approx(1.5)
    assert M.pair_weight(2.0, 1, 2.0, 1) == pytest.approx(4.0)


def test_eq2_pair_guarantee_takes_the_smaller_half():
    # sender half 600·1/3 = 200, receiver half 300·2/4 = 150
    assert M.pair_guarantee(600, 1, 3, 300, 2, 4) == pytest.approx(150)
    # without a receiver guarantee the pair has none
    assert M.pair_guarantee(600, 1, 1, 0, 1, 1) == 0


def test_pair_terms_over_a_tenant():
    """a (B 600, w 1), b (B 300, w 1), c (B 300, w 2); a->b, a->c, c->b.
    X^r(a) = {b, c} (Σw 3), Y^s(b) = {a, c} (Σw 3), Y^s(c) = {a} (Σw 1), X^r(c) = {b}."""
    vms = {"a": M.Vm(600, 1), "b": M.Vm(300, 1), "c": M.Vm(300, 2)}
    terms = M.pair_terms([("a", "b"), ("a", "c"), ("c", "b")], vms)
    assert terms[("a", "b")] == pytest.approx((1 / 2 + 1 / 2, min(600 * 1 / 3, 300 * 1 / 3)))      # (1, 100)
    assert terms[("a", "c")] == pytest.approx((1 / 2 + 2 / 1, min(600 * 2 / 3, 300 * 1 / 1)))      # (2.5, 300)
    assert terms[("c", "b")] == pytest.approx((2 / 1 + 1 / 2, min(300 * 1 / 1, 300 * 2 / 3)))      # (2.5, 200)
    # the sender's halves never add up to more than its hose guarantee, nor a receiver's
    assert terms[("a", "b")][1] + terms[("a", "c")][1] <= 600
    assert terms[("a", "b")][1] + terms[("c", "b")][1] <= 300


def test_pair_terms_refuse_unknown_vms_and_self_pairs():
    with pytest.raises(M.LrcError, match="'z' is not declared"):
        M.pair_terms([("a", "z")], {"a": M.Vm(1, 1)})
    with pytest.raises(M.LrcError, match="does not send to itself"):
        M.pair_terms([("a", "a")], {"a": M.Vm(1, 1)})


def test_algorithm1_open_close_sequences():
    weights = {"b": 1.0, "c": 2.0, "d": 3.0}
    s = SenderHalves(600.0, weights.__getitem__)
    assert s.open("b") is True
    assert s.halves() == {"b": pytest.approx(600)}
    assert s.open("b") is False                 # a second connection to b: X^r is the same
    assert s.open("c") is True
    assert s.halves() == {"b": pytest.approx(200), "c": pytest.approx(400)}
    assert s.close("b") is False                # one connection to b is still open
    assert s.halves() == {"b": pytest.approx(200), "c": pytest.approx(400)}
    assert s.close("b") is True
    assert s.halves() == {"c": pytest.approx(600)}
    with pytest.raises(M.LrcError, match="none is open"):
        s.close("b")
    assert s.open("d") is True
    assert s.halves() == {"c": pytest.approx(240), "d": pytest.approx(360)}
    assert sum(s.halves().values()) == pytest.approx(600)


def test_eq27_host_step():
    # v = 100, target w·r̃ = 2·200 = 400, α·τ_v = 0.1: 100^0.9·400^0.1 = 100·4^0.1
    assert M.next_pair_rate(100, 2, 200, 2.0, 0.05, 1, 1e9) == pytest.approx(100 * 4 ** 0.1)
    assert M.next_pair_rate(100, 2, 200, 2.0, 0.05, 1, 110) == 110          # capped
    assert M.next_pair_rate(100, 2, 200, 20.0, 0.05, 1, 1e9) == pytest.approx(400)   # α·τ_v = 1: at once
    with pytest.raises(M.LrcError, match="must be <= 1"):
        M.next_pair_rate(100, 2, 200, 40.0, 0.05, 1, 1e9)


def test_eq27_link_step():
    # r·exp(β·τ_r·(1 − load/μC)): β·τ_r = 0.2
    assert M.next_link_factor(100, 450, 900, 2.0, 0.1, 1, 1e9) == pytest.approx(100 * math.exp(0.1))
    assert M.next_link_factor(100, 1000, 900, 2.0, 0.1, 1, 1e9) == pytest.approx(100 * math.exp(-0.2 / 9))
    assert M.next_link_factor(100, 900, 900, 2.0, 0.1, 1, 1e9) == pytest.approx(100)
    assert M.next_link_factor(100, 0, 900, 2.0, 0.1, 1, 105) == 105


def test_eq28_and_the_combined_split():
    assert M.enforced_rate(600, 300) == 600
    assert M.enforced_rate(0, 300) == 300
    assert M.split_limits(600, 800) == (600, 200)       # BG at B_i, WC carries LRC's excess
    assert M.split_limits(600, 300) == (600, 0)


def test_equilibrium_factor_by_hand():
    # X (w 2, B 600) and Y (w 2) on μC 900: 600 + 2r = 900 while 2r <= 600
    assert M.equilibrium_factor(900, [(2, 600, INF), (2, 0, INF)]) == pytest.approx(150)
    # no guarantees: Eq. 7, μC/Σw
    assert M.equilibrium_factor(900, [(1, 0, INF), (2, 0, INF)]) == pytest.approx(300)
    # one pair held at 100 elsewhere: 100 + r = 900
    assert M.equilibrium_factor(900, [(1, 0, 100.0), (1, 0, INF)]) == pytest.approx(800)
    # every pair held elsewhere: the load stops growing at the largest cap
    assert M.equilibrium_factor(900, [(1, 0, 100.0), (1, 0, 200.0)]) == pytest.approx(200)


def params(**kw) -> M.LrcParams:
    return M.LrcParams(**kw)


def test_link_factors_seed_rescale_and_step():
    lf = LinkFactors(params(rescale="weights", anti_windup=False, beta=2.0), {"L": 1000.0})
    lf.set_pairs({"A": PairPath(1, 0, frozenset({"L"})), "B": PairPath(2, 0, frozenset({"L"}))})
    assert lf.r["L"] == pytest.approx(900 / 3)                      # Eq. 7's seed
    lf.set_pairs({**lf.pairs, "C": PairPath(3, 0, frozenset({"L"}))})
    assert lf.r["L"] == pytest.approx(300 * 3 / 6)                  # Σw_old/Σw_new
    lf.update({"L": 450.0})
    assert lf.r["L"] == pytest.approx(150 * math.exp(0.2 * 0.5))
    assert lf.pair_factor("C") == lf.r["L"]
    lf.update({"L": float("nan")})                                  # a bad sample changes nothing
    assert lf.r["L"] == pytest.approx(150 * math.exp(0.1)) and lf.refused_loads == 1
    for _ in range(500):
        lf.update({"L": 0.0})
    assert lf.r["L"] == pytest.approx(900 / 1)                      # capped at μC/w_min
    lf.set_pairs({})
    assert lf.r == {}


def test_link_factors_equilibrium_reseed_with_guarantees():
    lf = LinkFactors(params(), {"L": 1000.0})
    lf.set_pairs({"X": PairPath(2, 600, frozenset({"L"}))})
    assert lf.r["L"] == pytest.approx(900 / 2)
    lf.set_pairs({"X": PairPath(2, 600, frozenset({"L"})), "Y": PairPath(2, 0, frozenset({"L"}))})
    assert lf.r["L"] == pytest.approx(150)


def test_pair_factor_is_the_least_on_the_path():
    lf = LinkFactors(params(rescale="weights"), {"L": 1000.0, "M": 100.0})
    lf.set_pairs({"A": PairPath(1, 0, frozenset({"L", "M"})), "B": PairPath(1, 0, frozenset({"L"}))})
    assert lf.pair_factor("A") == pytest.approx(90)
    assert lf.pair_factor("B") == pytest.approx(450)


def test_anti_windup_counts_the_climb_still_to_come():
    two = {"A": PairPath(1, 0, frozenset({"L"})), "B": PairPath(1, 0, frozenset({"L"}))}
    lf = LinkFactors(params(anti_windup=True, rescale="weights", beta=1.0), {"L": 1000.0})
    lf.set_pairs(two)
    # the modelled v start at the floor (1 Mb/s); their targets are 450 each
    assert lf.lag() == {"L": pytest.approx(2 * (450 - 1))}
    lf.update({"L": 2.0})                 # the load is low only because v is still climbing
    assert lf.r["L"] == pytest.approx(450 * math.exp(0.1 * (1 - (2 + 898) / 900)))   # = 450: no wind-up
    off = LinkFactors(params(anti_windup=False, rescale="weights", beta=1.0), {"L": 1000.0})
    off.set_pairs(two)
    off.update({"L": 2.0})
    assert off.r["L"] == pytest.approx(450 * math.exp(0.1 * (1 - 2 / 900)))
    # the model climbs as the hosts do (Eq. 27, τ_r/τ_v steps per round): the lag shrinks to nothing
    for _ in range(50):
        lf.update({"L": 900.0})
    assert sum(lf.lag().values()) < 1e-3


def test_seed_resumes_within_bounds():
    lf = LinkFactors(params(), {"L": 1000.0})
    lf.set_pairs({"A": PairPath(1, 0, frozenset({"L"})), "B": PairPath(2, 0, frozenset({"L"}))})
    lf.seed("L", 250.0)
    assert lf.r["L"] == 250.0
    lf.seed("L", 1e9)
    assert lf.r["L"] == pytest.approx(900)                 # μC/w_min
    with pytest.raises(M.LrcError, match="carries no pair"):
        lf.seed("Q", 1.0)
    with pytest.raises(M.LrcError) as err:
        lf.seed("L", -1.0)
    assert str(err.value) == "factor of link 'L' -1.0 must be a positive finite number"


def test_seed_floor_is_a_share_of_the_links_pairs_together():
    """r_l never below factor_floor x muC / (sum of the weights) -- not over
    the smallest weight, which would put the floor 3 times higher here."""
    lf = LinkFactors(params(factor_floor=0.01), {"L": 1000.0})
    lf.set_pairs({"A": PairPath(1, 0, frozenset({"L"})), "B": PairPath(2, 0, frozenset({"L"}))})
    lf.seed("L", 1e-9)
    assert lf.r["L"] == pytest.approx(0.01 * 900 / 3)


def test_a_hosts_pair_rate_never_climbs_above_its_nic():
    host = PairRates(params(), nic_mbps=100.0)
    host.set_terms({"p": (1e6, 1.0, 10.0)}, now=0.0)          # a factor far above anything the NIC carries
    for i in range(200):
        host.step(now=i * 0.01)
    assert host.pairs["p"].v == pytest.approx(100.0)
    assert host.limit("p", now=2.0) == pytest.approx(100.0)


def test_link_factors_refuse_unknown_links_and_bad_terms():
    lf = LinkFactors(params(), {"L": 1000.0})
    with pytest.raises(M.LrcError, match="without a capacity"):
        lf.set_pairs({"A": PairPath(1, 0, frozenset({"Q"}))})
    with pytest.raises(M.LrcError, match="weight of pair"):
        lf.set_pairs({"A": PairPath(float("nan"), 0, frozenset({"L"}))})
    assert lf.pairs == {} and lf.r == {}


def test_pair_rates_start_at_the_guarantee_climb_hold_and_fall_back():
    p = params(alpha=2.0, hold_s=1.0, fallback_s=5.0)
    h = PairRates(p, 1000.0)
    h.open("X", 600, 2)
    assert h.limit("X", 0.0) == 600                    # Algorithm 1: B_i at once
    h.set_terms({"X": (450.0, 2.0, 600.0)}, now=0.0)
    h.step(0.0)
    assert h.pairs["X"].v == pytest.approx(600 ** 0.9 * 900 ** 0.1)
    for k in range(1, 200):
        h.step(k * 0.005)                              # within hold_s of the last factor
    held = h.pairs["X"].v
    h.step(1.5)                                        # the factor is 1.5 s old: v is held
    assert h.pairs["X"].v == held and h.limit("X", 1.5) == pytest.approx(held)
    assert h.limit("X", 5.5) == 600                    # 5.5 s without a factor: B_i
    h.set_terms({"X": (450.0, 2.0, 600.0)}, now=6.0)   # factors again: Eq. 28 again
    assert h.limit("X", 6.0) == pytest.approx(held)


def test_pair_rates_take_all_terms_or_none():
    h = PairRates(params(), 1000.0)
    h.set_terms({"X": (100.0, 1.0, 0.0)}, now=0.0)
    with pytest.raises(M.LrcError, match="'Y' guarantee"):
        h.set_terms({"X": (200.0, 1.0, 0.0), "Y": (100.0, 1.0, float("inf"))}, now=1.0)
    assert h.pairs["X"].r_tilde == 100.0 and "Y" not in h.pairs


def test_params_refuse_unstable_steps_and_non_finite_values():
    with pytest.raises(ValidationError, match="alpha·tau_v_s"):
        M.LrcParams(alpha=30.0, tau_v_s=0.05)
    with pytest.raises(ValidationError, match="beta·tau_r_s"):
        M.LrcParams(beta=20.0, tau_r_s=0.1)
    with pytest.raises(ValidationError, match="fallback_s"):
        M.LrcParams(hold_s=5.0, fallback_s=1.0)


@given(st.sampled_from(["alpha", "beta", "tau_v_s", "tau_r_s", "mu", "v_floor_mbps", "factor_floor", "hold_s"]),
       st.one_of(st.just(float("nan")), st.just(float("inf")), st.just(-float("inf")), st.floats(max_value=0),
                 st.text(max_size=3), st.booleans()))
def test_params_refuse_by_name(name, value):
    with pytest.raises(ValidationError, match=name):
        M.LrcParams(**{name: value})


@given(st.one_of(st.just(float("nan")), st.just(float("inf")), st.floats(max_value=-1e-9)),
       st.sampled_from(["v", "w_i", "r_tilde"]))
def test_host_step_refuses_bad_inputs_by_name(bad, which):
    args = {"v": 100.0, "w_i": 1.0, "r_tilde": 100.0}
    args[which] = bad
    with pytest.raises(M.LrcError, match=which):
        M.next_pair_rate(args["v"], args["w_i"], args["r_tilde"], 2.0, 0.05, 1.0, 1e9)


@given(st.lists(st.tuples(st.floats(0.1, 10), st.floats(0, 300), st.one_of(st.just(INF), st.floats(1, 1000))),
                min_size=1, max_size=8), st.floats(100, 2000))
def test_equilibrium_factor_solves_its_equation(members, mu_c):
    r = M.equilibrium_factor(mu_c, members)

    def load(x):
        return sum(max(b, w * min(x, ro)) for w, b, ro in members)
    guarantees = sum(b for _, b, _ in members)
    if guarantees >= mu_c:
        return                                   # the guarantees fill it on their own
    if load(1e12) < mu_c:
        assert load(r) == pytest.approx(load(1e12))   # cannot fill: where the load stops growing
    else:
        assert load(r) == pytest.approx(mu_c, rel=1e-9)
        assert load(r * (1 - 1e-6)) < mu_c + 1e-6


def test_a_full_link_drops_its_factor_to_the_equilibrium():
    """At C the wire caps the measured load, so Eq. 27 alone sheds an
    overshoot at β·τ_r·(1 − 1/μ) a round; a full link's factor above its
    equilibrium drops to it at once."""
    two = {"A": PairPath(1, 0, frozenset({"L"})), "B": PairPath(1, 0, frozenset({"L"}))}
    lf = LinkFactors(params(anti_windup=False, rescale="none"), {"L": 1000.0})
    lf.set_pairs(two)
    lf.r["L"] = 900.0                               # wound up while the pairs were idle
    lf.update({"L": 1000.0})                        # full
    assert lf.r["L"] == pytest.approx(450) and lf.saturation_drops == 1
    off = LinkFactors(params(anti_windup=False, rescale="none", saturation=None), {"L": 1000.0})
    off.set_pairs(two)
    off.r["L"] = 900.0
    off.update({"L": 1000.0})
    assert off.r["L"] == pytest.approx(900 * math.exp(0.1 * (1 - 1000 / 900)))
    lf.r["L"] = 300.0                               # below the equilibrium: Eq. 27 as usual
    lf.update({"L": 990.0})
    assert lf.r["L"] == pytest.approx(300 * math.exp(0.1 * (1 - 990 / 900)))


def test_with_uncapped_wc_a_full_link_sits_at_its_equilibrium():
    two = {"A": PairPath(1, 0, frozenset({"L"})), "B": PairPath(1, 0, frozenset({"L"}))}
    lf = LinkFactors(params(anti_windup=False, rescale="none"), {"L": 1000.0})
    lf.set_pairs(two)
    lf.r["L"] = 100.0                               # below: raised to it too
    lf.update({"L": 1000.0}, full_is_equilibrium=True)
    assert lf.r["L"] == pytest.approx(450)
    lf.update({"L": 500.0}, full_is_equilibrium=True)    # not full: Eq. 27
    assert lf.r["L"] == pytest.approx(450 * math.exp(0.1 * (1 - 500 / 900)))


PAIR_GUARANTEE = dict(b_x=6.0, w_y=1.0, sum_w_receivers_of_x=2.0, b_y=9.0, w_x=2.0, sum_w_senders_of_y=3.0)
NAMES = {"b_x": "B_x", "w_y": "w_y", "sum_w_receivers_of_x": "sum over X^r", "b_y": "B_y", "w_x": "w_x",
         "sum_w_senders_of_y": "sum over Y^s"}


@pytest.mark.parametrize("arg", sorted(PAIR_GUARANTEE))
@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_eq2_refuses_each_bad_term_by_its_name(arg, bad):
    with pytest.raises(M.LrcError, match=rf"^{re.escape(NAMES[arg])} {re.escape(repr(bad))} must be a "):
        M.pair_guarantee(**{**PAIR_GUARANTEE, arg: bad})


def test_eq2_takes_the_smaller_half_and_zero_guarantees():
    assert M.pair_guarantee(**PAIR_GUARANTEE) == min(6 * 1 / 2, 9 * 2 / 3) == 3.0
    assert M.pair_guarantee(**{**PAIR_GUARANTEE, "b_x": 0.0}) == 0.0          # B may be 0, weights may not
    for arg in ("w_y", "sum_w_receivers_of_x", "w_x", "sum_w_senders_of_y"):
        with pytest.raises(M.LrcError, match=rf"^{re.escape(NAMES[arg])} 0.0 must be a positive finite number$"):
            M.pair_guarantee(**{**PAIR_GUARANTEE, arg: 0.0})


def test_eq1_refuses_bad_weights_and_counts_by_name():
    assert M.pair_weight(2.0, 4, 3.0, 1) == 0.5 + 3.0
    with pytest.raises(M.LrcError, match=r"^w_x -1 must be a positive finite number$"):
        M.pair_weight(-1, 1, 1.0, 1)
    with pytest.raises(M.LrcError, match=r"^w_y nan must be a positive finite number$"):
        M.pair_weight(1.0, 1, math.nan, 1)
    for nx, ny in ((0, 1), (1, 0), (1.0, 1), (1, 2.0)):
        with pytest.raises(M.LrcError, match=rf"^\|X\^r\| {nx!r} and \|Y\^s\| {ny!r} must be integers >= 1$"):
            M.pair_weight(1.0, nx, 1.0, ny)


def test_a_report_at_the_edges_of_its_ranges():
    ok = {"v_mbps": 0.0, "limit_mbps": M.MAX_REPORT_MBPS, "guarantee_mbps": 0, "weight": M.REPORT_WEIGHTS[0],
          "factor_age_s": 0.0}
    assert M.report_problems(ok) == []
    assert M.report_problems({**ok, "weight": M.REPORT_WEIGHTS[1], "factor_age_s": 1e9, "v_mbps": 400_000}) == []
    assert M.report_problems({"factor_age_s": None}) == [] and M.report_problems({}) == []
    assert M.report_problems({**ok, "v_mbps": 400_000.5, "weight": 0.0}) == [
        "v_mbps 400000.5, weight 0.0 out of range"]
    assert M.report_problems({**ok, "factor_age_s": 1e9 + 1}) == ["factor_age_s 1000000001.0 out of range"]
    assert M.report_problems({**ok, "factor_age_s": -0.5, "limit_mbps": -1}) == [
        "limit_mbps -1, factor_age_s -0.5 out of range"]
    assert M.report_problems([1]) == ["must be an object"]


def test_sender_halves_of_no_receivers_is_empty():
    assert M.sender_halves(5.0, {}) == {} and M.sender_halves(5.0, {"y": 1.0}) == {"y": 5.0}


def test_factors_refuse_bad_terms_by_name_and_modes_by_list():
    assert M.initial_factor(9.0, 3.0) == 3.0
    with pytest.raises(M.LrcError, match=r"^muC 0 must be a positive finite number$"):
        M.initial_factor(0, 3.0)
    with pytest.raises(M.LrcError, match=r"^sum of weights nan must be a positive finite number$"):
        M.initial_factor(9.0, math.nan)
    assert M.rescaled_factor("none", 2.0, 9.0, 1.0, 4.0, []) == 2.0
    assert M.rescaled_factor("weights", 2.0, 9.0, 1.0, 4.0, []) == 0.5
    with pytest.raises(M.LrcError, match=r"^old sum of weights 0 must be a positive finite number$"):
        M.rescaled_factor("weights", 2.0, 9.0, 0, 4.0, [])
    with pytest.raises(M.LrcError, match=r"^new sum of weights -1 must be a positive finite number$"):
        M.rescaled_factor("weights", 2.0, 9.0, 1.0, -1, [])
    with pytest.raises(M.LrcError, match=r"^rescale 'None': one of none, weights, equilibrium$"):
        M.rescaled_factor("None", 2.0, 9.0, 1.0, 4.0, [])


def test_pair_terms_take_pairs_in_any_order_and_kind():
    """The pairs' keys may mix kinds (names, tuples): ordered by their text,
    never compared; the result does not depend on the order given."""
    vms = {"a": M.Vm(2.0, 1.0), ("b", 1): M.Vm(4.0, 1.0), 3: M.Vm(6.0, 2.0)}
    pairs = [("a", ("b", 1)), (3, "a"), (("b", 1), 3)]
    assert M.pair_terms(pairs, vms) == M.pair_terms(list(reversed(pairs)), vms)


def test_equilibrium_holds_a_pair_at_its_other_links_and_skips_guarantee_bound_ones():
    """LinkFactors.equilibrium over {L}: A also crosses M, whose factor (100)
    holds it at w_A x 100 = 100, so B takes the rest of L's 900 and L's
    factor is B's 800 (A, at its cap, sets none); a pair whose rate is its
    guarantee sets none either -- a link all of whose pairs sit at their
    guarantees keeps no entry; a pair between its guarantee and twice it
    sets one. (Mutation testing left all of this open.)"""
    lf = LinkFactors(params(), {"L": 1000.0, "M": 1000.0})
    lf.set_pairs({"A": PairPath(1, 0, frozenset({"L", "M"})), "B": PairPath(1, 0, frozenset({"L"})),
                  "C": PairPath(1, 0, frozenset({"M"}))})
    lf.r["M"] = 100.0
    assert lf.equilibrium({"L"}) == {"L": pytest.approx(800)}
    lf.r.pop("M")                                   # no factor on M: A shares L evenly
    assert lf.equilibrium({"L"}) == {"L": pytest.approx(450)}
    full = LinkFactors(params(), {"L": 1000.0})
    full.set_pairs({"X": PairPath(1, 600, frozenset({"L"})), "Y": PairPath(1, 600, frozenset({"L"}))})
    assert full.equilibrium({"L"}) == {}            # 1200 of guarantees on 900: both at their floors
    above = LinkFactors(params(), {"L": 1000.0})
    above.set_pairs({"X": PairPath(1, 400, frozenset({"L"})), "Y": PairPath(1, 300, frozenset({"L"}))})
    assert above.equilibrium({"L"}) == {"L": pytest.approx(450)}     # both at 450: above their floors, below 2x
    mixed = LinkFactors(params(), {"L": 1000.0, 7: 1000.0})          # any hashable keys, as the types say
    mixed.set_pairs({"A": PairPath(1, 0, frozenset({"L", 7})), 3: PairPath(1, 0, frozenset({"L"}))})
    assert mixed.equilibrium({"L", 7}) == {"L": pytest.approx(450), 7: pytest.approx(450)}


def test_a_pair_half_a_megabit_above_its_guarantee_sets_the_equilibrium_and_one_at_it_does_not():
    """LinkFactors.equilibrium's free-rate test is relative to the guarantee
    (a tolerance of 1e-9), not a whole Mb/s."""
    lf = LinkFactors(params(), {"L": 1000.0})
    mu_c = lf.mu_c("L")
    lf.set_pairs({"X": PairPath(1, mu_c - 0.5, frozenset({"L"}))})
    assert lf.equilibrium({"L"}) == {"L": pytest.approx(mu_c)}
    lf.set_pairs({"X": PairPath(1, mu_c, frozenset({"L"}))})
    assert lf.equilibrium({"L"}) == {}


def test_a_new_links_factor_sees_its_pairs_held_elsewhere():
    """_terms: a pair that also crosses a link with a factor is held at
    w x that factor, so the new link's equilibrium gives the rest to the others."""
    lf = LinkFactors(params(), {"L": 1000.0, "M": 100.0})
    lf.set_pairs({"A": PairPath(1, 0, frozenset({"M"}))})
    assert lf.r["M"] == pytest.approx(lf.mu_c("M"))
    lf.set_pairs({"A": PairPath(1, 0, frozenset({"M"})), "B": PairPath(1, 0, frozenset({"L", "M"})),
                  "C": PairPath(1, 0, frozenset({"L"}))})
    assert lf.r["L"] == pytest.approx(lf.mu_c("L") - lf.mu_c("M"))


def test_equilibrium_factors_are_rates_over_weights():
    lf = LinkFactors(params(), {"L": 1000.0})
    lf.set_pairs({"X": PairPath(2, 0, frozenset({"L"})), "Y": PairPath(1, 0, frozenset({"L"}))})
    assert lf.equilibrium({"L"}) == {"L": pytest.approx(lf.mu_c("L") / 3)}


def test_lag_lists_only_links_with_a_climb_to_come_and_any_pair_without_links_is_skipped():
    lf = LinkFactors(params(anti_windup=True, rescale="weights", beta=1.0), {"L": 1000.0})
    lf.set_pairs({"Z": PairPath(1, 0, frozenset()), "A": PairPath(1, 0, frozenset({"L"}))})
    target = lf.pair_factor("A")
    lf.v_hat["A"] = target - 0.5                     # half a megabit still to climb
    assert lf.lag() == {"L": pytest.approx(0.5)}
    lf.v_hat["A"] = target                           # there: nothing to come, no entry at all
    assert lf.lag() == {}


@pytest.mark.parametrize("mu_c,members,name", [
    (0.0, [(1, 0, INF)], "muC"), (math.nan, [(1, 0, INF)], "muC"), (900, [(0, 0, INF)], "w_i"),
    (900, [(math.inf, 0, INF)], "w_i"), (900, [(1, -1, INF)], "B_i"), (900, [(1, math.nan, INF)], "B_i"),
    (900, [], "a link without pairs has no equilibrium factor")])
def test_equilibrium_factor_refuses_bad_input_by_name(mu_c, members, name):
    with pytest.raises(M.LrcError) as exc:
        M.equilibrium_factor(mu_c, members)
    assert str(exc.value).startswith(name)


def test_when_the_guarantees_alone_fill_the_link_the_factor_is_the_least_guarantee_over_weight():
    assert M.equilibrium_factor(900, [(2, 600, INF), (4, 300, INF)]) == pytest.approx(75)     # exactly full
    assert M.equilibrium_factor(900, [(2, 1000, INF), (3, 0, INF)]) == pytest.approx(500)


def test_equilibrium_takes_the_highest_level_on_a_link_whatever_the_pairs_order():
    """A link's entry is the largest rate/weight of the free pairs crossing
    it: Z, bottlenecked on M at 90, crosses L too, where B (sorted before
    Z) fills the rest at 810 -- L's factor is B's, not the last pair's.
    Below 1 Mb/s the levels are kept as they are (no floor of 1 from an
    empty entry)."""
    lf = LinkFactors(params(), {"L": 1000.0, "M": 100.0})
    lf.set_pairs({"B": PairPath(1, 0, frozenset({"L"})), "Z": PairPath(1, 0, frozenset({"L", "M"}))})
    assert lf.equilibrium({"L", "M"}) == {"L": pytest.approx(810), "M": pytest.approx(90)}
    small = LinkFactors(params(), {"L": 1.0})
    small.set_pairs({"X": PairPath(1, 0, frozenset({"L"})), "Y": PairPath(1, 0, frozenset({"L"}))})
    assert small.equilibrium({"L"}) == {"L": pytest.approx(0.45)}


def test_a_pair_held_at_its_cap_elsewhere_or_at_a_small_guarantee_sets_no_factor():
    """A alone on L, held at 100 by M's factor: at its cap, so L keeps no
    entry (it is not L that limits it). Two pairs whose 0.5 Mb/s guarantees
    exceed L's 0.9: both sit at their floors -- no entry either (the
    free-rate test's tolerance is relative, and holds below 1 Mb/s)."""
    lf = LinkFactors(params(), {"L": 1000.0, "M": 1000.0})
    lf.set_pairs({"A": PairPath(1, 0, frozenset({"L", "M"}))})
    lf.r["M"] = 100.0
    assert lf.equilibrium({"L"}) == {}
    tiny = LinkFactors(params(), {"L": 1.0})
    tiny.set_pairs({"X": PairPath(1, 0.5, frozenset({"L"})), "Y": PairPath(1, 0.5, frozenset({"L"}))})
    assert tiny.equilibrium({"L"}) == {}


def test_equilibrium_factor_edges():
    """equilibrium_factor where mutation testing found it unpinned."""
    # one heavy pair: w 20 fills 10 at r = 0.5 (below 1: the bisection starts at 0, and the guarantees
    # branch is taken only when B alone fills the link)
    assert M.equilibrium_factor(10, [(20, 0, INF)]) == pytest.approx(0.5)
    # guarantees of 0.5 each fill 0.9: the least B/w, however small the B
    assert M.equilibrium_factor(0.9, [(1, 0.5, INF), (1, 0.5, INF)]) == pytest.approx(0.5)
    assert M.equilibrium_factor(2.0, [(1, 0.5, INF), (1, 2.0, INF)]) == pytest.approx(0.5)
    # held elsewhere at 1 with B/w = 10/2 = 5 above it: the load is flat at 10 < 20 from r = 0: answer 5 (B/w)
    assert M.equilibrium_factor(20, [(2, 10, 1.0)]) == pytest.approx(5)
    # the load reaches muC = 5 at r = 2 and stays there: the least such r, not the top of the flat part (3)
    assert M.equilibrium_factor(5, [(1, 0, 2.0), (1, 3, 1.0)]) == pytest.approx(2)
