"""LinkFactors (apps/lrc/control.py) where the mutation pass of 2026-11-29
found it untested: the controller's model of the hosts' v (its delay line
and steps), a link's own μ, pairs kept across set_pairs, refusals by name,
links of any hashable kind, and the round's counters and thresholds."""

from __future__ import annotations

import math

import pytest

from apps.lrc.control import LinkFactors, PairPath
from bwcommon import lrc as M


def _model_reference(params, factors_per_round, pairs, v0):
    """The hosts' Eq. 27 as the controller must model it: in round t the
    hosts use the factors of round t - lag (none before: v stays),
    round(tau_r / tau_v) steps a round."""
    lag = round(params.feedback_delay_s / params.tau_r_s)
    steps = max(1, round(params.tau_r_s / params.tau_v_s))
    v = dict(v0)
    for t in range(len(factors_per_round)):
        if t < lag:
            continue
        sent = factors_per_round[t - lag]
        for pair, pp in pairs.items():
            if not pp.links or pair not in sent:
                continue
            for _ in range(steps):
                v[pair] = M.next_pair_rate(v[pair], pp.weight, sent[pair], params.alpha, params.tau_v_s,
                                           params.v_floor_mbps, math.inf)
    return v


@pytest.mark.parametrize("tau_v,delay", [(0.02, 0.3), (0.05, 0.0), (0.1, 0.1), (0.01, 0.45)])
def test_the_model_of_the_hosts_v_runs_their_steps_on_the_factors_of_the_delay_ago(tau_v, delay):
    p = M.LrcParams(tau_r_s=0.1, tau_v_s=tau_v, feedback_delay_s=delay, alpha=5.0, anti_windup=False)
    lf = LinkFactors(p, {"L1": 100.0, "L2": 60.0})
    pairs = {"Z": PairPath(1, 0, frozenset()),                     # no links: never modelled (and first)
             "A": PairPath(1, 2, frozenset({"L1"})),
             "B": PairPath(2, 0, frozenset({"L1", "L2"}))}
    lf.set_pairs(pairs)
    v0 = dict(lf.v_hat)
    sent = []
    for t, (l1, l2) in enumerate([(10, 5), (120, 70), (90, 20), (80, 59), (40, 61), (100, 10), (5, 5), (95, 50)]):
        lf.update({"L1": float(l1), "L2": float(l2)})
        sent.append(lf.factors())
        want = _model_reference(p, sent, pairs, v0)
        assert lf.v_hat == pytest.approx(want, rel=1e-12), (t, lf.v_hat, want)
    assert lf.v_hat["Z"] == v0["Z"]
    assert lf.v_hat["A"] != v0["A"] and lf.v_hat["B"] != v0["B"]
    assert len(lf.sent) == round(delay / 0.1) + 1                  # the delay line holds lag + 1 rounds


def test_a_links_own_mu_sets_its_mu_c():
    p = M.LrcParams(mu=0.9)
    lf = LinkFactors(p, {"L1": 100.0, "L2": 100.0}, mu_by_link={"L1": 0.5})
    assert lf.mu_c("L1") == pytest.approx(50.0) and lf.mu_c("L2") == pytest.approx(90.0)


def test_pairs_kept_across_set_pairs_keep_their_modelled_v():
    p = M.LrcParams(tau_r_s=0.1, tau_v_s=0.05, feedback_delay_s=0.0)
    lf = LinkFactors(p, {"L": 100.0})
    lf.set_pairs({"A": PairPath(1, 0, frozenset({"L"}))})
    for _ in range(5):
        lf.update({"L": 10.0})
    v = lf.v_hat["A"]
    assert v != max(0, p.v_floor_mbps)
    lf.set_pairs({"A": PairPath(1, 0, frozenset({"L"})), "N": PairPath(1, 3, frozenset({"L"}))})
    assert lf.v_hat == {"A": v, "N": 3.0}


@pytest.mark.parametrize("pair,why", [(PairPath(1, -1, frozenset({"L"})), "guarantee of pair 'A'"),
                                      (PairPath(0, 1, frozenset({"L"})), "weight of pair 'A'"),
                                      (PairPath(1, 1, frozenset({"X"})), "pair 'A' crosses links without")])
def test_a_bad_pair_is_refused_by_its_name_and_changes_nothing(pair, why):
    lf = LinkFactors(M.LrcParams(), {"L": 100.0})
    lf.set_pairs({"B": PairPath(1, 0, frozenset({"L"}))})
    before = (dict(lf.r), dict(lf.pairs), dict(lf.v_hat))
    with pytest.raises(M.LrcError, match=why):
        lf.set_pairs({"A": pair})
    assert (lf.r, lf.pairs, lf.v_hat) == before


