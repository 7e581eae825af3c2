"""LESSOR's path dictionary: the compiled enumeration gives exactly the
paths (and order) of :meth:`NetworkView.equal_cost_paths`, over failures and
zero-capacity links, and node paths are built lazily but behave as a list."""

import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from apps.lessor import paths as P
from apps.lessor.paths import NodePaths, PathDictionary
from controller.network_view import NetworkView
from mininet_topos import builders

FABRICS = {
    "fattree4": lambda: builders.fattree(4, link_mbps=10),
    "fattree6": lambda: builders.fattree(6, link_mbps=10),
    "vl2": lambda: builders.vl2(2, 4, 4, servers_per_tor=2),
    "testbed": lambda: builders.lessor_testbed(link_mbps=10),
    "bgwc_large": lambda: builders.bgwc_large(hosts_per_tor=2),
}


def _switch_links(view):
    return sorted((u, v) for u, v in view.graph.edges if not view.is_host(u) and not view.is_host(v) and u < v)


def _reference(view, pd, a, b):
    """What PathDictionary.paths gave before the compiled walk: the view's
    equal-cost paths, those over a zero-capacity link dropped."""
    if a == b:
        return [(a,)]
    return [p for p in view.equal_cost_paths(a, b)
            if all(pd.capacity[pd.index[lk]] > 0 for lk in view.path_links(p))]


@settings(max_examples=40, deadline=None)
@given(fabric=st.sampled_from(sorted(FABRICS)), seed=st.integers(0, 10**6), down=st.integers(0, 6),
       zero=st.integers(0, 3))
def test_the_paths_are_the_views_equal_cost_paths_in_its_order(fabric, seed, down, zero):
    view = NetworkView(FABRICS[fabric]())
    rng = random.Random(seed)
    links = _switch_links(view)
    for u, v in rng.sample(links, min(down, len(links))):
        view.set_link_state(u, v, False)
    pd = PathDictionary(view)
    for i in rng.sample(range(len(pd.capacity)), zero):
        pd.capacity[i] = 0.0
    switches = view.switches
    for a, b in [(rng.choice(switches), rng.choice(switches)) for _ in range(40)]:
        nodes, idx = pd.paths(a, b)
        want = _reference(view, pd, a, b)
        assert list(nodes) == want, (a, b)
        assert idx.shape == ((len(want), len(want[0]) - 1) if want else (0, 0))
        for row, p in zip(idx, want):
            assert [pd.links[e] for e in row] == view.path_links(p)


def test_a_link_change_drops_the_cached_paths():
    view = NetworkView(builders.fattree(4, link_mbps=10))
    pd = PathDictionary(view)
    before = list(pd.paths("e0_0", "e2_0")[0])
    assert len(before) == 4
    view.set_link_state("a0_0", "c1", False)
    after = list(pd.paths("e0_0", "e2_0")[0])
    assert after == [p for p in before if "c1" not in p] and len(after) == 3
    view.set_link_state("a0_0", "c1", True)
    assert list(pd.paths("e0_0", "e2_0")[0]) == before


def test_disconnected_and_same_tor_pairs():
    view = NetworkView(builders.fattree(4, link_mbps=10))
    for agg in ("a0_0", "a0_1"):
        view.set_link_state("e0_0", agg, False)
    pd = PathDictionary(view)
    nodes, idx = pd.paths("e0_0", "e2_0")
    assert len(nodes) == 0 and idx.shape == (0, 0)
    nodes, idx = pd.paths("e1_0", "e1_0")
    assert list(nodes) == [("e1_0",)] and idx.shape == (1, 0)


def test_at_most_the_limit_first_paths_in_depth_first_order(monkeypatch):
    view = NetworkView(builders.fattree(6, link_mbps=10))
    want = view.equal_cost_paths("e0_0", "e3_0", limit=5)
    monkeypatch.setattr(P, "PATH_LIMIT", 5)
    pd = PathDictionary(view)
    assert list(pd.paths("e0_0", "e3_0")[0]) == want and len(want) == 5
    # a link of one of those five goes down: a list cut at the limit is walked again, not filtered
    u, v = want[0][1], want[0][2]
    view.set_link_state(u, v, False)
    again = view.equal_cost_paths("e0_0", "e3_0", limit=5)
    assert list(pd.paths("e0_0", "e3_0")[0]) == again and len(again) == 5


def test_node_paths_behave_as_the_list_they_stand_for():
    view = NetworkView(builders.fattree(4, link_mbps=10))
    pd = PathDictionary(view)
    nodes, _ = pd.paths("e0_0", "e3_1")
    want = view.equal_cost_paths("e0_0", "e3_1")
    assert isinstance(nodes, NodePaths)
    assert len(nodes) == len(want) == 4
    assert [nodes[i] for i in range(4)] == want and nodes[-1] == want[-1] and nodes[1:3] == want[1:3]
    assert want[2] in nodes and ("e0_0", "e3_1") not in nodes and nodes.index(want[3]) == 3
    assert nodes == want and nodes != want[:3] and list(reversed(nodes)) == want[::-1]
    assert nodes[2] is nodes[2]               # built once
    with pytest.raises(IndexError):
        nodes[4]
    with pytest.raises(IndexError):
        nodes[-5]


