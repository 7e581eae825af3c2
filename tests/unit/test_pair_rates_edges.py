"""The host's per-pair state (hostagent.pair_rates.PairRates), the edges the
mutation pass of 2026-11-29 found untested: every bad term refused by its
pair and its name, nothing taken when one is bad; a guarantee equal to the
NIC taken; a pair without a fresh factor skipped, not the rest of the
round; the hold and fallback ages strict."""

from __future__ import annotations

import pytest

from bwcommon import lrc as M
from hostagent.pair_rates import PairRates


def rates(**kw) -> PairRates:
    return PairRates(M.LrcParams(**kw), nic_mbps=100.0)


@pytest.mark.parametrize("terms, words", [
    ({"a": (10.0, 1.0)}, "pair 'a': terms must be (r_tilde, weight, guarantee)"),
    ({"a": "10,1,5"}, "pair 'a': terms must be (r_tilde, weight, guarantee)"),
    ({"a": (10.0, 0.0, 5.0)}, "pair 'a' weight"),
    ({"a": (0.0, 1.0, 5.0)}, "pair 'a' r_tilde"),
    ({"a": (10.0, 1.0, -1.0)}, "pair 'a' guarantee"),
    ({"a": (10.0, 1.0, 100.5)}, "pair 'a' guarantee 100.5 above the NIC's 100 Mb/s"),
])
def test_bad_terms_are_refused_by_their_pair_and_name_and_none_is_taken(terms, words):
    r = rates()
    with pytest.raises(M.LrcError) as err:
        r.set_terms({"ok": (10.0, 1.0, 5.0), **terms}, now=1.0)
    assert words in str(err.value)
    assert r.pairs == {}


def test_a_guarantee_of_the_whole_nic_is_taken():
    r = rates()
    r.set_terms({"a": (10.0, 1.0, 100.0)}, now=1.0)
    assert r.pairs["a"].guarantee_mbps == 100.0


@pytest.mark.parametrize("guarantee, weight, words", [
    (-1.0, 1.0, "guarantee -1.0 must be a non-negative finite number"),
    (5.0, 0.0, "weight 0.0 must be a positive finite number")])
def test_a_pair_opened_with_a_bad_value_is_refused_by_name(guarantee, weight, words):
    r = rates()
    with pytest.raises(M.LrcError) as err:
        r.open("a", guarantee, weight)
    assert str(err.value) == words
    assert "a" not in r.pairs


def test_an_opened_pair_keeps_its_weight_and_climbs_once_a_factor_comes():
    r = rates(alpha=20.0, tau_v_s=0.01)
    r.open("a", 5.0, 3.0)
    assert (r.pairs["a"].weight, r.pairs["a"].guarantee_mbps, r.pairs["a"].r_tilde) == (3.0, 5.0, None)


def test_a_pair_without_a_fresh_factor_is_skipped_not_the_rest_of_the_round():
    r = rates(alpha=20.0, tau_v_s=0.01, hold_s=1.0)
    r.open("stale", 5.0, 1.0)                          # no factor yet: first in the round, skipped
    r.set_terms({"fresh": (50.0, 1.0, 5.0)}, now=10.0)
    before = r.pairs["fresh"].v
    r.step(now=10.5)
    assert r.pairs["fresh"].v != before and r.pairs["stale"].v == 5.0


def test_the_hold_and_the_fallback_are_strict_ages():
    r = rates(alpha=20.0, tau_v_s=0.01, hold_s=1.0, fallback_s=2.0)
    r.set_terms({"a": (50.0, 1.0, 5.0)}, now=10.0)
    before = r.pairs["a"].v
    r.step(now=11.0)                                   # exactly hold_s old: still fresh
    assert r.pairs["a"].v != before
    assert r.limit("a", now=12.0) == M.enforced_rate(5.0, r.pairs["a"].v) != 5.0   # exactly fallback_s: not yet
    assert r.limit("a", now=12.001) == 5.0


@pytest.mark.parametrize("b, v, words", [(-1.0, 2.0, "B_i -1.0 must be a non-negative finite number"),
                                         (2.0, -1.0, "v_i -1.0 must be a non-negative finite number"),
                                         (float("nan"), 2.0, "B_i nan must be a non-negative finite number")])
def test_eq_28_refuses_a_bad_guarantee_or_rate_by_its_name(b, v, words):
    with pytest.raises(M.LrcError) as err:
        M.enforced_rate(b, v)
    assert str(err.value) == words


@pytest.mark.parametrize("step, i, bad, words", [
    # v, w_i, r_tilde, alpha, tau_v, v_floor, NIC
    (M.next_pair_rate, 0, 0.0, "v 0.0 must be a positive finite number"),
    (M.next_pair_rate, 1, -1.0, "w_i -1.0 must be a positive finite number"),
    (M.next_pair_rate, 2, 0.0, "r_tilde 0.0 must be a positive finite number"),
    (M.next_pair_rate, 3, 0.0, "alpha·tau_v 0.0 must be a positive finite number"),
    # r, load, muC, beta, tau_r, floor, cap
    (M.next_link_factor, 0, 0.0, "r 0.0 must be a positive finite number"),
    (M.next_link_factor, 1, -1.0, "load -1.0 must be a non-negative finite number"),
    (M.next_link_factor, 2, 0.0, "muC 0.0 must be a positive finite number"),
    (M.next_link_factor, 3, 0.0, "beta·tau_r 0.0 must be a positive finite number")])
def test_eq_27s_two_steps_refuse_each_bad_input_by_its_name(step, i, bad, words):
    args = [10.0, 1.0, 20.0, 20.0, 0.01, 1.0, 100.0] if step is M.next_pair_rate else \
        [1.0, 50.0, 90.0, 2.0, 0.1, 0.01, 100.0]
    args[i] = bad
    with pytest.raises(M.LrcError) as err:
        step(*args)
    assert str(err.value) == words
