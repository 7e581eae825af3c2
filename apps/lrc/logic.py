"""LRC at the controller, one round every τ_r (pure: no os-ken, no sockets).

Inputs: the declared tenants (VMs' hosts, guarantees, weights), the
fabric (:class:`controller.network_view.NetworkView`), the links' loads
from port statistics, and the pairs each agent reports open. Output: per
sending host, ``{peer address: [r̃_i, w_i, B_i]}`` -- what the agent's
``rates`` message carries.

- pairs: (sender VM, receiver VM) of one tenant, as the senders' agents
  report them; Eqs. 1 and 2 over all of them (the receiver's half needs
  every sender of the receiver: only the controller sees those);
- links: every link the pair's traffic may use, host links included -- the
  single path for ``single_path``, the union of the equal-cost paths
  otherwise (ECMP hashes, LESSOR and Hedera move flows among them);
- factors: :class:`apps.lrc.control.LinkFactors`. After a (re)start the
  first round seeds each link from the hosts' reported v_i/w_i (the
  largest over the link's pairs), so limits resume where they were.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from bwcommon import lrc as M
from apps.lrc.control import LinkFactors, PairPath
from controller.network_view import NetworkView


@dataclass(frozen=True)
class VmInfo:
    tenant: str
    name: str
    host: str
    ip: str
    guarantee_mbps: float
    weight: float
    agent_name: str = ""        # the VM's name at its host's agent: its host's, or "tenant/vm" in a netns

    @property
    def key(self) -> str:
        return self.agent_name or self.host


def vms_by_ip(loaded) -> dict[str, VmInfo]:
    out = {}
    for p in loaded.vms().values():
        out[p.address] = VmInfo(p.tenant, p.name, p.host, p.address, p.vm.guarantee_mbps, p.vm.weight,
                                p.id if p.netns else p.host)
    return out


def pair_links(view: NetworkView, routing: str, src: str, dst: str) -> frozenset:
    """Directed links (u, v) a pair's traffic may cross."""
    if routing == "single_path":
        from apps.routing.logic import DestinationRouting
        path = DestinationRouting(view, multipath=False).single_path(src, dst)
        paths = [path] if path else []
    else:
        paths = view.equal_cost_paths(src, dst)
    return frozenset(link for p in paths for link in NetworkView.path_links(p))


@dataclass
class LrcController:
    view: NetworkView
    params: M.LrcParams
    routing: str
    vms: dict = field(default_factory=dict)               # ip -> VmInfo
    factors: LinkFactors = field(init=False)
    links_of: dict = field(default_factory=dict)          # (src host, dst host) -> links (cached)
    rounds: int = 0
    seeded: bool = False
    refused_reports: int = 0
    delay_s: float | None = None                           # measured stats -> agent's reply (EWMA)
    full_is_equilibrium: bool = False     # combined mode, wc: competition (the hosts do not cap WC)

    def __post_init__(self) -> None:
        caps = {(u, v): float(self.view.capacity(u, v)) / 1e6 for u, v in self.view.graph.edges}   # Mb/s
        self.factors = LinkFactors(self.params, caps)

    def configure(self, loaded, params: M.LrcParams | None = None) -> None:
        """A new configuration: the VMs (and the parameters) change; factors stay."""
        self.vms = vms_by_ip(loaded)
        lrc = loaded.cfg.lrc
        self.full_is_equilibrium = lrc.mode == "combined" and lrc.wc == "competition"
        if params is not None and params != self.params:
            self.params = params
            self.factors.params = params

    def pairs_from(self, reports: dict[str, dict]) -> dict[tuple[str, str], dict]:
        """(sender ip, receiver ip) -> the sender's report of it, for pairs
        within one tenant whose sender is the reporting VM. ``reports`` are
        keyed by the VMs' names at their agents (a host that is its own VM:
        the host's name)."""
        out = {}
        by_key = {v.key: v for v in self.vms.values()}
        for key, pairs in sorted(reports.items()):
            src = by_key.get(key)
            if src is None or not isinstance(pairs, dict):
                continue
            for peer, rep in pairs.items():
                dst = self.vms.get(peer)
                if dst is None or dst.tenant != src.tenant or dst.ip == src.ip or M.report_problems(rep):
                    self.refused_reports += 1
                    continue
                out[(src.ip, dst.ip)] = rep
        return out

    def round(self, loads_bps: dict, reports: dict[str, dict]) -> dict[str, dict[str, list[float]]]:
        """One τ_r round -> per sending VM (its name at its agent), its pairs' [r̃_i, w_i, B_i]."""
        self.rounds += 1
        pairs = self.pairs_from(reports)
        if not pairs:
            self.factors.set_pairs({})
            return {}
        terms = M.pair_terms(pairs, {ip: M.Vm(v.guarantee_mbps, v.weight) for ip, v in self.vms.items()})
        paths = {}
        for (s, d), (w, b) in terms.items():
            key = (self.vms[s].host, self.vms[d].host)
            if key not in self.links_of:
                self.links_of[key] = pair_links(self.view, self.routing, *key)
            paths[(s, d)] = PairPath(w, b, self.links_of[key])
        self.factors.set_pairs(paths)
        if not self.seeded:
            self._seed(pairs, paths)
        loads = {link: bps / 1e6 for link, bps in loads_bps.items()
                 if M.finite_number(bps) and bps >= 0 and link in self.factors.capacity_mbps}
        self.factors.update(loads, self.full_is_equilibrium)
        out: dict[str, dict[str, list[float]]] = {}
        for (s, d), pp in paths.items():
            if not pp.links:
                continue
            out.setdefault(self.vms[s].key, {})[d] = [self.factors.pair_factor((s, d)), pp.weight, pp.guarantee_mbps]
        return out

    def _seed(self, pairs: dict, paths: dict) -> None:
        """Resume from the hosts: r_l = max over the link's pairs of the v_i/w_i they report."""
        best: dict = {}
        for pair, rep in pairs.items():
            v, w = rep.get("v_mbps"), rep.get("weight")
            if not (M.finite_number(v) and M.finite_number(w) and v > 0 and w > 0):
                continue
            for link in paths[pair].links:
                # seeded within the link: v/w can at most be its capacity per unit of the pair's weight
                cap = self.factors.capacity_mbps.get(link, 0.0) / paths[pair].weight
                best[link] = max(best.get(link, 0.0), min(v / w, cap))
        for link, r in best.items():
            if link in self.factors.members:
                self.factors.seed(link, r)
        self.seeded = True

    def observe_delay(self, seconds: float) -> None:
        """One measured stats-request -> agent-reply delay; the model of the
        hosts' v uses the running estimate (EWMA, 1/8)."""
        if not (M.finite_number(seconds) and 0 <= seconds < 60):
            return
        self.delay_s = seconds if self.delay_s is None else self.delay_s + (seconds - self.delay_s) / 8
        est = min(10.0, max(0.0, self.delay_s))
        if not math.isclose(est, self.factors.params.feedback_delay_s, rel_tol=0.05):
            self.factors.params = self.factors.params.model_copy(update={"feedback_delay_s": round(est, 3)})

