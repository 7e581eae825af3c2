"""Admission control for hose guarantees (pure).

Every VM x has a hose guarantee B_x: it may send up to B_x and receive up
to B_x, to and from any VMs. A cut splits the hosts into S and the rest;
whatever the traffic matrix, the guaranteed traffic crossing it in one
direction is at most

    min(sum of B over S, sum of B over the rest)

(S cannot send more than its senders' sum, the rest cannot take more than
its receivers' sum; and a matrix reaching the smaller sum exists). The same
holds in the other direction, and links are full duplex, so one check per
cut covers both. A configuration is admitted when on every cut this stays
within ``mu`` times the cut's capacity (per direction).

The cuts (capacity = the sum of the cut links' capacities, one direction):

- ``host``: each host's NIC link (S = the host). Here the sum of the
  host's own guarantees counts, not the smaller side: the agent shapes and
  the ToR meter polices each VM at its B whatever its peers are, so B must
  fit the NIC it is enforced on;
- ``tor``: each edge switch's uplinks together (S = the hosts below it);
- ``pod``: each pod's uplinks together (S = the hosts of the pod's edge
  switches; links from a pod switch to a switch outside the pod);
- ``bridge``: every switch-to-switch link whose loss would split the
  fabric (S = the hosts on one side) -- in a tree every link is one, so
  arbitrary tree-shaped fabrics are checked link by link.

These are the cuts traffic must cross on the fabrics bwfabric routes
(fat-trees, VL2, leaf-spine, trees). Links inside a multipath layer are not
cuts on their own: LESSOR and ECMP spread a ToR's or a pod's traffic over
all of its uplinks, so it is their sum that bounds it. On layers whose
uplinks have unequal capacities, a cut mixing several switches' uplinks can
be smaller than any of the above; ``tests/unit/test_admission.py`` measures
where this check and an exhaustive all-cuts check agree.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from controller.topology import TopologyDescription
from bwcommon.validate import finite_number

TOLERANCE = 1e-9          # relative: guarantees summing to exactly mu x C are admitted


@dataclass(frozen=True)
class Cut:
    kind: str                 # host, tor, pod, bridge
    name: str                 # what the operator calls it
    hosts: frozenset[str]     # one side
    links: tuple[tuple[str, str], ...]
    capacity_mbps: float      # per direction

    def describe(self) -> str:
        return f"{self.name} ({len(self.links)} link{'s' * (len(self.links) != 1)}, " \
               f"{self.capacity_mbps:g} Mb/s per direction)"


@dataclass(frozen=True)
class Verdict:
    cut: Cut
    inside_mbps: float        # sum of B on the cut's host side
    outside_mbps: float       # sum of B on the other side
    limit_mbps: float         # mu x capacity

    @property
    def crossing_mbps(self) -> float:
        # A host's NIC carries every guarantee of the VMs on it: each VM is
        # shaped (agent) and policed (ToR meter) at its own B whatever its
        # peers, so a VM's B must fit its NIC even if its peers are small.
        if self.cut.kind == "host":
            return self.inside_mbps
        return min(self.inside_mbps, self.outside_mbps)

    @property
    def ok(self) -> bool:
        return self.crossing_mbps <= self.limit_mbps * (1 + TOLERANCE)

    def message(self, mu: float) -> str:
        if self.cut.kind == "host":
            return (f"{self.cut.describe()}: the guarantees of its VMs {self.inside_mbps:g} Mb/s "
                    f"exceed mu {mu:g} x {self.cut.capacity_mbps:g} = {self.limit_mbps:g} Mb/s")
        return (f"{self.cut.describe()}: guarantees that can cross it {self.crossing_mbps:g} Mb/s "
                f"(the smaller of {self.inside_mbps:g} on its host side and {self.outside_mbps:g} beyond) "
                f"exceed mu {mu:g} x {self.cut.capacity_mbps:g} = {self.limit_mbps:g} Mb/s")


def _graph(topo: TopologyDescription) -> nx.Graph:
    g = nx.Graph()
    for lk in topo.links:
        if g.has_edge(lk.a, lk.b):
            g[lk.a][lk.b]["capacity"] += lk.capacity_mbps
        else:
            g.add_edge(lk.a, lk.b, capacity=lk.capacity_mbps)
    return g


def cuts(topo: TopologyDescription) -> list[Cut]:
    """The cuts of :mod:`this module's docstring <controller.admission>`,
    in a stable order (hosts, ToRs, pods, bridges)."""
    g = _graph(topo)
    hosts = {h.name for h in topo.hosts}
    switches = {s.name: s for s in topo.switches}
    out: list[Cut] = []

    def group_cut(kind: str, name: str, members: set[str]) -> None:
        below = frozenset(n for m in members for n in g.neighbors(m) if n in hosts)
        links = tuple(sorted((m, n) for m in members for n in g.neighbors(m)
                             if n not in hosts and n not in members))
        if below and links and below != frozenset(hosts):
            out.append(Cut(kind, name, below, links, sum(g[u][v]["capacity"] for u, v in links)))

    for h in sorted(hosts):
        links = tuple(sorted((h, n) for n in g.neighbors(h)))
        out.append(Cut("host", f"host {h} NIC", frozenset({h}), links, sum(g[u][v]["capacity"] for u, v in links)))
    for name, sw in sorted(switches.items()):
        if sw.role == "edge":
            group_cut("tor", f"ToR {name} uplinks", {name})
    pods: dict[int, set[str]] = {}
    for name, sw in switches.items():
        if sw.pod is not None:
            pods.setdefault(sw.pod, set()).add(name)
    for pod, members in sorted(pods.items()):
        if len(members) > 1:
            group_cut("pod", f"pod {pod} uplinks", members)
    fabric = g.subgraph(switches).copy()
    for u, v in sorted(tuple(sorted(e)) for e in nx.bridges(fabric)):
        rest = fabric.copy()
        rest.remove_edge(u, v)
        side = nx.node_connected_component(rest, u)
        below = frozenset(n for m in side for n in g.neighbors(m) if n in hosts)
        if below and below != frozenset(hosts) and not any(
                c.links == ((u, v),) or c.links == ((v, u),) for c in out):
            out.append(Cut("bridge", f"link {u}--{v}", below, ((u, v),), g[u][v]["capacity"]))
    return out


def evaluate(topo: TopologyDescription, guarantees: dict[str, float], mu: float) -> list[Verdict]:
    """Each cut's verdict for ``guarantees`` (host -> hose guarantee, Mb/s;
    each a finite number >= 0, else ValueError naming the host)."""
    bad = [f"{h}: {b!r}" for h, b in sorted(guarantees.items(), key=lambda kv: str(kv[0]))
           if not (finite_number(b) and b >= 0)]
    if bad:
        raise ValueError(f"admission: guarantees must be finite numbers >= 0 Mb/s: {', '.join(bad)}")
    total = sum(guarantees.values())
    verdicts = []
    for cut in cuts(topo):
        inside = sum(b for h, b in guarantees.items() if h in cut.hosts)
        verdicts.append(Verdict(cut, inside, total - inside, mu * cut.capacity_mbps))
    return verdicts


def rejections(topo: TopologyDescription, guarantees: dict[str, float], mu: float) -> list[str]:
    """Every cut the guarantees over-subscribe, by name and numbers ([] = admitted)."""
    if not (finite_number(mu) and 0 < mu <= 1):
        raise ValueError(f"mu {mu!r} must be in (0, 1]")
    return [v.message(mu) for v in evaluate(topo, guarantees, mu) if not v.ok]


def check(loaded) -> list[str]:
    """Admission control of a loaded configuration (:class:`controller.config.Loaded`)."""
    return rejections(loaded.topology, loaded.guarantees(), loaded.cfg.admission.mu)


def headroom(topo: TopologyDescription, guarantees: dict[str, float], mu: float) -> list[dict]:
    """Per cut: capacity, limit and what can cross it now (for the API and metrics)."""
    return [{"kind": v.cut.kind, "cut": v.cut.name, "capacity_mbps": v.cut.capacity_mbps,
             "limit_mbps": v.limit_mbps, "crossing_mbps": v.crossing_mbps}
            for v in evaluate(topo, guarantees, mu)]
