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
                hit = ([(src_tor,)], np.zeros((1, 0), dtype=np.int64))
            else:
                hit = self._arrays(self.view.equal_cost_paths(src_tor, dst_tor))
            self._paths[key] = hit
        return hit

    def prefetch(self, keys) -> None:
        """Compute the paths of the ToR pairs ``keys`` not known yet, the
        pairs of one destination together (their shared tails built once:
        :meth:`NetworkView.equal_cost_paths_from`)."""
        self._refresh()
        by_dst: dict[str, list[str]] = {}
        for src, dst in keys:
            if src != dst and (src, dst) not in self._paths:
                by_dst.setdefault(dst, []).append(src)
        for dst, srcs in by_dst.items():
            for src, node_paths in self.view.equal_cost_paths_from(srcs, dst).items():
                self._paths[(src, dst)] = self._arrays(node_paths)

    def _arrays(self, node_paths: list[tuple[str, ...]]) -> tuple[list[tuple[str, ...]], np.ndarray]:
        """(candidate node paths, their link-index array): a path over a
        zero-capacity link carries nothing, so it is no candidate."""
        rows, nodes = [], []
        for p in node_paths:
            row = [self.index[lk] for lk in zip(p, p[1:])]
            if all(self.capacity[i] > 0 for i in row):
                rows.append(row)
                nodes.append(p)
        hops = len(nodes[0]) - 1 if nodes else 0
        return nodes, np.array(rows, dtype=np.int64).reshape(len(nodes), hops)

    def up(self, link_index: int) -> bool:
        u, v = self.links[link_index]
        return self.view.link_up(u, v)
