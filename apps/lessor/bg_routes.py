"""Every VM's BG on one path from its first packet: default BG routes (pure).

Why. The preinstalled routes hash every flow over the equal-cost paths
(:mod:`apps.routing.logic`), BG too, until LESSOR has measured a flow and
placed it. Two 4 Mb/s guarantees hashed onto one 5 Mb/s uplink lose BG
(strict priority gives BG all it sends, and more than the link is lost) for
as long as that takes: one run of the main job whose first allocation came
14 s in held analytics to 0.21 of its guarantee, and a new connection's BG
lands anywhere until the next allocation (docs/results.md).

What. Each VM with a guarantee gets an *up-path*: the switches from its ToR
up to the top of the fabric, one uplink chosen at each layer. Its BG (DSCP
CS0) climbs that path until the destination is below the switch it is at,
then goes down the destination's way (unique in a fat tree: the core chosen
fixes the aggregation switch of the destination's pod). The routing installs
this as ``(ipv4_src = VM, ip_dscp = BG)`` entries on the path's switches,
below LESSOR's exact entries and above the destination routes, with the
destinations below each such switch kept above them
(:class:`apps.routing.logic.DestinationRouting`). WC is untouched: it is
what spreads over every path and fills what BG leaves.

The bound. A tenant's guarantees are for the traffic among its VMs (the
hose model of a virtual cluster, as Oktopus allocates it). Whatever its
traffic matrix, the BG a tenant puts on a link is at most

    min(sum of g over its VMs whose BG routes cross the link as senders,
        sum of g over its VMs those routes reach through it)

and a link's bound is the sum over tenants. The packing keeps every
switch-to-switch link's bound within mu x C where it can: largest guarantee
first, each VM on the up-path whose most loaded link (bound / mu C) would be
least loaded, then the least it adds (relative to mu C) over the links it
changes, then path order
(the longest-processing-time rule of bin packing). After a change (a link,
a reload), VMs keep their up-paths while those still work and the packing
stays within mu x C; otherwise the whole packing is redone and the better
of the two kept.

What it does not cover. BG a VM sends to another tenant's VM follows its
up-path too, but is not in its tenant's bound (admission control, which
counts every VM's hose against every other's, is the check for that).
Destinations reached through a switch with several ways down (not a fat
tree's) are counted on all of them. The work is (VMs x up-paths x the
tenant's VMs x hops): about 10 ms for the main job, and it runs only on a
configuration or link change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from apps.lessor.pmpt import check_mu
from controller.network_view import NetworkView
from bwcommon.validate import finite_number

Link = tuple[str, str]
TOLERANCE = 1e-9


@dataclass(frozen=True)
class HoseVm:
    """A VM whose BG is routed: its address, server, tenant and hose guarantee (bits/s)."""
    address: str
    host: str
    tenant: str
    guarantee_bps: float

    def __post_init__(self):
        for name in ("address", "host", "tenant"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"BG route of {self.address!r}: {name} {getattr(self, name)!r} must be a "
                                 f"non-empty string")
        if not (finite_number(self.guarantee_bps) and self.guarantee_bps > 0):
            raise ValueError(f"BG route of {self.address}: guarantee {self.guarantee_bps!r} must be a finite "
                             f"number > 0 (bits/s)")


@dataclass
class BgRoutes:
    """The packing: each routed VM's up-path (address -> switches from its
    ToR up), every link's BG bound (bits/s), and the links whose bound is
    above mu x C (the packing could not keep them within it)."""
    up: dict[str, tuple[str, ...]] = field(default_factory=dict)
    host: dict[str, str] = field(default_factory=dict)
    load: dict[Link, float] = field(default_factory=dict)
    over: list[Link] = field(default_factory=list)

    def tor_path(self, view: NetworkView, src_ip: str, dst_ip: str) -> tuple[str, ...] | None:
        """The switches BG from ``src_ip`` to ``dst_ip`` crosses (its ToR to
        the destination's), or None when it is not routed here (no up-path,
        an unknown destination, several ways down: the switches hash it)."""
        up = self.up.get(src_ip)
        dst = view.host_by_ip(dst_ip)
        if up is None or dst is None or src_ip not in self.host:
            return None
        walked = _walk(view, up, self.host[src_ip], dst)
        return None if walked is None else walked[1]

    def state(self) -> dict:
        return {"up": {a: list(p) for a, p in sorted(self.up.items())},
                "load_mbps": {f"{u}->{v}": round(b / 1e6, 6) for (u, v), b in sorted(self.load.items())},
                "over": [f"{u}->{v}" for u, v in self.over]}


def up_paths(view: NetworkView, tor: str) -> list[tuple[str, ...]]:
    """The up-paths from ``tor``: at each switch, each working uplink that
    is a shortest next hop to every host not below that switch (so BG may
    take it whatever its destination), until no host is left above or no
    such uplink exists. Sorted by the ports taken."""
    out: list[tuple[str, ...]] = []

    def grow(path: list[str]) -> None:
        node = path[-1]
        above = [h for h in view.hosts if not view.is_below(node, h) and view.next_hops(node, h)]
        ups = [] if not above else [u for u in view.next_hops(node, above[0])
                                    if not view.is_host(u) and _layer(view, u) > _layer(view, node)
                                    and view.capacity(node, u) > 0
                                    and all(u in view.next_hops(node, h) for h in above)]
        if not ups:
            out.append(tuple(path))
            return
        for u in ups:
            grow([*path, u])

    grow([tor])
    return out


def _layer(view: NetworkView, switch: str) -> int:
    return view.graph.nodes[switch]["layer"]


def _walk(view: NetworkView, up: tuple[str, ...], src_host: str,
          dst_host: str) -> tuple[set[Link], tuple[str, ...] | None] | None:
    """(the switch-to-switch links BG from src_host to dst_host may cross,
    its switch path if it has one way only), or None when the up-path never
    reaches a switch the destination is below (then it is not this
    routing's). Same server: no fabric link."""
    if src_host == dst_host:
        return set(), None
    i = 0
    while not view.is_below(up[i], dst_host):
        i += 1
        if i == len(up):
            return None
    links = set(view.path_links(up[:i + 1]))
    path: list[str] | None = list(up[:i + 1])
    frontier = [up[i]]
    while frontier:
        nxt = []
        for node in frontier:
            hops = [h for h in view.next_hops(node, dst_host) if h != dst_host]
            links.update((node, h) for h in hops)
            nxt.extend(hops)
        nxt = sorted(set(nxt))
        if path is not None:
            path = path + nxt if len(nxt) == 1 else (path if not nxt else None)
        frontier = nxt
    return links, (tuple(path) if path is not None else None)


class _Counts:
    """Per link and tenant: which senders and receivers the placed routes
    make it carry, and how many routes each (a multiset), so that a bound is
    min(sum of the senders' g, sum of the receivers' g)."""

    def __init__(self, g: Mapping[str, float]):
        self.g = g
        self.src: dict[Link, dict[str, dict[str, int]]] = {}
        self.dst: dict[Link, dict[str, dict[str, int]]] = {}

    def term(self, link: Link, tenant: str, extra_src: str | None = None, extra_dst: Iterable[str] = ()) -> float:
        srcs = self.src.get(link, {}).get(tenant, {})
        dsts = self.dst.get(link, {}).get(tenant, {})
        s = sum(self.g[a] for a in srcs) + (self.g[extra_src] if extra_src and extra_src not in srcs else 0.0)
        d = sum(self.g[a] for a in dsts) + sum(self.g[a] for a in set(extra_dst) if a not in dsts)
        return min(s, d)

    def add(self, link: Link, tenant: str, src: str, dst: str) -> None:
        for table, who in ((self.src, src), (self.dst, dst)):
            counts = table.setdefault(link, {}).setdefault(tenant, {})
            counts[who] = counts.get(who, 0) + 1

    def tenants(self, link: Link) -> set[str]:
        return set(self.src.get(link, {}))

    def load(self, link: Link) -> float:
        return sum(self.term(link, t) for t in self.tenants(link))


def pack(view: NetworkView, vms: Iterable[HoseVm], mu: float,
         previous: Mapping[str, tuple[str, ...]] | None = None) -> BgRoutes:
    """Each VM's up-path (see the module's text). ``previous``: the up-paths
    in force, kept where they still work if that keeps every link within
    mu x C (or does no worse than packing afresh)."""
    check_mu(mu)
    vms = list(vms)
    seen: set[str] = set()
    for vm in vms:
        if not isinstance(vm, HoseVm):
            raise TypeError(f"BG routes: {vm!r} is not a HoseVm")
        if vm.address in seen:
            raise ValueError(f"BG routes: address {vm.address} declared twice")
        seen.add(vm.address)
        if vm.host not in view.graph or not view.is_host(vm.host):
            raise ValueError(f"BG routes: {vm.address}'s host {vm.host!r} is not a host of the fabric")
    kept = _pack(view, vms, mu, previous or {})
    if not previous or not kept.over:
        return kept
    fresh = _pack(view, vms, mu, {})
    return kept if _worst(view, kept, mu) <= _worst(view, fresh, mu) + TOLERANCE else fresh


def _worst(view: NetworkView, routes: BgRoutes, mu: float) -> float:
    return max((b / (mu * view.capacity(*lk)) if view.capacity(*lk) > 0 else float("inf")
                for lk, b in routes.load.items() if b > 0), default=0.0)


def _pack(view: NetworkView, vms: list[HoseVm], mu: float, keep: Mapping[str, tuple[str, ...]]) -> BgRoutes:
    g = {vm.address: vm.guarantee_bps for vm in vms}
    members: dict[str, list[HoseVm]] = {}
    for vm in vms:
        members.setdefault(vm.tenant, []).append(vm)
    counts = _Counts(g)
    load: dict[Link, float] = {}
    chosen: dict[str, tuple[str, ...]] = {}
    candidates = {}
    for vm in vms:
        tor = view.host_switch(vm.host)[0]
        if tor not in candidates:
            candidates[tor] = [p for p in up_paths(view, tor)
                               if all(view.link_up(u, v) for u, v in view.path_links(p))]

    def routes_of(vm: HoseVm, up: tuple[str, ...]) -> dict[Link, list[str]] | None:
        """link -> the tenant's receivers ``vm``'s BG reaches through it on ``up``."""
        out: dict[Link, list[str]] = {}
        for peer in members[vm.tenant]:
            if peer.address == vm.address:
                continue
            walked = _walk(view, up, vm.host, peer.host)
            if walked is None:
                return None
            for link in walked[0]:
                out.setdefault(link, []).append(peer.address)
        return out

    def place(vm: HoseVm, up: tuple[str, ...], reach: dict[Link, list[str]]) -> None:
        chosen[vm.address] = up
        for link, dsts in reach.items():
            old = counts.term(link, vm.tenant)
            for d in dsts:
                counts.add(link, vm.tenant, vm.address, d)
            load[link] = load.get(link, 0.0) + counts.term(link, vm.tenant) - old

    order = sorted(vms, key=lambda vm: (-vm.guarantee_bps, vm.tenant, vm.address))
    # the up-paths in force first, where they still work
    for vm in order:
        up = keep.get(vm.address)
        tor = view.host_switch(vm.host)[0]
        if up is not None and tuple(up) in candidates[tor]:
            reach = routes_of(vm, tuple(up))
            if reach is not None:
                place(vm, tuple(up), reach)
    for vm in order:
        if vm.address in chosen:
            continue
        best = None
        for n, up in enumerate(candidates[view.host_switch(vm.host)[0]]):
            reach = routes_of(vm, up)
            if reach is None:
                continue
            worst = total = 0.0
            for link, dsts in reach.items():
                added = counts.term(link, vm.tenant, vm.address, dsts) - counts.term(link, vm.tenant)
                cap = mu * view.capacity(*link)
                util = (load.get(link, 0.0) + added) / cap if cap > 0 else float("inf")
                worst, total = max(worst, util), total + (added / cap if cap > 0 else float("inf"))
            key = (worst, total, n)
            if best is None or key < best[0]:
                best = (key, up, reach)
        if best is not None:
            place(vm, best[1], best[2])
    final = {link: counts.load(link) for link in counts.src}
    over = sorted(link for link, b in final.items() if b > mu * view.capacity(*link) * (1 + TOLERANCE))
    return BgRoutes(chosen, {vm.address: vm.host for vm in vms if vm.address in chosen},
                    {lk: b for lk, b in final.items() if b > 0}, over)
