"""Candidate paths between ToR (edge) switches, as link-index arrays.

The fabric's switch-to-switch links are numbered once; a ToR pair's candidate
paths are its equal-cost shortest paths over links that are up, computed once
per pair and kept until the view's link state changes (PMPT groups flows per
ToR pair, so each group's paths are computed once). In a fat-tree an
inter-pod path is fixed by its core switch: the upward half (edge ->
aggregation -> core) is the only choice, the way down is determined.

The paths are enumerated by a compiled depth-first walk over the links that
go one hop nearer the destination (built once per destination from the up
links, each node's in port order) -- the same paths in the same order as
:meth:`NetworkView.equal_cost_paths`, which the tests check -- straight into
link indices. A ToR pair's paths as node tuples are built only when one is
asked for (:class:`NodePaths`): at k = 32 the 8 030 pairs of one decision
hold 2 million paths, and building them as tuples took 10 of the cold
decision's 12 s; compiled, the 8 030 pairs take 0.5 s (measured 2026-11-29).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

from controller.network_view import NetworkView

PATH_LIMIT = 10000     # at most this many paths per ToR pair, the first in depth-first port order
PATH_ROW = np.int32     # a candidate path's link indices (see _enumerate); any fabric has fewer than 2^31 links


class NodePaths(Sequence):
    """A ToR pair's candidate paths as node tuples, built from the link
    indices one at a time, when asked for, and kept."""

    def __init__(self, idx: np.ndarray, links: list[tuple[str, str]], src: str):
        self._idx = idx
        self._links = links
        self._src = src
        self._built: dict[int, tuple[str, ...]] = {}

    def __len__(self) -> int:
        return self._idx.shape[0]

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        p = self._built.get(i)
        if p is None:
            row = self._idx[i]
            links = self._links
            p = (self._src,) + tuple(links[e][1] for e in row)
            self._built[i] = p
        return p

    def __eq__(self, other) -> bool:
        return list(self) == list(other) if isinstance(other, (Sequence, list)) else NotImplemented

    def __repr__(self) -> str:
        return f"NodePaths({list(self)!r})"


@njit(cache=True)
def _distances(dst, in_start, in_tail):
    """Hop counts to ``dst`` over the up links (-1: does not reach it)."""
    n = in_start.shape[0] - 1
    dist = np.full(n, -1, dtype=np.int64)
    queue = np.empty(n, dtype=np.int64)
    dist[dst] = 0
    queue[0] = dst
    head = 0
    tail = 1
    while head < tail:
        v = queue[head]
        head += 1
        for k in range(in_start[v], in_start[v + 1]):
            u = in_tail[k]
            if dist[u] < 0:
                dist[u] = dist[v] + 1
                queue[tail] = u
                tail += 1
    return dist


@njit(cache=True)
def _downhill(dist, out_start, out_link, out_head):
    """The out-links (start, link, head; in their order) that go one hop
    nearer the node ``dist`` measures to: every shortest path's links. Built
    once per destination, so that a pair's walk follows only these."""
    n = out_start.shape[0] - 1
    start = np.zeros(n + 1, dtype=np.int64)
    link = np.empty(out_link.shape[0], dtype=np.int64)
    head = np.empty(out_link.shape[0], dtype=np.int64)
    m = 0
    for u in range(n):
        if dist[u] > 0:
            for k in range(out_start[u], out_start[u + 1]):
                v = out_head[k]
                if dist[v] == dist[u] - 1:
                    link[m] = out_link[k]
                    head[m] = v
                    m += 1
        start[u + 1] = m
    return start, link[:m].copy(), head[:m].copy()


