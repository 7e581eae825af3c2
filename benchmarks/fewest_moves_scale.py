"""LESSOR's fewest moves (apps/lessor/moves.py) on large fat-trees, one
core (issue #34 §2: at k = 32 the move selection took 66 % of a placement's
26-138 s).

Long flows between random hosts of different pods; the installed routing
(``start``) and the new allocation (``target``) each a random equal-cost
path per flow -- the worst case for the moves, every flow differs with
probability 1 - 1/(k/2)^2; demands 0.05-0.6 of a link, one in ten with BG
(0.1 of a link); the goal the target's own lambda (as
``LessorLogic._keep_current`` asks), mu = 0.9, LESSOR's demand band. The
product's incremental rounds against the reference that recomputes every
round (bwtesting/moves_reference.py), the same answer asserted where both
run.

    python -m benchmarks.fewest_moves_scale [--k 16 32] [--flows N] [--reference-up-to N]
"""

from __future__ import annotations

import argparse
import math
import random
import time

from apps.lessor.logic import DEMAND_BAND
from apps.lessor.moves import fewest_moves
from bwtesting.moves_reference import reference_fewest_moves
from controller.network_view import NetworkView
from mininet_topos.builders import fattree


def instance(k: int, n: int, seed: int = 5) -> dict:
    view = NetworkView(fattree(k))
    rng = random.Random(seed)
    role = {v: view.graph.nodes[v].get("role") for v in view.graph.nodes}
    up = {v: [w for w in view.graph.successors(v) if role[w] in ("aggregation", "core")] for v in view.graph.nodes}
    hosts = list(view.hosts)
    pod = {h: view.graph.nodes[view.host_switch(h)[0]]["pod"] for h in hosts}

    def path(src: str, dst: str) -> tuple[str, ...]:
        e1, e2 = view.host_switch(src)[0], view.host_switch(dst)[0]
        a1 = rng.choice(up[e1])
        c = rng.choice(up[a1])
        (a2,) = [a for a in view.graph.successors(c) if view.graph.nodes[a].get("pod") == pod[dst]]
        return (src, e1, a1, c, a2, e2, dst)

    start, target, load, bg = {}, {}, {}, {}
    cap = view.capacity(*view.path_links(path(hosts[0], hosts[-1])[1:-1])[0])
    for i in range(n):
        while True:
            a, b = rng.sample(hosts, 2)
            if pod[a] != pod[b]:
                break
        start[i], target[i] = path(a, b), path(a, b)
        load[i] = rng.uniform(0.05, 0.6) * cap
        bg[i] = 0.1 * cap if rng.random() < 0.1 else 0.0
    sums: dict = {}
    for i, p in target.items():
        for link in view.path_links(p[1:-1]):
            sums[link] = sums.get(link, 0.0) + load[i]
    lam = min(view.capacity(*link) / s for link, s in sums.items())
    return {"args": (start, target, [[i] for i in start], load, bg, lambda link: view.capacity(*link),
                     lambda p: view.path_links(p[1:-1]), 0.9, lam * (1 - 1e-9), set()),
            "links": len(view.graph.edges), "hosts": len(hosts)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--flows", type=int, default=None, help="long flows (default: one per host)")
    ap.add_argument("--reference-up-to", type=int, default=2048,
                    help="run the reference implementation too up to this many flows")
    args = ap.parse_args(argv)
    print(f"{'k':>3} {'flows':>6} {'incremental s':>14} {'moved':>6} {'reference s':>12}  same")
    for k in args.k:
        n = args.flows or k ** 3 // 4
        inst = instance(k, n)
        t0 = time.process_time()
        got = fewest_moves(*inst["args"], band=DEMAND_BAND)
        took = time.process_time() - t0
        ref_s, same = math.nan, "-"
        if n <= args.reference_up_to:
            t0 = time.process_time()
            ref = reference_fewest_moves(*inst["args"], band=DEMAND_BAND)
            ref_s = time.process_time() - t0
            same = "yes" if ref == got else "NO"
        print(f"{k:>3} {n:>6} {took:>14.2f} {got[1]:>6} {ref_s:>12.2f}  {same}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
