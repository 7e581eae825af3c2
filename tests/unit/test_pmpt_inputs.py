"""PMPT's inputs at their edges (mutation survivors of 2026-11-29): each bad
value refused by name with a ValueError (never a TypeError from deep
inside), each edge value accepted; kept flows' and default-routed BG
flows' loads added up per link, whatever their size."""

from __future__ import annotations

import math

import numpy as np
import pytest

from apps.lessor.paths import PathDictionary
from apps.lessor.pmpt import MAX_DEMAND_BPS, LongFlow, pmpt
from controller.network_view import NetworkView
from mininet_topos import builders


@pytest.fixture(scope="module")
def pd():
    return PathDictionary(NetworkView(builders.fattree(4, link_mbps=10)))


@pytest.mark.parametrize("eps", ["0.1", None, True, 0, 0.5, -0.1, math.nan])
def test_a_bad_epsilon_is_refused_by_name(pd, eps):
    with pytest.raises(ValueError, match="epsilon="):
        pmpt([LongFlow("f", "e0_0", "e1_0", 1e6)], pd, epsilon=eps)


@pytest.mark.parametrize("phases", ["3", 1.5, True, 0, -1, None])
def test_a_bad_max_phases_is_refused_by_name(pd, phases):
    with pytest.raises(ValueError, match="max_phases=.*must be an integer >= 1"):
        pmpt([LongFlow("f", "e0_0", "e1_0", 1e6)], pd, max_phases=phases)


def test_one_phase_at_most_is_allowed(pd):
    a = pmpt([LongFlow("f", "e0_0", "e1_0", 1e6)], pd, max_phases=1)
    assert a.phases <= 1


@pytest.mark.parametrize("field,value,why", [
    ("demand", "1e6", "demand '1e6' must be a finite number"), ("demand", True, "demand True must be"),
    ("demand", MAX_DEMAND_BPS * 2, "demand .* must be a finite number in"),
    ("remaining_bytes", "5", "remaining_bytes '5' must be finite and >= 0"),
    ("remaining_bytes", -1, "remaining_bytes -1 must be finite and >= 0"),
    ("remaining_bytes", math.inf, "remaining_bytes inf must be finite"),
    ("bg", MAX_DEMAND_BPS * 2, "bg .* must be a finite number in")])
def test_a_bad_flow_field_is_refused_naming_the_flow(pd, field, value, why):
    f = LongFlow("f", "e0_0", "e1_0", 1e6)
    with pytest.raises(ValueError, match=f"flow 'f': {why}"):
        pmpt([LongFlow(**{**f.__dict__, field: value})], pd)


@pytest.mark.parametrize("field,value", [("demand", MAX_DEMAND_BPS), ("remaining_bytes", 0),
                                         ("remaining_bytes", 0.5), ("bg", MAX_DEMAND_BPS)])
def test_the_edges_of_each_range_are_accepted(pd, field, value):
    f = LongFlow("f", "e0_0", "e1_0", 1e6)
    a = pmpt([LongFlow(**{**f.__dict__, field: value})], pd)
    assert "f" in a.flow_path


def _path(pd, a, b, i=0):
    return pd.paths(a, b)[0][i]


def test_kept_flows_on_one_link_add_up_and_any_bg_above_zero_is_placed_as_bg(pd):
    """Two kept flows (fixed paths, no BG) share their first link: the rest
    is placed on what both leave; a flow with a fraction of a bit/s of BG
    is a BG flow (placed first, at its BG), not a kept one."""
    a_path, b_path = _path(pd, "e0_0", "e0_1", 0), _path(pd, "e0_0", "e0_1", 1)    # by a0_0 and by a0_1
    flows = [LongFlow("k1", "e0_0", "e0_1", 4e6, fixed_path=a_path),
             LongFlow("k2", "e0_0", "e0_1", 4e6, fixed_path=a_path),
             LongFlow("k3", "e0_0", "e0_1", 5e6, fixed_path=b_path), LongFlow("n", "e0_0", "e0_1", 4e6)]
    a = pmpt(flows, pd)
    assert a.flow_path["k1"] == a.flow_path["k2"] == a_path and a.flow_path["k3"] == b_path
    # 8 of a's 10 Mb/s kept, 5 of b's: n goes by b (2 left by a; one kept flow counted alone, 6)
    assert a.flow_path["n"] == b_path and a.integral_lam == pytest.approx(5e6 / 4e6)
    p = _path(pd, "e0_0", "e2_0")
    half = pmpt([LongFlow("b", "e0_0", "e2_0", 4e6, bg=0.5, fixed_path=p)], pd)
    assert half.flow_rate["b"] == 0.5 and half.placement == "BG first (1 flows); no other flows"
    assert half.bg_load == {lk: 0.5 for lk in zip(p, p[1:])}                # half a bit/s is BG on its links
    assert 0 < half.seconds < 10


