"""One path per long flow, from PMPT's fractional solution.

0. Equal-demand flows on a Clos fabric (a permutation of elephants, say)
   are routed exactly by recursive edge colouring (:mod:`clos_coloring`).
1. Otherwise greedy, in minimum-remaining-time-first order (unknown sizes last, larger
   demand first): a path is *free* for a flow if every link stays within the
   target utilisation T = max((1 + eps) / lambda_frac, F) once the flow is
   added, F being the floor no one-path routing goes below (the largest
   flow alone on its widest path, :func:`integral_floor`).
   Among free paths the flow takes the one with the most fractional
   bandwidth left in its group's path dictionary (b - Delta_b, ties by path
   order); with none free, the path with the lowest resulting maximum
   utilisation.
2. Negotiated congestion (``_kernels.negotiate``, PathFinder-style): while a
   link is above T, the flows on over-full links are rerouted to their
   cheapest path under a growing present-congestion penalty and an
   accumulated history cost; the best routing seen is kept. Single-flow
   moves cannot fix a permutation on a Clos fabric (a swap at one layer
   collides at the next); negotiation finds those exchanges.
3. Restarts of 1-2 with the groups taken in seeded random orders (MRTF kept
   within each group) while the target is missed, as many as
   flows x restarts <= RESTART_WORK allows; the best routing is kept.
4. If the target is still missed, a bottleneck local search
   (``_kernels.bottleneck_search``): move a flow off a link at the peak
   utilisation onto a path below it, or exchange it with one flow that
   frees the way, until neither exists.

Every flow keeps exactly one path (no splitting). Its bandwidth
b_f = min(B_f, B_f * lambda_int) is what the routing can give every flow at
once. Deterministic: fixed orders, ties by index.
"""

from __future__ import annotations

import math
from typing import Hashable

import numpy as np

from apps.lessor import clos_coloring

NEGOTIATION_ITERATIONS = 1000
# PathFinder costs: present-congestion factor, its growth per iteration, history
# increment per unit overflow (measured: fewest iterations to a perfect
# routing of random permutations on fat-trees k=8, 16).
PRESENT0, PRESENT_GROWTH, HISTORY_STEP = 0.5, 1.05, 0.1
NEGOTIATION_STALL = 100  # rounds without a better routing before giving up
MAX_RESTARTS = 16       # attempts of greedy + negotiation (other group orders)...
RESTART_WORK = 1024      # ...as many as fit flows x attempts <= this (128 flows: 8; 1024: 1)
BOTTLENECK_ROUNDS = 500  # bottleneck moves/exchanges after negotiation (each lowers the peak or its count)


def place(groups, order, fractional: list[np.ndarray], group_start: np.ndarray,
          path_links: np.ndarray, path_hops: np.ndarray, cap: np.ndarray,
          target_util: float, view=None) -> tuple[dict[Hashable, int], dict[Hashable, float], float, str]:
    """Returns (flow -> path index within its group, flow -> b_f, lambda_int,
    method used). ``order`` lists (group index, flow)."""
    safe_cap = np.where(cap > 0, cap, 1.0)
    # no one-path routing does better than its largest flow alone on its widest path: aiming lower only
    # spends the negotiation and the bottleneck search on a peak they cannot lower (a 1 Gb/s flow on
    # 1 Gb/s links, at k = 32: 25 s for nothing)
    target_util = max(target_util, integral_floor(groups, order))
    if view is not None:
        exact = clos_coloring.route(view, groups, order, cap)
        if exact is not None:
            return (*_finish(groups, order, exact, safe_cap), "clos colouring")
    best = None
    restarts = min(MAX_RESTARTS, max(1, RESTART_WORK // max(1, len(order))))
    for attempt in range(restarts):
        trial = order if attempt == 0 else _group_shuffle(order, len(groups), attempt)
        paths, iterations = _greedy_and_negotiate(groups, trial, fractional, group_start, path_links,
                                                  path_hops, safe_cap, target_util)
        done = _finish(groups, order, paths, safe_cap)
        if best is None or done[2] > best[0][2] + 1e-12:
            best = (done, iterations, attempt)
        if done[2] * target_util >= 1 - 1e-9:       # every link within the target: good enough
            break
    (paths, rates, lam_int), iterations, attempt = best
    method = f"greedy + {iterations} negotiation rounds" if iterations else "greedy"
    if attempt:
        method += f" (group order {attempt})"
    return paths, rates, lam_int, method


def integral_floor(groups, order) -> float:
    """A lower bound on any one-path routing's peak utilisation: the
    largest flow's demand over the widest bottleneck among its paths."""
    widest: dict[int, float] = {}
    for gi, _ in order:
        if gi not in widest:
            widest[gi] = float(groups[gi].bottleneck.max())
    return max((f.demand / widest[gi] for gi, f in order), default=0.0)


def _group_shuffle(order, n_groups: int, seed: int):
    """The same flows, groups taken in a seeded random order (MRTF order
    kept within each group): a restart for the greedy + negotiation."""
    import random
    rank = list(range(n_groups))
    random.Random(seed).shuffle(rank)
    return sorted(order, key=lambda t: rank[t[0]])     # stable: MRTF within a group


def _finish(groups, order, paths: dict[Hashable, int], safe_cap: np.ndarray):
    load = np.zeros(len(safe_cap))
    for gi, f in order:
        load[groups[gi].idx[paths[f.key]]] += f.demand
    busy = load > 1e-9
    lam_int = float((safe_cap[busy] / load[busy]).min()) if busy.any() else math.inf
    rates = {f.key: f.demand * min(1.0, lam_int) for _, f in order}
    return paths, rates, lam_int


def _greedy_and_negotiate(groups, order, fractional, group_start, path_links, path_hops,
                          safe_cap, target_util) -> tuple[dict[Hashable, int], int]:
    from apps.lessor import _kernels as K

    limit = target_util * safe_cap
    load = np.zeros(len(safe_cap))
    n = len(order)
    flow_group = np.fromiter((gi for gi, _ in order), dtype=np.int64, count=n)
    flow_demand = np.fromiter((f.demand for _, f in order), dtype=float, count=n)
    flow_path = np.empty(n, dtype=np.int64)
    K.greedy_place(flow_group, flow_demand, group_start, path_links, path_hops,
                   np.concatenate(fractional) if fractional else np.zeros(0), limit, safe_cap, load, flow_path)
    iterations = 0
    if (load > limit * (1 + 1e-9)).any():
        iterations, _ = K.negotiate(flow_group, flow_demand, flow_path, group_start, path_links,
                                    path_hops, safe_cap, limit, load, NEGOTIATION_ITERATIONS,
                                    PRESENT0, PRESENT_GROWTH, HISTORY_STEP, NEGOTIATION_STALL)
        # negotiate keeps its best routing but leaves ``load`` as of its last round
        load = K.flow_load(flow_path, flow_demand, path_links, path_hops, len(safe_cap))
        iterations += K.bottleneck_search(flow_group, flow_demand, flow_path, group_start, path_links,
                                          path_hops, safe_cap, load, BOTTLENECK_ROUNDS)
    paths = {f.key: int(flow_path[i] - group_start[gi]) for i, (gi, f) in enumerate(order)}
    return paths, iterations
