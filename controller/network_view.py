"""The controller's view of the fabric: a networkx DiGraph built from a
topology description.

Nodes carry ``kind`` ("host"/"switch"), and for switches ``dpid``, ``role``,
``pod``, ``layer``; for hosts ``ip``, ``mac``, ``index``. Each direction of a
link is an edge ``u -> v`` with ``port`` (u's port towards v), ``capacity``
(bits/s) and ``up``. Paths never transit hosts. Everything here is
deterministic: neighbours and paths come out sorted.
"""

from __future__ import annotations

from collections import deque

import networkx as nx

from controller.topology import ROLE_LAYER, TopologyDescription


class NetworkView:
    def __init__(self, topo: TopologyDescription):
        self.topo = topo
        g = nx.DiGraph()
        for sw in topo.switches:
            g.add_node(sw.name, kind="switch", dpid=sw.dpid, role=sw.role, pod=sw.pod,
                       layer=ROLE_LAYER[sw.role])
        for i, h in enumerate(topo.hosts):
            g.add_node(h.name, kind="host", ip=h.ip, mac=h.mac, index=i)
        for lk in topo.links:
            cap = lk.capacity_mbps * 1e6
            g.add_edge(lk.a, lk.b, port=lk.a_port, capacity=cap, up=True)
            g.add_edge(lk.b, lk.a, port=lk.b_port, capacity=cap, up=True)
        self.graph = g
        self.hosts = [h.name for h in topo.hosts]
        self.switches = sorted(sw.name for sw in topo.switches)
        self._by_dpid = {sw.dpid: sw.name for sw in topo.switches}
        self._by_ip: dict[str, str | None] = {h.ip: h.name for h in topo.hosts}
        self._prefixed = any(h.vm_prefix for h in topo.hosts)
        self._port_peer = {(u, d["port"]): v for u, v, d in g.edges(data=True)}
        self._dist_cache: dict[str, tuple[dict[str, int], dict[str, list[str]]]] = {}
        self._host_set = frozenset(self.hosts)
        self._adj: tuple[dict[str, list[str]], dict[str, list[str]]] | None = None
        self.version = 0  # bumped on every link state change
        self._down: set[tuple[str, str]] = set()     # the directed links down now

    # ---- look-ups ------------------------------------------------------
    def switch_by_dpid(self, dpid: int) -> str | None:
        return self._by_dpid.get(dpid)

    def dpid(self, switch: str) -> int:
        return self.graph.nodes[switch]["dpid"]

    def host_by_ip(self, ip: str) -> str | None:
        """The host an address lives at: its own address, or one of its
        VMs' (in its vm_prefix)."""
        host = self._by_ip.get(ip)
        if host is None and self._prefixed:
            host = self._by_ip[ip] = self.topo.host_of_address(ip)     # cached, misses too
            if len(self._by_ip) > 100_000:                              # flow keys are input: bounded
                self._by_ip = {h.ip: h.name for h in self.topo.hosts}
        return host

    def vm_prefix(self, host: str) -> str | None:
        """The host's VM block (CIDR), if it carries VMs behind its NIC."""
        return self.topo.host(host).vm_prefix

    def ip(self, host: str) -> str:
        return self.graph.nodes[host]["ip"]

    def host_index(self, host: str) -> int:
        return self.graph.nodes[host]["index"]

    def is_host(self, node: str) -> bool:
        return self.graph.nodes[node]["kind"] == "host"

    def port(self, u: str, v: str) -> int:
        """u's port towards v."""
        return self.graph.edges[u, v]["port"]

    def peer(self, node: str, port: int) -> str | None:
        return self._port_peer.get((node, port))

    def capacity(self, u: str, v: str) -> float:
        return self.graph.edges[u, v]["capacity"]

    def host_switch(self, host: str) -> tuple[str, int]:
        """(edge switch, its port) of a single-homed host's first link."""
        switches = sorted(self.graph.successors(host), key=lambda v: self.port(host, v))
        if not switches:
            raise KeyError(f"host {host} has no link")
        return switches[0], self.port(switches[0], host)

    def link_up(self, u: str, v: str) -> bool:
        return self.graph.edges[u, v]["up"]

    def links_down(self) -> frozenset[tuple[str, str]]:
        """Every directed link down now (both directions of a failed link)."""
        return frozenset(self._down)

    # ---- state changes ---------------------------------------------------
    def set_link_state(self, u: str, v: str, up: bool) -> bool:
        """Mark both directions of u--v; returns True if anything changed."""
        changed = False
        for a, b in ((u, v), (v, u)):
            if self.graph.edges[a, b]["up"] != up:
                self.graph.edges[a, b]["up"] = up
                (self._down.discard if up else self._down.add)((a, b))
                changed = True
        if changed:
            self._dist_cache.clear()
            self._adj = None
            self.version += 1
        return changed

    def set_port_state(self, switch: str, port: int, up: bool) -> tuple[str, str] | None:
        peer = self.peer(switch, port)
        if peer is None:
            return None
        return (switch, peer) if self.set_link_state(switch, peer, up) else None

    # ---- distances and equal-cost routing --------------------------------
    # Plain adjacency lists over up links, rebuilt when the link state
    # changes: a BFS through networkx's edge views cost ~17 ms per
    # destination on a k = 32 fat-tree, and PMPT asks for the paths of
    # thousands of ToR pairs in one decision.
    def _adjacency(self) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        """(up predecessors of every node, up successors sorted by port)."""
        if self._adj is None:
            g = self.graph
            preds: dict[str, list[str]] = {n: [] for n in g}
            succs: dict[str, list[str]] = {}
            for u in g:
                out = [(d["port"], v) for v, d in g.adj[u].items() if d["up"]]
                out.sort()
                succs[u] = [v for _, v in out]
                for _, v in out:
                    preds[v].append(u)
            self._adj = (preds, succs)
        return self._adj

    def distances_to(self, dst: str) -> dict[str, int]:
        """Hop counts to ``dst`` over up links of every switch that reaches
        it (and of ``dst``), never through a host; a host's own distance is
        one more than its nearest switch's (:meth:`next_hops`)."""
        cached = self._dist_cache.get(dst)
        if cached is not None:
            return cached[0]
        preds, _ = self._adjacency()
        hosts = self._host_set
        dist = {dst: 0}
        queue = deque([dst])
        while queue:
            node = queue.popleft()
            d = dist[node] + 1
            for pred in preds[node]:
                if pred not in dist and pred not in hosts:
                    dist[pred] = d
                    queue.append(pred)
        self._dist_cache[dst] = (dist, {})
        return dist

    def next_hops(self, node: str, dst: str) -> list[str]:
        """Neighbours of ``node`` on a shortest path to ``dst``, sorted by
        port (a list the caller must not change: it is kept for the next
        caller until the link state changes)."""
        dist = self.distances_to(dst)
        memo = self._dist_cache[dst][1]
        hops = memo.get(node)
        if hops is None:
            succ = self._adjacency()[1].get(node, [])
            d = dist.get(node)
            if d is None and node in self._host_set:      # a host: one hop above its nearest switch
                reach = [dist[v] for v in succ if v in dist]
                d = 1 + min(reach) if reach else None
            hops = [] if d is None or node == dst else [v for v in succ if dist.get(v) == d - 1]
            memo[node] = hops
        return hops

    def is_below(self, switch: str, host: str) -> bool:
        """Whether ``host`` is below ``switch``: every shortest next hop
        from it towards the host goes down a layer (or is the host). A
        switch's traffic to a host not below it goes up."""
        hops = self.next_hops(switch, host)
        layer = self.graph.nodes[switch]["layer"]
        return bool(hops) and all(h == host or self.graph.nodes[h]["layer"] < layer for h in hops)

    def equal_cost_paths(self, src: str, dst: str, limit: int = 10000) -> list[tuple[str, ...]]:
        """All shortest paths src -> dst as node tuples, in depth-first
        order by port; at most ``limit`` (the first ones in that order)."""
        memo: dict[str, list[tuple[str, ...]]] = {dst: [(dst,)]}

        def suffixes(node: str) -> list[tuple[str, ...]]:
            # the paths from node to dst; each node's list once (in a fat-tree the down halves are shared)
            out = memo.get(node)
            if out is None:
                out = []
                for nxt in self.next_hops(node, dst):
                    out.extend((node,) + rest for rest in suffixes(nxt)[:limit - len(out)])
                    if len(out) >= limit:
                        break
                memo[node] = out
            return out

        return list(suffixes(src))

    @staticmethod
    def path_links(path: tuple[str, ...] | list[str]) -> list[tuple[str, str]]:
        return list(zip(path[:-1], path[1:]))

    def uplink_fanout_by_layer(self) -> dict[int, int]:
        """Largest number of links a switch of each layer has towards higher
        layers: the radix used to spread single paths over the fabric."""
        out: dict[int, int] = {}
        g = self.graph
        for sw in self.switches:
            layer = g.nodes[sw]["layer"]
            ups = sum(1 for v in g.successors(sw)
                      if g.nodes[v]["kind"] == "switch" and g.nodes[v]["layer"] > layer)
            out[layer] = max(out.get(layer, 0), ups)
        return out

