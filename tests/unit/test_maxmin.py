import pytest
from hypothesis import given, settings, strategies as st

from controller.maxmin import max_min_fair


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


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_feasible_and_every_flow_has_a_bottleneck(data):
    n_links = data.draw(st.integers(1, 6))
    cap = {i: data.draw(st.floats(0.5, 100)) for i in range(n_links)}
    paths = data.draw(st.lists(st.lists(st.integers(0, n_links - 1), min_size=1, max_size=4, unique=True),
                               min_size=1, max_size=8))
    rates = max_min_fair(paths, cap)
    load = {link: 0.0 for link in cap}
    for p, r in zip(paths, rates):
        for link in p:
            load[link] += r
    for link in cap:
        assert load[link] <= cap[link] * (1 + 1e-6)
    # max-min: each flow crosses a saturated link on which it has a largest rate
    for i, p in enumerate(paths):
        assert any(load[link] >= cap[link] * (1 - 1e-6)
                   and all(rates[i] >= rates[j] - 1e-6 for j, q in enumerate(paths) if link in q)
                   for link in p), (paths, rates)
