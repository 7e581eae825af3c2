"""Candidate paths between ToR (edge) switches, as link-index arrays.

The fabric's switch-to-switch links are numbered once; a ToR pair's candidate
paths are its equal-cost shortest paths over links that are up, computed once
per pair and kept until the view's link state changes (PMPT groups flows per
ToR pair, so each group's paths are computed once). In a fat-tree an
inter-pod path is fixed by its core switch: the upward half (edge ->
aggregation -> core) is the only choice, the way down is determined.
"""

from __future__ import annotations

import numpy as np

from controller.network_view import NetworkView


class PathDictionary:
    def __init__(self, view: NetworkView):
        self.view = view
        links = sorted((u, v) for u, v in view.graph.edges
                       if not view.is_host(u) and not view.is_host(v))
        self.links: list[tuple[str, str]] = links
        self.index = {lk: i for i, lk in enumerate(links)}
        self.capacity = np.array([view.capacity(u, v) for u, v in links], dtype=float)
        self.nodes = sorted({n for lk in links for n in lk})
        self.node_id = {n: i for i, n in enumerate(self.nodes)}
        self._tail = np.array([self.node_id[u] for u, _ in links], dtype=np.int64)
        self._head = np.array([self.node_id[v] for _, v in links], dtype=np.int64)
        self._version = view.version
        self._paths: dict[tuple[str, str], tuple[list[tuple[str, ...]], np.ndarray]] = {}
        self._alive: np.ndarray | None = None

    def _refresh(self) -> None:
        if self.view.version != self._version:
            self._paths.clear()
            self._alive = None
            self._version = self.view.version

    def link_ends(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per link: its tail's and head's index in :attr:`nodes`, and
        whether it is up now (kept until the view's link state changes)."""
        self._refresh()
        if self._alive is None:
            self._alive = np.array([self.view.link_up(u, v) for u, v in self.links], dtype=bool)
        return self._tail, self._head, self._alive

    def paths(self, src_tor: str, dst_tor: str) -> tuple[list[tuple[str, ...]], np.ndarray]:
        """(node paths, link-index array of shape (n_paths, hops)); empty
        (shape (0, 0)) when the ToRs are disconnected. Same ToR: one empty
        path."""
        self._refresh()
        key = (src_tor, dst_tor)
        hit = self._paths.get(key)
        if hit is None:
            if src_tor == dst_tor:
                nodes = [(src_tor,)]
                idx = np.zeros((1, 0), dtype=np.int64)
            else:
                # a path over a zero-capacity link carries nothing: it is no candidate
                nodes = [p for p in self.view.equal_cost_paths(src_tor, dst_tor)
                         if all(self.capacity[self.index[lk]] > 0 for lk in self.view.path_links(p))]
                hops = len(nodes[0]) - 1 if nodes else 0
                idx = np.array([[self.index[lk] for lk in self.view.path_links(p)] for p in nodes],
                               dtype=np.int64).reshape(len(nodes), hops)
            hit = (nodes, idx)
            self._paths[key] = hit
        return hit

    def up(self, link_index: int) -> bool:
        u, v = self.links[link_index]
        return self.view.link_up(u, v)
