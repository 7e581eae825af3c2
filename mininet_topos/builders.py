"""The papers' topologies as topology descriptions (pure: no Mininet here).

Every builder returns a validated :class:`TopologyDescription`; the Mininet
`Topo` classes in :mod:`mininet_topos.topos` build a network from one, and the
controller reads the same description. Hosts are numbered in order (pods and
ToRs contiguous), which the single-path baseline uses to spread destinations.
"""

from __future__ import annotations

from typing import Callable

from controller.topology import Host, Link, Switch, TopologyDescription

JUMBO_MTU = 9000
# 150 packets of 1500 bytes, kept the same in bytes whatever the MTU
# (docs/platform.md: queues "kept the same size in bytes" with jumbo frames).
DEFAULT_QUEUE_BYTES = 150 * 1500


def host_ip(index: int) -> str:
    """All hosts share 10.0.0.0/16; index 0 -> 10.0.0.1."""
    return f"10.0.{index // 200}.{index % 200 + 1}"


def vm_block(index: int) -> str:
    """Host ``index``'s VM block (issue #32 §4): a /28 of 10.0.0.0/16 above
    every host address (hosts use 10.0.0-99.x), so on-link for every host."""
    if not 0 <= index < 156 * 16:
        raise ValueError(f"vm_block: host index {index} beyond 2496 hosts")
    return f"10.0.{100 + index // 16}.{(index % 16) * 16}/28"


def with_vm_blocks(topo: TopologyDescription) -> TopologyDescription:
    """``topo`` with every host given its VM block (:func:`vm_block`)."""
    from dataclasses import replace
    hosts = [replace(h, vm_prefix=vm_block(i)) for i, h in enumerate(topo.hosts)]
    out = TopologyDescription(topo.name, topo.switches, hosts, topo.links, mtu=topo.mtu, params=dict(topo.params))
    out.validate()
    return out


def vm_address(topo: TopologyDescription, host: str, slot: int) -> str:
    """The ``slot``-th VM address (1..15) in ``host``'s block."""
    import ipaddress
    net = ipaddress.IPv4Network(topo.host(host).vm_prefix)
    if not 1 <= slot < net.num_addresses:
        raise ValueError(f"vm_address: slot {slot} outside {net}")
    return str(net.network_address + slot)


def host_mac(index: int) -> str:
    n = index + 1
    return f"02:00:00:00:{(n >> 8) & 0xFF:02x}:{n & 0xFF:02x}"


class _Builder:
    """Accumulates switches, hosts and links, allocating ports per node."""

    def __init__(self, name: str, queue_bytes: int | None):
        self.name = name
        self.queue_bytes = queue_bytes
        self.switches: list[Switch] = []
        self.hosts: list[Host] = []
        self.links: list[Link] = []
        self._next_port: dict[str, int] = {}

    def switch(self, name: str, role: str, pod: int | None = None) -> str:
        self.switches.append(Switch(name, len(self.switches) + 1, role, pod))
        self._next_port[name] = 1
        return name

    def host(self, name: str | None = None) -> str:
        i = len(self.hosts)
        name = name or f"h{i + 1}"
        self.hosts.append(Host(name, host_ip(i), host_mac(i)))
        self._next_port[name] = 0
        return name

    def link(self, a: str, b: str, mbps: float) -> None:
        pa, pb = self._next_port[a], self._next_port[b]
        self._next_port[a] += 1
        self._next_port[b] += 1
        self.links.append(Link(a, pa, b, pb, float(mbps), self.queue_bytes))

    def pod(self, pod: int, n_aggs: int, n_edges: int, hosts_per_edge: int, host_mbps: float,
            edge_agg_mbps: float) -> None:
        """A pod: aggregation switches a<pod>_j, edge switches e<pod>_j, each
        edge's hosts, every edge linked to every aggregation switch."""
        aggs = [self.switch(f"a{pod}_{j}", "aggregation", pod) for j in range(n_aggs)]
        edges = [self.switch(f"e{pod}_{j}", "edge", pod) for j in range(n_edges)]
        for e in edges:
            for _ in range(hosts_per_edge):
                self.link(self.host(), e, host_mbps)
        for e in edges:
            for a in aggs:
                self.link(e, a, edge_agg_mbps)

    def done(self, mtu: int, **params) -> TopologyDescription:
        topo = TopologyDescription(self.name, self.switches, self.hosts, self.links,
                                   mtu=mtu, params=params)
        topo.validate()
        return topo


