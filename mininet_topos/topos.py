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


class DescribedTopo(Topo):
    def build(self, description: TopologyDescription):  # noqa: D401 - Mininet API
        self.description = description
        for sw in description.switches:
            self.addSwitch(sw.name, dpid=f"{sw.dpid:016x}")
        prefix = 16
        for h in description.hosts:
            self.addHost(h.name, ip=f"{h.ip}/{prefix}", mac=h.mac)
        for lk in description.links:
            opts = {"bw": lk.capacity_mbps}
            self.addLink(lk.a, lk.b, port1=lk.a_port, port2=lk.b_port, **opts)


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