def test_bg_on_default_routes_adds_up_per_link_and_the_residual_keeps_its_floor(pd):
    """Two BG flows on their default route share a link: their BG adds up
    there (bg_load), and what is left to the other flows is at least
    RESIDUAL_FLOOR of the link."""
    from apps.lessor.pmpt import RESIDUAL_FLOOR
    p, q = _path(pd, "e0_0", "e0_1", 0), _path(pd, "e0_0", "e0_1", 1)     # e0_0's two uplinks
    flows = [LongFlow("b1", "e0_0", "e0_1", 6e6, bg=6e6, fixed_path=p),
             LongFlow("b2", "e0_0", "e0_1", 6e6, bg=6e6, fixed_path=p),
             LongFlow("b3", "e0_0", "e0_1", 12e6, bg=12e6, fixed_path=q),
             LongFlow("w", "e0_0", "e0_1", 10e6)]
    a = pmpt(flows, pd)
    assert a.bg_load[(p[0], p[1])] == pytest.approx(12e6) and (p[0], p[1]) in a.bg_over
    # both uplinks over-full with BG: w gets what the floor leaves, RESIDUAL_FLOOR x C of 10 Mb/s
    assert a.integral_lam == pytest.approx(RESIDUAL_FLOOR * 10e6 / 10e6)
    assert np.isfinite(a.integral_lam)
    # BG exactly at mu x C is not over it (1e-9 of slack above, none below)
    full = pmpt([LongFlow("f1", "e0_0", "e0_1", 6e6, bg=6e6, fixed_path=p),
                 LongFlow("f2", "e0_0", "e0_1", 4e6, bg=4e6, fixed_path=p)], pd)
    assert full.bg_load[(p[0], p[1])] == pytest.approx(10e6) and full.bg_over == []


def test_unroutable_flows_of_any_key_kind_are_listed_together():
    """BG and other flows to a ToR cut off, keyed by a number and by text:
    one list, sorted by the keys' text (never compared across kinds)."""
    view = NetworkView(builders.fattree(4, link_mbps=10))
    for agg in ("a3_0", "a3_1"):
        view.set_link_state("e3_1", agg, False)
    pd = PathDictionary(view)
    a = pmpt([LongFlow(7, "e0_0", "e3_1", 1e6, bg=1e6), LongFlow("z", "e0_0", "e3_1", 1e6),
              LongFlow("ok", "e0_0", "e2_0", 1e6)], pd)
    assert a.unroutable == [7, "z"] and "ok" in a.flow_path


def test_the_collector_is_paused_for_a_decision_and_left_as_it_was_however_the_call_ends():
    """pmpt pauses Python's cyclic collector while it decides (its full
    collections rescan the whole heap: 0.3-0.4 s at k = 32) and leaves it as
    the caller had it: enabled again after a decision or a refusal, still
    disabled if the caller had disabled it."""
    import gc

    seen = []

    class Watching(PathDictionary):
        def paths(self, src, dst):
            seen.append(gc.isenabled())
            return super().paths(src, dst)

    watched = Watching(NetworkView(builders.fattree(4, link_mbps=10)))
    flows = [LongFlow("f", "e0_0", "e1_0", 1e6), LongFlow("g", "e0_0", "e2_0", 2e6)]
    assert gc.isenabled()
    pmpt(flows, watched)
    assert seen and not any(seen)
    assert gc.isenabled()
    with pytest.raises(ValueError):
        pmpt([LongFlow("f", "e0_0", "e1_0", math.nan)], watched)
    assert gc.isenabled()
    gc.disable()
    try:
        pmpt(flows, watched)
        assert not gc.isenabled()
    finally:
        gc.enable()
