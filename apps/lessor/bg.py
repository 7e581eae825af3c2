"""Which long flows carry BG, and how much (pure).

LESSOR sees flows as the ToRs' 5-tuple counters; what it must know to keep
guarantees is which of them travel in the guaranteed class (BG) and at what
rate, so that :func:`apps.lessor.pmpt.place_bg` keeps every link's BG sum
within mu x C. What the hosts do decides it (hostagent.plan):

- every TCP connection is MPTCP; its first subflow is BG and is paced at
  the VM-pair's limit, its joins are WC. A join goes to one of the
  server's signal ports, ``join_port_base`` .. ``join_port_base + JOIN_PORTS
  - 1`` of the server VM: a TCP flow with either port in the join range of
  the VM at that end is WC, any other TCP flow from a VM with a guarantee
  is BG;
- UDP from a VM with a guarantee is BG (the switches put every UDP packet
  in the BG queue and meter it at the guarantee: apps/prio_queues).

A VM's BG flows to one destination ToR form a bundle that PMPT keeps on
one path: the counters show each flow's bytes, not how many of them were
BG (a TCP first subflow also carries what the host's marker demoted to WC,
a VM's UDP may hold all of its BG), so only their sum is known -- at most
the guarantee. A VM's hose guarantee is shared max-min among its bundles,
each at most its flows' demands (a reverse ACK stream, application-limited
at its measured rate, takes what it uses and no more). Flows of addresses
without a guarantee carry no BG.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from apps.lessor.bg_routes import HoseVm
from apps.lessor.pmpt import check_mu
from bwcommon.validate import finite_number

IPPROTO_TCP, IPPROTO_UDP = 6, 17
JOIN_PORTS = 8          # hostagent.plan: wc_subflows <= 8, join ports base .. base + wc_subflows - 1


@dataclass(frozen=True)
class BgPolicy:
    """What the declared tenants say of BG: each VM's hose guarantee by
    address (bits/s), the first join port of each VM's agent, and mu (the
    share of a link guarantees may fill). Empty: no flow carries BG (no
    prio queues, LESSOR places every flow alike)."""
    guarantee_bps: Mapping[str, float] = field(default_factory=dict)
    join_port_base: Mapping[str, int] = field(default_factory=dict)
    mu: float = 1.0
    # where each VM runs and whose it is, by address: what its default BG
    # route needs (apps.lessor.bg_routes); a VM without both is not routed
    host: Mapping[str, str] = field(default_factory=dict)
    tenant: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self):
        check_mu(self.mu)
        for ip, g in self.guarantee_bps.items():
            if not (finite_number(g) and g > 0):
                raise ValueError(f"BG policy: guarantee of {ip} {g!r} must be a finite number > 0 (bits/s)")
        for ip, base in self.join_port_base.items():
            if isinstance(base, bool) or not isinstance(base, int) or not 1 <= base <= 65536 - JOIN_PORTS:
                raise ValueError(f"BG policy: join port base of {ip} {base!r} must be an integer in "
                                 f"[1, {65536 - JOIN_PORTS}]")

        for name, table in (("host", self.host), ("tenant", self.tenant)):
            for ip, v in table.items():
                if ip not in self.guarantee_bps:
                    raise ValueError(f"BG policy: {name} of {ip} given without its guarantee")
                if not isinstance(v, str) or not v:
                    raise ValueError(f"BG policy: {name} of {ip} {v!r} must be a non-empty string")

    def hose_vms(self) -> list[HoseVm]:
        """The VMs whose BG gets a default route: those with a host and a tenant."""
        return [HoseVm(ip, self.host[ip], self.tenant[ip], g) for ip, g in sorted(self.guarantee_bps.items())
                if ip in self.host and ip in self.tenant]

    def _joins(self, ip: str, port: int) -> bool:
        base = self.join_port_base.get(ip)
        return base is not None and base <= port < base + JOIN_PORTS

    def carries_bg(self, key: tuple) -> bool:
        """Whether the flow (src ip, dst ip, proto, src port, dst port) is BG."""
        src, dst, proto, sport, dport = key
        if src not in self.guarantee_bps:
            return False
        if proto == IPPROTO_UDP:
            return True
        if proto != IPPROTO_TCP:
            return False
        return not (self._joins(dst, dport) or self._joins(src, sport))

    def shares(self, flows: Mapping[tuple, tuple[float, str]]) -> dict[tuple, tuple[float, tuple]]:
        """flow key -> (BG bits/s, bundle) for the BG flows among ``flows``
        (key -> (demand in bits/s, destination ToR)). A VM's BG flows to one
        ToR are one bundle, placed on one path (how the VM's BG splits among
        them -- its UDP or its TCP, this connection or that -- the counters
        do not tell); each source VM's guarantee is shared max-min among
        its bundles, each capped at its flows' demands, and split evenly
        among the bundle's flows (the bundle's sum is what counts)."""
        bundles: dict[str, dict[tuple, list]] = {}
        for key, (demand, dst_tor) in flows.items():
            if self.carries_bg(key):
                bundles.setdefault(key[0], {}).setdefault((key[0], dst_tor), []).append((key, max(0.0, demand)))
        out: dict[tuple, tuple[float, tuple]] = {}
        for vm, by_tor in bundles.items():
            left, n = self.guarantee_bps[vm], len(by_tor)
            for bundle, members in sorted(by_tor.items(), key=lambda t: (sum(d for _, d in t[1]), t[0])):
                share = min(sum(d for _, d in members), left / n)
                left -= share
                n -= 1
                for key, _ in members:
                    out[key] = (share / len(members), bundle)
        return out
