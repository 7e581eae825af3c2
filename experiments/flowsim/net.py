"""The simulated fabric: the controller's own ``NetworkView`` of a
topology description, its directed links numbered for arrays, and the
endpoints flows run between (hosts, or VMs behind a host's NIC)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import numpy as np

from controller.network_view import NetworkView
from controller.topology import TopologyDescription

MAX_HOPS = 8          # host -> ToR -> ... -> host: 6 links on a 3-tier fat-tree; room for VL2-like fabrics


class SimError(ValueError):
    """Bad simulator input, refused by name."""


@dataclass(frozen=True)
class Endpoint:
    name: str
    host: str           # the server whose NIC it sends through
    ip: str


class SimNet:
    def __init__(self, topo: TopologyDescription, vms_per_host: int = 0):
        """``vms_per_host`` = 0: the hosts themselves are the endpoints;
        n >= 1: each host carries n VMs, addresses 1..n of its VM block
        (the controller trusts a VM's counters by that block), named
        ``<host>v<slot>``."""
        if not isinstance(vms_per_host, int) or isinstance(vms_per_host, bool) or not 0 <= vms_per_host <= 14:
            raise SimError(f"vms_per_host {vms_per_host!r}: must be an integer in 0..14")
        if vms_per_host and any(h.vm_prefix is None for h in topo.hosts):
            raise SimError("vms_per_host: every host needs a VM block (mininet_topos.builders.with_vm_blocks)")
        self.topo = topo
        self.view = NetworkView(topo)
        view = self.view
        self.links: list[tuple[str, str]] = sorted(view.graph.edges)
        self.link_index = {e: i for i, e in enumerate(self.links)}
        self.capacity = np.array([view.capacity(u, v) for u, v in self.links], dtype=float)   # bits/s
        self.tor_of: dict[str, str] = {h: view.host_switch(h)[0] for h in view.hosts}
        self.endpoints: list[Endpoint] = []
        for h in view.hosts:
            if vms_per_host == 0:
                self.endpoints.append(Endpoint(h, h, view.ip(h)))
                continue
            block = ipaddress.IPv4Network(view.vm_prefix(h))
            if block.num_addresses < vms_per_host + 2:
                raise SimError(f"vms_per_host {vms_per_host}: {h}'s VM block {block} is too small")
            for slot in range(vms_per_host):
                self.endpoints.append(Endpoint(f"{h}v{slot}", h, str(block[slot + 1])))
        self.ep_index = {e.name: i for i, e in enumerate(self.endpoints)}
        host_index = {h: i for i, h in enumerate(view.hosts)}
        self.ep_host = np.array([host_index[e.host] for e in self.endpoints], dtype=np.int64)
        self.ip_int = np.array([int(ipaddress.IPv4Address(e.ip)) for e in self.endpoints], dtype=np.int64)
        self._by_ip = {e.ip: e for e in self.endpoints}

    def endpoint(self, name: str) -> int:
        try:
            return self.ep_index[name]
        except KeyError:
            raise SimError(f"endpoint {name!r} is not a host or VM of {self.topo.name}") from None

    def host_of_ip(self, ip: str) -> str | None:
        e = self._by_ip.get(ip)
        return e.host if e is not None else None

    def path_links(self, path: tuple[str, ...]) -> list[int]:
        """Node path (host, switches..., host) -> directed link indices."""
        return [self.link_index[(u, v)] for u, v in zip(path, path[1:])]

    def nic_bps(self, host: str) -> float:
        return self.view.capacity(host, self.tor_of[host])