def test_the_distances_are_bfs_hop_counts_over_up_links():
    view = NetworkView(builders.fattree(4, link_mbps=10))
    view.set_link_state("a1_0", "c1", False)
    pd = PathDictionary(view)
    out_start, out_link, out_head, in_start, in_tail = pd._adjacency()
    for dst in ("e0_0", "c1", "a1_0"):
        dist = P._distances(pd.node_id[dst], in_start, in_tail)
        want = view.distances_to(dst)
        assert {pd.nodes[i]: int(d) for i, d in enumerate(dist) if d >= 0} == want
    # out-links in port order, only those up
    for n, name in enumerate(pd.nodes):
        heads = [pd.nodes[h] for h in out_head[out_start[n]:out_start[n + 1]]]
        ports = [view.port(name, h) for h in heads]
        assert ports == sorted(ports)
        assert set(heads) == {v for v in view.graph.successors(name) if not view.is_host(v)
                              and view.link_up(name, v)}
        assert np.array_equal(pd._tail[out_link[out_start[n]:out_start[n + 1]]], np.full(len(heads), n))


@settings(max_examples=60, deadline=None)
@given(fabric=st.sampled_from(sorted(FABRICS)), seed=st.integers(0, 10**6),
       changes=st.lists(st.lists(st.tuples(st.integers(0, 10**6), st.booleans()), min_size=1, max_size=3),
                        min_size=1, max_size=6))
def test_paths_kept_across_link_changes_are_what_a_new_walk_gives(fabric, seed, changes):
    """Pairs asked for before a batch of changes are asked again after it
    (links going down and coming back, several at once): every answer is
    the view's equal-cost paths in its order, whether the pair kept its
    paths (its hop count unchanged, no new shortest path over a link that
    came up) or was walked afresh."""
    view = NetworkView(FABRICS[fabric]())
    rng = random.Random(seed)
    links = _switch_links(view)
    pd = PathDictionary(view)
    pd.capacity[rng.randrange(len(pd.capacity))] = 0.0
    pairs = [(rng.choice(view.switches), rng.choice(view.switches)) for _ in range(30)]
    for batch in changes:
        for a, b in pairs:
            pd.paths(a, b)
        for pick, up in batch:      # up: one of the links down comes back (if any is down)
            down = [lk for lk in links if not view.link_up(*lk)]
            u, v = down[pick % len(down)] if up and down else links[pick % len(links)]
            view.set_link_state(u, v, up and bool(down))
        for a, b in pairs:
            nodes, idx = pd.paths(a, b)
            want = _reference(view, pd, a, b)
            assert list(nodes) == want, (a, b)
            assert idx.shape == ((len(want), len(want[0]) - 1) if want else (0, 0))


def test_a_link_change_walks_only_the_pairs_it_lengthened_or_can_shorten_or_widen():
    view = NetworkView(builders.fattree(4, link_mbps=10))
    pd = PathDictionary(view)
    tors = [s for s in view.switches if s.startswith("e")]
    pairs = [(a, b) for a in tors for b in tors if a != b]
    before = {p: list(pd.paths(*p)[0]) for p in pairs}
    walked = pd.walked
    view.set_link_state("a0_0", "c1", False)              # every pair keeps its hop count
    after = {p: list(pd.paths(*p)[0]) for p in pairs}
    assert pd.walked == walked and pd.filtered == len(pairs)
    assert all(after[p] == [q for q in before[p] if not {"a0_0", "c1"} <= set(q)] for p in pairs)
    assert after[("e0_0", "e2_0")] != before[("e0_0", "e2_0")]
    view.set_link_state("e0_0", "a0_0", False)
    view.set_link_state("e0_0", "a0_1", False)            # e0_0 cut off: its pairs lose every path
    assert len(pd.paths("e0_0", "e2_0")[0]) == 0 and pd.paths("e0_0", "e2_0")[1].shape == (0, 0)
    for p in pairs:
        pd.paths(*p)
    # a link back: walked afresh are exactly the pairs one of whose new shortest paths crosses it (e0_1 to and
    # from the other pods: 12 of 56); every other pair keeps its paths, e0_0's none included
    view.set_link_state("a0_0", "c1", True)
    filtered, walked = pd.filtered, pd.walked
    back = {p: list(pd.paths(*p)[0]) for p in pairs}
    assert all(back[p] == _reference(view, pd, *p) for p in pairs)
    crossing = {p for p, paths in back.items()
                if any({q[i], q[i + 1]} == {"a0_0", "c1"} for q in paths for i in range(len(q) - 1))}
    assert len(crossing) == 12 and all("e0_1" in p for p in crossing)
    assert pd.walked - walked == len(crossing) and pd.filtered - filtered == len(pairs) - len(crossing)
    assert back[("e1_0", "e2_0")] == before[("e1_0", "e2_0")] and back[("e0_0", "e2_0")] == []


def test_the_links_down_are_the_views_link_states():
    view = NetworkView(builders.fattree(4, link_mbps=10))
    pd = PathDictionary(view)
    assert view.links_down() == frozenset() and pd.link_ends()[2].all()
    view.set_link_state("a0_0", "c1", False)
    view.set_link_state("e1_0", "h5", False)              # a host's link: not one of the fabric's
    assert view.links_down() == {("a0_0", "c1"), ("c1", "a0_0"), ("e1_0", "h5"), ("h5", "e1_0")}
    alive = pd.link_ends()[2]
    assert [pd.links[i] for i in (~alive).nonzero()[0]] == [("a0_0", "c1"), ("c1", "a0_0")]
    assert list(alive) == [view.link_up(u, v) for u, v in pd.links]
    view.set_link_state("a0_0", "c1", True)
    assert view.links_down() == {("e1_0", "h5"), ("h5", "e1_0")} and pd.link_ends()[2].all()