def test_links_of_any_hashable_kind_and_a_missing_load_skips_only_its_link():
    """Links named by tuples and numbers together (sorted by their repr, not
    compared); a link without a load keeps its factor, the links after it
    in that order are still stepped, and each bad load is counted."""
    lf = LinkFactors(M.LrcParams(anti_windup=False), {("a", "b"): 100.0, 7: 100.0, "z": 100.0})
    lf.set_pairs({"P": PairPath(1, 0, frozenset({("a", "b")})), "Q": PairPath(1, 0, frozenset({7})),
                  "R": PairPath(1, 0, frozenset({"z"}))})
    lf.r.update({7: 30.0, ("a", "b"): 30.0, "z": 30.0})               # below their caps: room to rise
    before = dict(lf.r)
    assert sorted(lf.members, key=repr)[0] == "z"                   # the first in the round's order
    lf.update({7: 10.0, ("a", "b"): 10.0})                           # "z" has no sample
    assert lf.r["z"] == before["z"]
    assert lf.r[7] > before[7] and lf.r[("a", "b")] > before[("a", "b")]
    lf.update({("a", "b"): math.nan, 7: -1.0, "z": 10.0})
    assert lf.refused_loads == 2


def test_a_link_at_exactly_the_saturation_load_is_full_and_each_drop_is_counted():
    """Full means load >= saturation x C. A full link whose factor is above
    its equilibrium drops to it (counted each time); one exactly at it does
    not count a drop."""
    p = M.LrcParams(mu=0.9, saturation=0.9, anti_windup=False, rescale="weights")
    lf = LinkFactors(p, {"L": 100.0})
    lf.set_pairs({"A": PairPath(1, 0, frozenset({"L"})), "B": PairPath(1, 0, frozenset({"L"}))})
    eq = lf.equilibrium({"L"})["L"]
    lf.r["L"] = 3 * eq
    lf.update({"L": 90.0})                   # exactly 0.9 x C, and = μC: Eq. 27 leaves r as it was
    assert lf.r["L"] == pytest.approx(eq) and lf.saturation_drops == 1
    lf.r["L"] = eq
    lf.update({"L": 90.0})                   # at its equilibrium already (Eq. 27 leaves it a rounding below): no drop
    assert lf.saturation_drops == 1
    lf.r["L"] = 2 * eq
    lf.update({"L": 95.0})
    assert lf.saturation_drops == 2


def test_set_pairs_reseeds_exactly_the_links_whose_pairs_or_terms_changed():
    """The same pairs again: nothing re-seeded, every factor kept. A pair's
    weight changed on one link: that link alone, whichever order the links
    come in (the first one unchanged), each re-seed counted."""
    p = M.LrcParams(rescale="weights", anti_windup=False)
    lf = LinkFactors(p, {"L1": 100.0, "L2": 100.0, "L3": 100.0})
    pairs = {"A": PairPath(1, 0, frozenset({"L1"})), "B": PairPath(1, 0, frozenset({"L2"})),
             "C": PairPath(1, 0, frozenset({"L3"}))}
    assert lf.set_pairs(pairs) == {"L1", "L2", "L3"} and lf.rescales == 0      # new links: seeded, no rescale
    lf.r.update({"L1": 40.0, "L2": 41.0, "L3": 42.0})
    assert lf.set_pairs(dict(pairs)) == set()
    assert lf.r == {"L1": 40.0, "L2": 41.0, "L3": 42.0} and lf.rescales == 0
    changed = dict(pairs, B=PairPath(2, 0, frozenset({"L2"})), C=PairPath(1, 5, frozenset({"L3"})))
    assert lf.set_pairs(changed) == {"L2", "L3"}
    assert lf.r["L1"] == 40.0 and lf.rescales == 2


def test_a_new_link_is_seeded_at_eq_7_unless_the_rescale_is_equilibrium():
    """A link no pair crossed before starts at μC/Σw (Eq. 7) with rescale
    none or weights, at its equilibrium (the guarantees counted) with
    rescale equilibrium."""
    pairs = {"A": PairPath(1, 60, frozenset({"L"})), "B": PairPath(1, 0, frozenset({"L"}))}
    for rescale, want in (("weights", 90.0 / 2), ("none", 90.0 / 2), ("equilibrium", 30.0)):  # 60 + 30 = 90
        lf = LinkFactors(M.LrcParams(mu=0.9, rescale=rescale), {"L": 100.0})
        lf.set_pairs(pairs)
        assert lf.r["L"] == pytest.approx(want), rescale


@pytest.mark.parametrize("cap,mu,why", [
    ({"L": 0.0}, {}, "capacity of link 'L'"), ({"L": math.nan}, {}, "capacity of link 'L'"),
    ({"L": 100.0}, {"L": True}, "mu of link 'L'"), ({"L": 100.0}, {"L": "0.5"}, "mu of link 'L'"),
    ({"L": 100.0}, {"L": 0.0}, "mu of link 'L'"), ({"L": 100.0}, {"L": 1.5}, "mu of link 'L'"),
    ({"L": 100.0}, {"L": math.inf}, "mu of link 'L'")])
def test_capacities_and_links_own_mu_are_refused_by_the_links_name(cap, mu, why):
    with pytest.raises(M.LrcError, match=why):
        LinkFactors(M.LrcParams(), cap, mu_by_link=mu)
