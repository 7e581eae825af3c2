import pytest
from hypothesis import given, settings, strategies as st

from experiments.maxmin import max_min_fair


def test_textbook_example():
    # flows A: l1; B: l1,l2; C: l2 ; l1=10, l2=4 -> B and C share l2 (2 each), A gets 8
    cap = {"l1": 10.0, "l2": 4.0}
    assert max_min_fair([["l1"], ["l1", "l2"], ["l2"]], cap) == pytest.approx([8, 2, 2])


def test_demands_cap_rates_and_release_bandwidth():
    cap = {"l": 10.0}
    assert max_min_fair([["l"], ["l"]], cap, demands=[1, 100]) == pytest.approx([1, 9])


def test_errors():
    with pytest.raises(KeyError, match="no capacity"):
        max_min_fair([["x"]], {"l": 1.0})
    with pytest.raises(ValueError, match="demands"):
        max_min_fair([["l"]], {"l": 1.0}, demands=[1, 2])


def _instance(data, links: int, lo: float, hops: int, flows: int):
    """A random fabric: link capacities, and flows' paths over them."""
    n_links = data.draw(st.integers(1, links))
    cap = {i: data.draw(st.floats(lo, 100)) for i in range(n_links)}
    paths = data.draw(st.lists(st.lists(st.integers(0, n_links - 1), min_size=1, max_size=hops, unique=True),
                               min_size=1, max_size=flows))
    return cap, paths


def _loads(cap, paths, rates):
    load = {link: 0.0 for link in cap}
    for p, r in zip(paths, rates):
        assert r >= 0
        for link in p:
            load[link] += r
    return load


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_feasible_and_every_flow_has_a_bottleneck(data):
    cap, paths = _instance(data, 6, 0.5, 4, 8)
    rates = max_min_fair(paths, cap)
    load = _loads(cap, paths, rates)
    for link in cap:
        assert load[link] <= cap[link] * (1 + 1e-6)
    # max-min: each flow crosses a saturated link on which it has a largest rate
    for i, p in enumerate(paths):
        assert any(load[link] >= cap[link] * (1 - 1e-6)
                   and all(rates[i] >= rates[j] - 1e-6 for j, q in enumerate(paths) if link in q)
                   for link in p), (paths, rates)


# ---- weighted max-min and bad input (issue #31: a NaN capacity looped forever, NaN or negative input
# came back as NaN or negative rates; weighted_max_min was never called here)
from experiments.maxmin import weighted_max_min  # noqa: E402


def test_weighted_max_min_textbook():
    # one 12 Mb/s link, weights 1 and 2, guarantee 5 on the first: x with max(5, x) + 2x = 12 -> x = 3.5
    assert weighted_max_min([["l"], ["l"]], {"l": 12.0}, [1, 2], floors=[5, 0]) == pytest.approx([5, 7])
    # a demand frees bandwidth for the other flow
    assert weighted_max_min([["l"], ["l"]], {"l": 12.0}, [1, 1], demands=[2, float("inf")]) == pytest.approx([2, 10])


_bad = st.sampled_from([float("nan"), float("inf"), -1.0, -1e-9])


@settings(max_examples=100, deadline=None)
@given(_bad, st.sampled_from(["capacity", "demand", "weight", "floor"]))
def test_bad_inputs_are_refused_by_name_and_never_loop(bad, where):
    if where == "demand" and bad == float("inf"):
        return                                             # infinity is "no demand limit"
    cap = {"l": bad if where == "capacity" else 10.0}
    demands = [bad if where == "demand" else 5.0, 5.0]
    weights = [bad if where == "weight" else 1.0, 1.0]
    floors = [bad if where == "floor" else 0.0, 0.0]
    with pytest.raises(ValueError, match=where):
        weighted_max_min([["l"], ["l"]], cap, weights, floors=floors, demands=demands)
    if where in ("capacity", "demand"):
        with pytest.raises(ValueError, match=where):
            max_min_fair([["l"], ["l"]], cap, demands=demands)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_weighted_rates_are_feasible_and_each_flow_gets_its_floor_or_a_full_link(data):
    cap, paths = _instance(data, 5, 1, 3, 6)
    weights = [data.draw(st.floats(0.1, 10)) for _ in paths]
    rates = weighted_max_min(paths, cap, weights)
    load = _loads(cap, paths, rates)
    assert all(load[i] <= cap[i] * (1 + 1e-6) for i in cap)
    for p in paths:                                         # no floors or demands: every flow meets a full link
        assert any(load[link] >= cap[link] * (1 - 1e-6) for link in p)