@njit(cache=True)
def _enumerate(src, hops, out_start, out_link, out_head, limit):
    """The paths of ``hops`` links from ``src`` over the downhill links
    given (:func:`_downhill`) as rows of link indices, depth first with each
    node's links in their order; at most ``limit``."""
    if hops <= 0:
        return np.zeros((0, max(hops, 0)), dtype=np.int32)
    # link indices as int32 (PATH_ROW): at k = 32 the ~2 M candidate paths' rows are what every FPTAS phase
    # reads, so their width is memory traffic (uneven links, warm medians: int64 0.78-0.84 s, int32 0.71-0.72 s)
    rows = np.empty((min(limit, 64), hops), dtype=np.int32)     # doubled when full (not limit rows each time)
    cur = np.empty(hops, dtype=np.int64)
    at = np.empty(hops + 1, dtype=np.int64)       # the node at each depth
    nxt = np.empty(hops, dtype=np.int64)          # the next out-link to try at each depth
    n = 0
    depth = 0
    at[0] = src
    nxt[0] = out_start[src]
    while depth >= 0:
        if depth == hops:
            if n == rows.shape[0]:
                grown = np.empty((min(limit, 2 * n), hops), dtype=np.int32)
                grown[:n] = rows
                rows = grown
            rows[n, :] = cur
            n += 1
            if n >= limit:
                break
            depth -= 1
            continue
        k = nxt[depth]
        if k < out_start[at[depth] + 1]:        # the next downhill link at this depth
            v = out_head[k]
            cur[depth] = out_link[k]
            nxt[depth] = k + 1
            at[depth + 1] = v
            if depth + 1 < hops:
                nxt[depth + 1] = out_start[v]
            depth += 1
        else:                                    # none left: back up
            depth -= 1
    return rows[:n].copy()


@njit(cache=True)
def _keep_rows(rows, usable):
    """The rows (paths) whose every link is marked in ``usable``."""
    keep = np.ones(rows.shape[0], dtype=np.bool_)
    for q in range(rows.shape[0]):
        for h in range(rows.shape[1]):
            if not usable[rows[q, h]]:
                keep[q] = False
                break
    return rows[keep]


