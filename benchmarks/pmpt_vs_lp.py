"""PMPT against the exact LP optimum (PuLP + HiGHS) on the same snapshot.

    .venv/bin/python benchmarks/pmpt_vs_lp.py [--epsilon 0.05] [--seeds 1] [--sizes 4,8,16]

Prints, per topology and demand kind: lambda_PMPT / lambda_LP for the
fractional solution and for the one-path-per-flow routing, PMPT's time (warm:
paths cached, JIT compiled; cold: first call) and the LP's, and their ratio.
"1-path opt" is the best any one-path-per-flow routing can reach (MILP, for
instances of up to --milp-flows flows): where it is below 1, no unsplittable
routing can match the LP. Hedera's Global First Fit routing is shown for
reference (flows it cannot place keep a single path).
"""

from __future__ import annotations

import argparse
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from apps.lessor.hedera import global_first_fit  # noqa: E402
from bwtesting.lp import max_concurrent_flow_lp, one_path_optimum_milp  # noqa: E402
from apps.lessor.paths import PathDictionary  # noqa: E402
from apps.lessor.pmpt import DEFAULT_EPSILON, pmpt  # noqa: E402
from controller.network_view import NetworkView  # noqa: E402
from experiments.te_instances import long_flows  # noqa: E402
from mininet_topos import builders  # noqa: E402


def gff_lambda(flows, pd: PathDictionary) -> float:
    cands = [pd.paths(f.src_tor, f.dst_tor)[1] for f in flows]
    nic = max(f.demand for f in flows)
    choice = global_first_fit([f.demand for f in flows], cands, pd.capacity, nic)
    load = np.zeros(len(pd.capacity))
    for f, c, ch in zip(flows, cands, choice):
        if c.shape[1]:
            # a flow GFF cannot place stays on its ECMP (hash-chosen) path
            p = ch if ch is not None else zlib.crc32(repr(f.key).encode()) % len(c)
            load[c[p]] += f.demand
    busy = load > 0
    return float((pd.capacity[busy] / load[busy]).min())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epsilon", type=float, default=DEFAULT_EPSILON)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--sizes", default="4,8,16")
    ap.add_argument("--no-vl2", action="store_true")
    ap.add_argument("--milp-flows", type=int, default=150, help="largest instance solved as a MILP")
    ap.add_argument("--lp-time-limit", type=float, default=900.0, help="seconds; a longer solve is cut off")
    args = ap.parse_args()
    topos = [(f"fattree k={k}", builders.fattree(int(k), link_mbps=10)) for k in args.sizes.split(",")]
    if not args.no_vl2:
        topos.append(("vl2 2,4,4", builders.vl2(2, 4, 4)))
    header = (f"{'topology':14} {'demands':12} {'seed':>4} {'flows':>5} {'lam_LP':>7} {'frac':>6} "
              f"{'1-path':>6} {'1p opt':>6} {'GFF':>6} {'PMPT s':>7} {'cold s':>7} {'LP s':>7} "
              f"{'LP/PMPT':>8} placement; stop")
    print(f"epsilon = {args.epsilon}; ratios are lambda / lambda_LP")
    print(header)
    print("-" * len(header))
    for name, topo in topos:
        view = NetworkView(topo)
        for kind in ("permutation", "websearch"):
            for seed in range(1, args.seeds + 1):
                flows = long_flows(view, kind, seed)
                pd = PathDictionary(view)
                t0 = time.perf_counter()
                pmpt(flows, pd, epsilon=args.epsilon)          # cold: paths, JIT
                cold = time.perf_counter() - t0
                a = pmpt(flows, pd, epsilon=args.epsilon)      # warm
                lp = max_concurrent_flow_lp(flows, pd, time_limit=args.lp_time_limit)
                lp_s = lp.build_seconds + lp.solve_seconds
                if lp.status != "Optimal":
                    print(f"{name:14} {kind:12} {seed:>4} {len(flows):>5} LP stopped ({lp.status}) after "
                          f"{lp_s:.0f} s; PMPT lambda {a.lam:.4f} (certified >= {a.lam / a.upper_bound:.4f} "
                          f"of optimal), one-path {a.integral_lam:.4f}, {a.seconds:.3f} s", flush=True)
                    continue
                opt = "   n/a"
                if len(flows) <= args.milp_flows:
                    milp, status, _ = one_path_optimum_milp(flows, pd)
                    opt = f"{milp / lp.lam:6.4f}" if milp and status == "Optimal" else "  ?   "
                print(f"{name:14} {kind:12} {seed:>4} {len(flows):>5} {lp.lam:7.4f} "
                      f"{a.lam / lp.lam:6.4f} {a.integral_lam / lp.lam:6.4f} {opt} "
                      f"{gff_lambda(flows, pd) / lp.lam:6.4f} {a.seconds:7.3f} {cold:7.3f} {lp_s:7.2f} "
                      f"{lp_s / a.seconds:8.1f} {a.placement}; {a.stopped_by} ({a.phases} phases)",
                      flush=True)


if __name__ == "__main__":
    main()
