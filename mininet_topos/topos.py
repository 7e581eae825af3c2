"""Mininet ``Topo`` classes for bwfabric's topologies.

A Topo is only a graph description: ``DescribedTopo`` adds the hosts,
switches and links of a :class:`TopologyDescription` (so Mininet and the
controller see the same ports, addresses and capacities); the parameterised
classes build the description first. From Python:

    Mininet(topo=FatTreeTopo(k=4, link_mbps=10), switch=partial(OVSSwitch, datapath="user"), ...)

or use :class:`experiments.fabric.Fabric`, which also tunes the links. (The
``mn`` script runs Mininet's machine-wide cleanup on errors: avoid it.)
"""

from __future__ import annotations

from mininet.topo import Topo

from controller.topology import TopologyDescription
from mininet_topos import builders


def delay_node(index: int) -> str:
    return f"dl{index}"


class DescribedTopo(Topo):
    def build(self, description: TopologyDescription, delays: dict | None = None):  # noqa: D401 - Mininet API
        """``delays`` (emulation only): {(a, b): anything} -- each such link
        goes through a delay node ``dl<i>`` (a namespace with two
        interfaces, where the caller runs a delay line), keeping both ends'
        ports and shaping as described; the controller never sees it."""
        self.description = description
        self.delay_nodes: dict[tuple[str, str], str] = {}
        delays = delays or {}
        for sw in description.switches:
            self.addSwitch(sw.name, dpid=f"{sw.dpid:016x}")
        prefix = 16
        for h in description.hosts:
            self.addHost(h.name, ip=f"{h.ip}/{prefix}", mac=h.mac)
        for lk in description.links:
            key = (lk.a, lk.b) if (lk.a, lk.b) in delays else (lk.b, lk.a) if (lk.b, lk.a) in delays else None
            if key is None:
                self.addLink(lk.a, lk.b, port1=lk.a_port, port2=lk.b_port, bw=lk.capacity_mbps)
                continue
            d = delay_node(len(self.delay_nodes) + 1)
            self.delay_nodes[key] = d
            self.addHost(d, ip=None)
            # the described ends keep their ports and their shaping; the delay node's sides are not shaped
            self.addLink(lk.a, d, port1=lk.a_port, port2=1, params1={"bw": lk.capacity_mbps}, params2={})
            self.addLink(d, lk.b, port1=2, port2=lk.b_port, params1={}, params2={"bw": lk.capacity_mbps})


class FatTreeTopo(DescribedTopo):
    def build(self, k: int = 4, link_mbps: float = 10.0, **kw):
        super().build(builders.fattree(k=k, link_mbps=link_mbps, **kw))


class VL2Topo(DescribedTopo):
    def build(self, d0: int = 2, d1: int = 4, d2: int = 4, **kw):
        super().build(builders.vl2(d0, d1, d2, **kw))


class LessorTestbedTopo(DescribedTopo):
    def build(self, link_mbps: float = 1000.0, **kw):
        super().build(builders.lessor_testbed(link_mbps=link_mbps, **kw))


class BgWcTestbedTopo(DescribedTopo):
    def build(self, link_mbps: float = 100.0, **kw):
        super().build(builders.bgwc_testbed(link_mbps=link_mbps, **kw))


class StarTopo(DescribedTopo):
    def build(self, n_senders: int = 3, link_mbps: float = 100.0, **kw):
        super().build(builders.star(n_senders=n_senders, link_mbps=link_mbps, **kw))


topos = {
    "fattree": FatTreeTopo,
    "vl2": VL2Topo,
    "lessor-testbed": LessorTestbedTopo,
    "bgwc-testbed": BgWcTestbedTopo,
    "star": StarTopo,
}
