"""How LRC's controller round scales, on one core: port statistics parsed
(PortLoads.record: ports/s) and the factor round (LrcController.round:
pairs/s, with every link full so the joint equilibrium runs too), on
FatTrees of growing k. Prints what polling every switch every τ_r = 100 ms
costs as a fraction of one core.

    python -m benchmarks.lrc_scale [--k 4 8 16] [--pairs 100 1000]
"""

from __future__ import annotations

import argparse
import random
import time

from apps.lrc.logic import LrcController
from controller import config
from controller.network_view import NetworkView
from controller.portstats import PortLoads
from mininet_topos.builders import fattree


def parse_rate(topo, rounds: int = 20) -> tuple[int, float]:
    view = NetworkView(topo)
    loads = PortLoads(view)
    ports = {sw: [view.port(sw, v) for v in view.graph.successors(sw)] for sw in (s.name for s in topo.switches)}
    n_ports = sum(len(p) for p in ports.values())
    t0 = time.process_time()
    for r in range(rounds):
        for sw, ps in ports.items():
            loads.record(sw, [(p, 10**6 * r + p, 10**6 * r, r, 0) for p in ps], float(r))
    cpu = time.process_time() - t0
    return n_ports, n_ports * rounds / cpu


def round_rate(topo, n_pairs: int, rounds: int = 5, seed: int = 1) -> float:
    hosts = [h.name for h in topo.hosts]
    rng = random.Random(seed)
    # one tenant per 8 hosts; pairs within tenants
    tenants, per = {}, 8
    for i in range(0, len(hosts), per):
        group = hosts[i:i + per]
        tenants[f"t{i // per}"] = {"vms": {h: {"host": h, "guarantee_mbps": 0.5, "weight": rng.choice([1, 2, 4])}
                                         for h in group}}
    loaded = config.from_data({"fabric": {"topology": topo.to_dict()}, "tenants": tenants,
                               "agents": {"master_key_file": "/nonexistent", "address_template": "unix:/x/{host}"},
                               "lrc": {"enabled": True}, "admission": {"mu": 1.0}})
    view = NetworkView(loaded.topology)
    ctrl = LrcController(view, loaded.cfg.lrc.params(), "ecmp")
    ctrl.configure(loaded)
    ip = {h.name: h.ip for h in loaded.topology.hosts}
    reports: dict = {}
    made = 0
    groups = [list(t["vms"]) for t in tenants.values()]
    while made < n_pairs:
        g = rng.choice(groups)
        a, b = rng.sample(g, 2)
        if ip[b] not in reports.setdefault(a, {}):
            reports[a][ip[b]] = {}
            made += 1
    full = {(u, v): view.capacity(u, v) for u, v in view.graph.edges}     # every link full
    ctrl.round(full, reports)
    t0 = time.process_time()
    for _ in range(rounds):
        ctrl.round(full, reports)
    return rounds / (time.process_time() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--pairs", type=int, nargs="+", default=[100, 1000])
    args = ap.parse_args()
    for k in args.k:
        topo = fattree(k=k, link_mbps=1000)
        n_ports, rate = parse_rate(topo)
        print(f"FatTree k={k}: {len(topo.switches)} switches, {n_ports} switch ports: {rate:,.0f} ports/s parsed; "
              f"polling every 100 ms takes {n_ports * 10 / rate:.1%} of a core")
        for n in args.pairs:
            if n > len(topo.hosts) * 7:
                continue
            rps = round_rate(topo, n)
            print(f"  {n} pairs, every link full: {1 / rps * 1e3:.1f} ms per LRC round "
                  f"({0.1 * rps:.1f} rounds per τ_r of 100 ms)")


if __name__ == "__main__":
    main()