def fattree(k: int = 4, link_mbps: float = 10.0, mtu: int = JUMBO_MTU,
            queue_bytes: int | None = DEFAULT_QUEUE_BYTES, fabric_mbps: float | None = None) -> TopologyDescription:
    """Al-Fares fat-tree: k pods of k/2 edge + k/2 aggregation switches,
    (k/2)^2 cores, k^3/4 hosts. Core j*(k/2)+i links to aggregation switch j
    of every pod (port = pod + 1). ``fabric_mbps`` (default: ``link_mbps``)
    is the speed of the switch-to-switch links: below ``link_mbps`` the
    fabric is over-subscribed (a ToR's hosts can send more than its uplinks
    carry)."""
    fabric = link_mbps if fabric_mbps is None else fabric_mbps
    if k < 2 or k % 2:
        raise ValueError(f"fattree: k={k} must be an even number >= 2")
    half = k // 2
    b = _Builder(f"fattree-k{k}", queue_bytes)
    cores = [b.switch(f"c{i + 1}", "core") for i in range(half * half)]
    for pod in range(k):
        b.pod(pod, half, half, half, link_mbps, fabric)
    # cores last so that every aggregation switch's ports are 1..k/2 down, then up
    for pod in range(k):
        for j in range(half):
            for i in range(half):
                b.link(f"a{pod}_{j}", cores[j * half + i], fabric)
    extra = {} if fabric_mbps is None else {"fabric_mbps": fabric_mbps}
    return b.done(mtu, kind="fattree", k=k, link_mbps=link_mbps, **extra)


