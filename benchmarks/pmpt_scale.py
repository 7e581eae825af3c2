"""PMPT's time per decision on large fat-trees, one core (issue #34 §2).

Long flows of the web-search workload between random hosts (sizes from its
CDF above the long-flow threshold, demands by Hedera's estimation, as
``experiments.te_instances.long_flows``), inter-ToR only, placed by
:func:`apps.lessor.pmpt.pmpt` with epsilon = 0.05 on three fabrics of the
same k (the builder's 10 Mb/s links: PMPT's work does not depend on the
unit, only on the ratios):

- ``equal``: every link at its nominal capacity (what LESSOR sees with no
  BG and no failure);
- ``uneven``: every link's capacity drawn from 0.3-1.0 of nominal (what
  LESSOR's WC placement sees after BG took its share link by link: a
  harder instance than any real one, the even split far from optimal);
- ``failed``: k x 3 random aggregation-core links down.

For each: the first decision (``cold``: the ToR pairs' candidate paths
enumerated and the kernels compiled or loaded) and the next ones on the same
flows (``warm``: paths cached until a link changes), then the decision right
after one aggregation-core link fails (``link failed``: the pairs keep their
paths less the failed link's) and the one after it comes back (``link back``:
only the pairs whose paths can cross it are walked again; the answer must be
the first decision's), the Garg-Koenemann
phases run, lambda against its certified bound, the one-path routing's
lambda and how it was reached. The LP is no reference at these sizes; the
bound is (issue: report lambda against the certified bound).

    python -m benchmarks.pmpt_scale [--k 16 32] [--flows N] [--fabrics equal uneven failed] [--warm 3]

Goal (issue #34): k = 32 with 8192 long flows in <= 1 s per decision.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import time

import numpy as np

from apps.lessor.paths import PathDictionary
from apps.lessor.pmpt import pmpt, warm_up
from controller.network_view import NetworkView
from experiments.te_instances import long_flows
from mininet_topos.builders import fattree

FABRICS = ("equal", "uneven", "failed")


def fabric(k: int, kind: str, seed: int = 4) -> PathDictionary:
    """A k fat-tree's path dictionary as ``kind`` says (module docstring)."""
    if kind not in FABRICS:
        raise ValueError(f"fabric {kind!r}: one of {', '.join(FABRICS)}")
    view = NetworkView(fattree(k))
    pd = PathDictionary(view)
    if kind == "uneven":
        pd.capacity = pd.capacity * np.random.default_rng(seed).uniform(0.3, 1.0, len(pd.capacity))
    elif kind == "failed":
        role = lambda n: view.graph.nodes[n]["role"]        # noqa: E731
        up = [(u, v) for u, v in pd.links if role(u) == "aggregation" and role(v) == "core"]
        for u, v in random.Random(seed).sample(up, 3 * k):
            view.set_link_state(u, v, False)
    return pd


def run(k: int, kind: str, n_flows: int, warm: int = 3, seed: int = 1) -> dict:
    pd = fabric(k, kind)
    flows = [f for f in long_flows(pd.view, "websearch", seed=seed, n_flows=n_flows) if f.src_tor != f.dst_tor]
    compile_s = warm_up(pd)
    t0 = time.perf_counter()
    first = pmpt(flows, pd)
    cold = time.perf_counter() - t0
    times = []
    for _ in range(warm):
        t0 = time.perf_counter()
        a = pmpt(flows, pd)
        times.append(time.perf_counter() - t0)
        if (a.lam, a.flow_path) != (first.lam, first.flow_path):
            raise AssertionError("PMPT gave two answers to one question")
    # then one aggregation-core link fails (the first up, in link order): the next decision's time
    role = pd.view.graph.nodes
    u, v = next((u, v) for u, v in pd.links if role[u]["role"] == "aggregation" and role[v]["role"] == "core"
                and pd.view.link_up(u, v))
    pd.view.set_link_state(u, v, False)
    t0 = time.perf_counter()
    failed = pmpt(flows, pd)
    after_failure = time.perf_counter() - t0
    # and comes back: the fabric as at the start, so the answer must be the first one again
    pd.view.set_link_state(u, v, True)
    walked_before_repair = pd.walked
    t0 = time.perf_counter()
    back = pmpt(flows, pd)
    after_repair = time.perf_counter() - t0
    if (back.lam, back.flow_path) != (first.lam, first.flow_path):
        raise AssertionError("PMPT after the link came back differs from PMPT before it failed")
    return {"k": k, "fabric": kind, "flows": len(flows), "tor_pairs": len({(f.src_tor, f.dst_tor) for f in flows}),
            "warm_up_s": round(compile_s, 2), "cold_s": round(cold, 3), "warm_s": [round(t, 3) for t in times],
            "warm_median_s": round(statistics.median(times), 3) if times else None,
            "after_failure_s": round(after_failure, 3), "after_failure_phases": failed.phases,
            "after_repair_s": round(after_repair, 3), "pairs_walked_at_repair": pd.walked - walked_before_repair,
            "phases": first.phases, "steps": first.steps, "stopped_by": first.stopped_by,
            "lambda": round(first.lam, 4), "bound": round(first.upper_bound, 4),
            "certified": round(first.lam / first.upper_bound, 4), "one_path_lambda": round(first.integral_lam, 4),
            "placement": first.placement, "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--flows", type=int, default=None, help="long flows per fabric (default: one per host, k^3/4)")
    ap.add_argument("--fabrics", nargs="+", choices=FABRICS, default=list(FABRICS))
    ap.add_argument("--warm", type=int, default=3, help="decisions timed after the first")
    args = ap.parse_args(argv)
    print(f"{'k':>3} {'fabric':7} {'flows':>6} {'cold s':>7} {'warm s (median)':>16} {'link failed s':>14} "
          f"{'link back s':>12} "
          f"{'phases':>6} {'lambda':>7} {'/bound':>7} {'1-path':>7}  placement")
    for k in args.k:
        for kind in args.fabrics:
            r = run(k, kind, args.flows or k ** 3 // 4, args.warm)
            print(f"{k:>3} {kind:7} {r['flows']:>6} {r['cold_s']:>7.2f} {r['warm_median_s']:>16.3f} "
                  f"{r['after_failure_s']:>14.3f} {r['after_repair_s']:>12.3f} {r['phases']:>6} "
                  f"{r['lambda']:>7.4f} {r['certified']:>7.4f} {r['one_path_lambda']:>7.4f}  {r['placement']}",
                  flush=True)
            print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
