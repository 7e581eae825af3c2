"""Exact one-path routing of equal-demand flows on Clos fabrics, by recursive
bipartite edge colouring (the rearrangeable-Clos argument: König's theorem,
constructed with Kempe-chain swaps).

Structure, detected from the candidate paths (not from switch names): a path
of 2L hops goes up L layers and comes down L layers, and at every level l
the rank of the up-link among its lower node's up-links equals the rank of
the mirrored down-link among *its* lower node's up-links. Then choosing a
path is choosing a rank per level ("colour"); in a fat-tree level 1 is the
aggregation switch, level 2 the core in that aggregation's group.

Level l is a bipartite multigraph: left node = the flow's node at height
l-1 on the way up, right node = its node at height l-1 on the way down, one
edge per flow. With every flow of demand d and every link able to carry m
such flows, each node has (#ranks x m) colour slots; a proper colouring
exists whenever no node has more flows than slots, and Kempe chains (swap
two colours along an alternating path) find it. Flows then recurse into
level l+1 grouped by the node their colour leads to.

Applies when: all flows have the same demand d > 0, every fabric link's
capacity is the same multiple m >= 1 of d, and every group's paths have the
Clos structure above with every rank combination present. Otherwise
``route`` returns None and the caller uses its general placement.
"""

from __future__ import annotations

from typing import Hashable

import numpy as np

from controller.network_view import NetworkView


class _Colouring:
    """Proper edge colouring of a bipartite multigraph, built edge by edge."""

    def __init__(self, n_colours: int):
        self.n = n_colours
        self.at: dict[tuple[int, Hashable], dict[int, int]] = {}  # (side, node) -> colour -> edge
        self.colour: dict[int, int] = {}
        self.ends: dict[int, tuple[Hashable, Hashable]] = {}

    def _free(self, side: int, node: Hashable) -> int | None:
        used = self.at.get((side, node), {})
        for c in range(self.n):
            if c not in used:
                return c
        return None

    def _set(self, edge: int, c: int) -> None:
        u, v = self.ends[edge]
        self.colour[edge] = c
        self.at.setdefault((0, u), {})[c] = edge
        self.at.setdefault((1, v), {})[c] = edge

    def _unset(self, edge: int) -> None:
        u, v = self.ends[edge]
        c = self.colour.pop(edge)
        del self.at[(0, u)][c]
        del self.at[(1, v)][c]

    def add(self, edge: int, u: Hashable, v: Hashable) -> bool:
        self.ends[edge] = (u, v)
        a, b = self._free(0, u), self._free(1, v)
        if a is None or b is None:
            return False
        if a not in self.at.get((1, v), {}):
            self._set(edge, a)
            return True
        # Kempe chain: from v, follow edges coloured a, b, a, ... and swap a<->b.
        chain, side, node, want = [], 1, v, a
        while True:
            e = self.at.get((side, node), {}).get(want)
            if e is None:
                break
            chain.append(e)
            node = self.ends[e][0] if side == 1 else self.ends[e][1]
            side = 1 - side
            want = b if want == a else a
        old = {e: self.colour[e] for e in chain}
        for e in chain:
            self._unset(e)
        for e in chain:
            self._set(e, b if old[e] == a else a)
        self._set(edge, a)
        return True


def _ups(view: NetworkView, lower: str, cache: dict) -> list[str]:
    """The switches above ``lower`` that it has a working link to, by port."""
    ups = cache.get(lower)
    if ups is None:
        layer = view.graph.nodes[lower]["layer"]
        ups = sorted((v for v in view.graph.successors(lower)
                      if not view.is_host(v) and view.graph.nodes[v]["layer"] > layer
                      and view.link_up(lower, v)), key=lambda v: view.port(lower, v))
        cache[lower] = ups
    return ups


def _up_rank(view: NetworkView, lower: str, upper: str, cache: dict) -> int | None:
    ups = _ups(view, lower, cache)
    return ups.index(upper) if upper in ups else None


def route(view: NetworkView, groups, order, cap: np.ndarray) -> dict[Hashable, int] | None:
    """Path index (within its group) for every flow, or None if not applicable."""
    demands = {f.demand for _, f in order}
    if len(demands) != 1:
        return None
    d = demands.pop()
    used = np.unique(np.concatenate([g.idx.ravel() for g in groups]))
    if d <= 0 or not len(used):
        return None
    mult = cap[used] / d
    m_max = int(np.floor(mult.min() + 1e-9))
    if m_max < 1 or np.any(np.abs(mult - mult[0]) > 1e-9):
        return None
    ranks: dict = {}
    # per group: colour tuple -> path index, and the path's level nodes
    lookup: list[dict[tuple[int, ...], int]] = []
    for g in groups:
        table = {}
        for p, nodes in enumerate(g.nodes):
            hops = len(nodes) - 1
            if hops % 2:
                return None
            levels = hops // 2
            colour = []
            for lvl in range(1, levels + 1):
                up = _up_rank(view, nodes[lvl - 1], nodes[lvl], ranks)
                down = _up_rank(view, nodes[hops - lvl + 1], nodes[hops - lvl], ranks)
                if up is None or up != down:
                    return None
                colour.append(up)
            table[tuple(colour)] = p
        lookup.append(table)
    # fewest flows per link first: that is the lowest maximum load
    for m in range(1, m_max + 1):
        try:
            out = _colour_levels(view, groups, order, lookup, ranks, m)
        except KeyError:
            # a group lacks the path of some colour (a link down or of zero
            # capacity): the fabric is no complete Clos, the colouring does not apply
            return None
        if out is not None:
            return out
    return None


def _colour_levels(view, groups, order, lookup, ranks, m: int) -> dict[Hashable, int] | None:
    prefix: dict[Hashable, tuple[int, ...]] = {f.key: () for _, f in order}
    gi_of = {f.key: gi for gi, f in order}
    level = 0
    while True:
        pending = [(gi, f) for gi, f in order
                   if len(groups[gi].nodes[0]) - 1 > 2 * level]
        if not pending:
            break
        # split by the level's bipartite graph: nodes at height `level`
        buckets: dict[int, list] = {}
        for gi, f in pending:
            nodes = groups[gi].nodes[lookup[gi][_first_with_prefix(lookup[gi], prefix[f.key])]]
            hops = len(nodes) - 1
            left, right = nodes[level], nodes[hops - level]
            buckets.setdefault(len(_ups(view, left, ranks)), []).append((gi, f, left, right))
        for n_ranks, items in sorted(buckets.items()):
            col = _Colouring(n_ranks * m)
            for i, (gi, f, left, right) in enumerate(items):
                if not col.add(i, left, right):
                    return None  # a node is oversubscribed: no proper colouring
            for i, (gi, f, _, _) in enumerate(items):
                prefix[f.key] = prefix[f.key] + (col.colour[i] // m,)
        level += 1
    out = {}
    for _, f in order:
        p = lookup[gi_of[f.key]].get(prefix[f.key])
        if p is None:
            return None
        out[f.key] = p
    return out


def _first_with_prefix(table: dict[tuple[int, ...], int], prefix: tuple[int, ...]) -> tuple[int, ...]:
    for colour in sorted(table):
        if colour[:len(prefix)] == prefix:
            return colour
    raise KeyError(prefix)