def vl2(d0: int = 2, d1: int = 4, d2: int = 4, servers_per_tor: int = 20,
        server_mbps: float = 10.0, fabric_mbps: float = 100.0, mtu: int = JUMBO_MTU,
        queue_bytes: int | None = DEFAULT_QUEUE_BYTES) -> TopologyDescription:
    """VL2 Clos: d1/2 intermediate switches, d2 aggregation switches (d1 ports:
    d1/2 down, d1/2 up to every intermediate), d2*(d1/2)/d0 ToRs with d0
    uplinks each. d0=2, d1=4, d2=4 gives 4 ToRs x 20 = 80 servers, 10 switches."""
    if d1 < 2 or d1 % 2 or d0 < 1 or d2 < d0 or (d2 * (d1 // 2)) % d0:
        raise ValueError(f"vl2: d0={d0}, d1={d1}, d2={d2} do not form a VL2 Clos "
                         "(need even d1, d2 >= d0, d0 dividing d2*d1/2)")
    n_int, n_agg = d1 // 2, d2
    n_tor = d2 * (d1 // 2) // d0
    b = _Builder(f"vl2-{d0}-{d1}-{d2}", queue_bytes)
    ints = [b.switch(f"i{i + 1}", "core") for i in range(n_int)]
    aggs = [b.switch(f"a{i + 1}", "aggregation") for i in range(n_agg)]
    tors = [b.switch(f"t{i + 1}", "edge") for i in range(n_tor)]
    for t in tors:
        for _ in range(servers_per_tor):
            b.link(b.host(), t, server_mbps)
    for ti, t in enumerate(tors):
        for j in range(d0):
            b.link(t, aggs[(ti * d0 + j) % n_agg], fabric_mbps)
    for a in aggs:
        for i in ints:
            b.link(a, i, fabric_mbps)
    return b.done(mtu, kind="vl2", d0=d0, d1=d1, d2=d2, servers_per_tor=servers_per_tor,
                  server_mbps=server_mbps, fabric_mbps=fabric_mbps)


EVALUATION_FABRICS = ("fattree", "vl2")


def evaluation_fabric(topology: str, *, k: int = 4, link_mbps: float = 10.0, fabric_mbps: float = 25.0,
                      servers_per_tor: int = 5, mtu: int = JUMBO_MTU,
                      queue_bytes: int | None = DEFAULT_QUEUE_BYTES) -> TopologyDescription:
    """The experiments' fabrics by name: ``fattree`` (k, every link at
    link_mbps) or ``vl2`` (d0=2, d1=4, d2=4; servers at link_mbps, fabric
    links at fabric_mbps)."""
    if topology == "fattree":
        return fattree(k=k, link_mbps=link_mbps, mtu=mtu, queue_bytes=queue_bytes)
    if topology == "vl2":
        return vl2(servers_per_tor=servers_per_tor, server_mbps=link_mbps, fabric_mbps=fabric_mbps,
                   mtu=mtu, queue_bytes=queue_bytes)
    raise ValueError(f"topology {topology!r}: one of {', '.join(EVALUATION_FABRICS)}")


def lessor_testbed(link_mbps: float = 1000.0, mtu: int = JUMBO_MTU,
                   queue_bytes: int | None = DEFAULT_QUEUE_BYTES) -> TopologyDescription:
    """LESSOR's testbed: 8 servers on 4 switches, a 2x2 leaf-spine. Servers
    h1-h4 hang off leaf e1, h5-h8 off leaf e2; both leaves link to both
    spines, so every pair across the leaves has two equal-cost paths (pairs on
    one leaf have the single direct path)."""
    b = _Builder("lessor-testbed", queue_bytes)
    spines = [b.switch("c1", "core"), b.switch("c2", "core")]
    leaves = [b.switch("e1", "edge", 0), b.switch("e2", "edge", 1)]
    for leaf in leaves:
        for _ in range(4):
            b.link(b.host(), leaf, link_mbps)
    for leaf in leaves:
        for spine in spines:
            b.link(leaf, spine, link_mbps)
    return b.done(mtu, kind="lessor-testbed", link_mbps=link_mbps)


def bgwc_testbed(link_mbps: float = 100.0, mtu: int = JUMBO_MTU,
                 queue_bytes: int | None = DEFAULT_QUEUE_BYTES) -> TopologyDescription:
    """The BG/WC paper's testbed: servers S1-S4 on the left switch, S5-S8 on
    the right one, joined through a middle switch; S1-S4 send to S5-S8, so the
    left->middle link is the shared bottleneck."""
    b = _Builder("bgwc-testbed", queue_bytes)
    left, mid, right = b.switch("sl", "edge", 0), b.switch("sm", "core"), b.switch("sr", "edge", 1)
    for i in range(4):
        b.link(b.host(f"s{i + 1}"), left, link_mbps)
    for i in range(4, 8):
        b.link(b.host(f"s{i + 1}"), right, link_mbps)
    b.link(left, mid, link_mbps)
    b.link(mid, right, link_mbps)
    return b.done(mtu, kind="bgwc-testbed", link_mbps=link_mbps,
                  senders=["s1", "s2", "s3", "s4"], receivers=["s5", "s6", "s7", "s8"])


def bgwc_large(pods: int = 4, cores: int = 2, aggs_per_pod: int = 2, tors_per_pod: int = 4, hosts_per_tor: int = 25,
               host_mbps: float = 1000.0, tor_agg_mbps: float = 10000.0, agg_core_mbps: float = 20000.0,
               mtu: int = JUMBO_MTU, queue_bytes: int | None = DEFAULT_QUEUE_BYTES) -> TopologyDescription:
    """The BG/WC paper's simulated fabric (seed 000, Fig. 18): 400 hosts in
    4 pods, 2 cores, 8 aggregation and 16 ToR switches, 25 hosts per ToR,
    links of 1 / 10 / 20 Gb/s by tier. The paper leaves the wiring open;
    here every ToR links to every aggregation switch of its pod and every
    aggregation switch to every core (the three-tier tree of Al-Fares'
    Fig. 1). ToR over-subscription: 25 x 1 / (2 x 10) = 1.25; aggregation:
    4 x 10 / (2 x 20) = 1. Simulated only (400 hosts): not among the
    emulated ``BUILDERS``, whose tests trace every host pair."""
    if min(pods, cores, aggs_per_pod, tors_per_pod, hosts_per_tor) < 1:
        raise ValueError("bgwc_large: every count must be >= 1")
    b = _Builder(f"bgwc-large-{pods * tors_per_pod * hosts_per_tor}", queue_bytes)
    core = [b.switch(f"c{i + 1}", "core") for i in range(cores)]
    for pod in range(pods):
        b.pod(pod, aggs_per_pod, tors_per_pod, hosts_per_tor, host_mbps, tor_agg_mbps)
    for pod in range(pods):
        for j in range(aggs_per_pod):
            for c in core:
                b.link(f"a{pod}_{j}", c, agg_core_mbps)
    return b.done(mtu, kind="bgwc-large", host_mbps=host_mbps, tor_agg_mbps=tor_agg_mbps,
                  agg_core_mbps=agg_core_mbps,
                  tor_oversubscription=hosts_per_tor * host_mbps / (aggs_per_pod * tor_agg_mbps))


def star(n_senders: int = 3, link_mbps: float = 100.0, mtu: int = JUMBO_MTU,
         queue_bytes: int | None = DEFAULT_QUEUE_BYTES) -> TopologyDescription:
    """N senders h1..hN and one receiver r1 on a single switch."""
    if n_senders < 1:
        raise ValueError(f"star: n_senders={n_senders} must be >= 1")
    b = _Builder(f"star-{n_senders}", queue_bytes)
    sw = b.switch("s1", "edge", 0)
    senders = [b.host() for _ in range(n_senders)]
    for h in senders:
        b.link(h, sw, link_mbps)
    b.link(b.host("r1"), sw, link_mbps)
    return b.done(mtu, kind="star", link_mbps=link_mbps, senders=senders, receivers=["r1"])


BUILDERS: dict[str, Callable[..., TopologyDescription]] = {
    "fattree": fattree,
    "vl2": vl2,
    "lessor-testbed": lessor_testbed,
    "bgwc-testbed": bgwc_testbed,
    "star": star,
}


def build(kind: str, vm_blocks: bool = False, **params) -> TopologyDescription:
    """A built-in topology; ``vm_blocks``: every host given its VM block
    (:func:`vm_block`), for several VMs per host."""
    try:
        builder = BUILDERS[kind]
    except KeyError:
        raise ValueError(f"unknown topology {kind!r}; choose one of {', '.join(BUILDERS)}") from None
    topo = builder(**params)
    return with_vm_blocks(topo) if vm_blocks else topo