class PathDictionary:
    def __init__(self, view: NetworkView):
        self.view = view
        self.switches = frozenset(view.switches)
        links = sorted((u, v) for u, v in view.graph.edges
                       if not view.is_host(u) and not view.is_host(v))
        self.links: list[tuple[str, str]] = links
        self.index = {lk: i for i, lk in enumerate(links)}
        self.capacity = np.array([view.capacity(u, v) for u, v in links], dtype=float)
        self.nodes = sorted({n for lk in links for n in lk})
        self.node_id = {n: i for i, n in enumerate(self.nodes)}
        self._tail = np.array([self.node_id[u] for u, _ in links], dtype=np.int64)
        self._head = np.array([self.node_id[v] for _, v in links], dtype=np.int64)
        self._port = np.array([view.port(u, v) for u, v in links], dtype=np.int64)
        self._version = view.version
        self._paths: dict[tuple[str, str], tuple[NodePaths, np.ndarray]] = {}
        self._alive: np.ndarray | None = None
        self._csr: tuple[np.ndarray, ...] | None = None
        self._dist: dict[int, tuple[np.ndarray, ...]] = {}   # per destination: distances (, downhill links)
        self.walked = 0          # pairs whose paths were walked afresh
        self.filtered = 0        # pairs that kept theirs, less those over links gone down

    def _refresh(self) -> None:
        """After link state changes: a pair whose hop count is unchanged
        and none of whose new shortest paths crosses a link that came up
        keeps its paths less those over a link now down -- exactly what a
        new walk would give, in the same order (every new shortest path
        then crosses only links that were up before, so it was a shortest
        path then, and the depth-first walk meets the survivors in the
        order it met them before); the others are walked afresh when asked
        for. (A failure or a repair is when a decision is wanted soonest:
        at k = 32 the walk of 8 030 pairs takes 0.5 s; a link back touches
        the pairs whose paths can cross it, a few hundred.)"""
        if self.view.version == self._version:
            return
        old_alive, old_dist, old_paths = self._alive, self._dist, self._paths
        self._paths, self._dist = {}, {}
        self._alive = self._csr = None
        self._version = self.view.version
        if old_alive is None or not old_paths:
            return
        alive = self.link_ends()[2]
        gone = old_alive & ~alive
        usable = ~gone if gone.any() else None         # links only came back: nothing to filter out
        came_up = [(int(self._tail[e]), int(self._head[e])) for e in np.flatnonzero(alive & ~old_alive)]
        for (src, dst), hit in old_paths.items():
            idx = hit[1]
            old = old_dist.get(self.node_id.get(dst, -1))
            if src == dst:
                self._paths[src, dst] = hit
            elif old is not None and len(idx) < PATH_LIMIT:
                s = self.node_id[src]
                dist = self._hops_to(self.node_id[dst])
                if dist[s] == old[0][s] and not any(self._crosses(s, dist, u, v) for u, v in came_up):
                    idx = _keep_rows(idx, usable) if usable is not None and len(idx) else idx
                    if not len(idx):
                        idx = np.zeros((0, 0), dtype=PATH_ROW)
                    self._paths[src, dst] = (NodePaths(idx, self.links, src), idx)
                    self.filtered += 1

    def _crosses(self, s: int, dist: np.ndarray, u: int, v: int) -> bool:
        """Whether a shortest path from node s (hop counts ``dist`` to its
        destination, -1: none) crosses the link u -> v: the link leads one
        hop nearer the destination and s reaches u in dist[s] - dist[u]
        hops. Never false when it does; true for an unreachable node only
        where a link is up one way and down the other (the view sets both),
        which costs a walk, not an error."""
        return dist[u] == dist[v] + 1 and self._hops_to(u)[s] + dist[u] == dist[s]

    def _hops_to(self, d: int) -> np.ndarray:
        """Hop counts to node d over the up links, kept."""
        got = self._dist.get(d)
        if got is None:
            got = self._dist[d] = (_distances(d, *self._adjacency()[3:]),)
        return got[0]

    def _toward(self, d: int) -> tuple[np.ndarray, ...]:
        """(hop counts to node d, its downhill links: start, link, head), kept."""
        got = self._dist.get(d)
        if got is None or len(got) == 1:
            dist = self._hops_to(d)
            out_start, out_link, out_head = self._adjacency()[:3]
            got = self._dist[d] = (dist, *_downhill(dist, out_start, out_link, out_head))
        return got

    def link_ends(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per link: its tail's and head's index in :attr:`nodes`, and
        whether it is up now (kept until the view's link state changes)."""
        self._refresh()
        if self._alive is None:
            alive = np.ones(len(self.links), dtype=bool)
            alive[[self.index[lk] for lk in self.view.links_down() if lk in self.index]] = False
            self._alive = alive
        return self._tail, self._head, self._alive

    def _adjacency(self) -> tuple[np.ndarray, ...]:
        """The up links as compressed rows: out of every node in port order
        (start, link, head), and into every node (start, tail)."""
        tail, head, alive = self.link_ends()
        if self._csr is None:
            up = np.flatnonzero(alive)
            n = len(self.nodes)
            out = up[np.lexsort((self._port[up], tail[up]))]
            out_start = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(np.bincount(tail[out], minlength=n), out=out_start[1:])
            into = up[np.argsort(head[up], kind="stable")]
            in_start = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(np.bincount(head[into], minlength=n), out=in_start[1:])
            self._csr = (out_start, out, head[out], in_start, tail[into])
        return self._csr

    def paths(self, src_tor: str, dst_tor: str) -> tuple[NodePaths, np.ndarray]:
        """(node paths, link-index array of shape (n_paths, hops)); empty
        (shape (0, 0)) when the ToRs are disconnected. Same ToR: one empty
        path."""
        self._refresh()
        key = (src_tor, dst_tor)
        hit = self._paths.get(key)
        if hit is None:
            if src_tor == dst_tor:
                idx = np.zeros((1, 0), dtype=PATH_ROW)
            elif src_tor not in self.node_id or dst_tor not in self.node_id:     # a switch with no link
                idx = np.zeros((0, 0), dtype=PATH_ROW)
            else:
                dist, d_start, d_link, d_head = self._toward(self.node_id[dst_tor])
                s = self.node_id[src_tor]
                idx = _enumerate(s, dist[s], d_start, d_link, d_head, PATH_LIMIT)
                self.walked += 1
                # a path over a zero-capacity link carries nothing: it is no candidate
                idx = _keep_rows(idx, self.capacity > 0)
                if not len(idx):
                    idx = np.zeros((0, 0), dtype=PATH_ROW)
            hit = (NodePaths(idx, self.links, src_tor), idx)
            self._paths[key] = hit
        return hit

    def up(self, link_index: int) -> bool:
        u, v = self.links[link_index]
        return self.view.link_up(u, v)
