"""Max-min fair rates of flows on fixed paths (progressive filling).

The ideal that emulated results are compared with: every flow grows at the
same pace until a link on its path fills or it reaches its demand; frozen
flows keep their rate, the rest go on.
"""

from __future__ import annotations

import math
from typing import Hashable, Mapping, Sequence

from bwcommon.validate import finite_number

Link = tuple[Hashable, Hashable]


def _check_inputs(capacity: Mapping[Link, float], demand: Sequence[float], weights: Sequence[float] | None = None,
                  floors: Sequence[float] | None = None) -> None:
    """ValueError naming the first input a progressive filling cannot take:
    capacities finite and >= 0, demands >= 0 (infinity: no demand limit),
    weights finite and > 0, floors finite and >= 0. NaN is refused
    everywhere (it compares false with everything: a NaN capacity never
    fills, and the filling loop would never end)."""
    for link, c in capacity.items():
        if not (finite_number(c) and c >= 0):
            raise ValueError(f"link {link}: capacity {c!r} must be a finite number >= 0")
    for i, d in enumerate(demand):
        if isinstance(d, bool) or not isinstance(d, (int, float)) or math.isnan(d) or d < 0:
            raise ValueError(f"flow {i}: demand {d!r} must be a number >= 0 (inf: unlimited)")
    for i, w in enumerate(weights or ()):
        if not (finite_number(w) and w > 0):
            raise ValueError(f"flow {i}: weight {w!r} must be a finite number > 0")
    for i, f in enumerate(floors or ()):
        if not (finite_number(f) and f >= 0):
            raise ValueError(f"flow {i}: floor {f!r} must be a finite number >= 0")


def max_min_fair(paths: Sequence[Sequence[Link]], capacity: Mapping[Link, float],
                 demands: Sequence[float] | None = None) -> list[float]:
    """Rates (same unit as capacity) for flows with the given link paths."""
    n = len(paths)
    demand = list(demands) if demands is not None else [float("inf")] * n
    if len(demand) != n:
        raise ValueError(f"{n} paths but {len(demand)} demands")
    _check_inputs(capacity, demand)
    for i, path in enumerate(paths):
        for link in path:
            if link not in capacity:
                raise KeyError(f"flow {i}: link {link} has no capacity")
    rate = [0.0] * n
    active = {i for i in range(n) if demand[i] > 0 and paths[i]}
    for i in range(n):
        if not paths[i]:
            rate[i] = demand[i]  # local flow, no shared link: only its demand limits it
    residual = {link: float(c) for link, c in capacity.items()}
    while active:
        users: dict[Link, int] = {}
        for i in active:
            for link in paths[i]:
                users[link] = users.get(link, 0) + 1
        step = min(residual[link] / k for link, k in users.items())
        step = min(step, min(demand[i] - rate[i] for i in active))
        for i in active:
            rate[i] += step
        for link, k in users.items():
            residual[link] -= step * k
        eps = 1e-9 * max(1.0, max(capacity.values(), default=1.0))
        full = {link for link, k in users.items() if residual[link] <= eps}
        active = {i for i in active
                  if demand[i] - rate[i] > eps and not any(link in full for link in paths[i])}
    return rate


def weighted_max_min(paths: Sequence[Sequence[Link]], capacity: Mapping[Link, float], weights: Sequence[float],
                     floors: Sequence[float] | None = None, demands: Sequence[float] | None = None) -> list[float]:
    """Weighted max-min fair rates with guarantees: flow i gets
    a_i = min(d_i, max(B_i, w_i·x)) where x, one level per bottleneck,
    rises until a link on the flow's path is full (progressive filling,
    solved exactly between breakpoints). This is the allocation LRC's
    equilibrium (Eqs. 7, 28) must reach; it is written independently of
    LRC's code, to check it. Floors beyond what a link can carry are
    granted as they are (admission control is not this function's job)."""
    n = len(paths)
    floor = list(floors) if floors is not None else [0.0] * n
    demand = list(demands) if demands is not None else [float("inf")] * n
    if not (len(weights) == len(floor) == len(demand) == n):
        raise ValueError("paths, weights, floors and demands differ in length")
    _check_inputs(capacity, demand, weights, floor)
    for i in range(n):
        for link in paths[i]:
            if link not in capacity:
                raise KeyError(f"flow {i}: link {link} has no capacity")

    def a(i: int, x: float) -> float:
        return min(demand[i], max(floor[i], weights[i] * x))

    rate = [0.0] * n
    active = set(range(n))
    for i in range(n):
        if not paths[i]:
            rate[i] = demand[i] if demand[i] < float("inf") else floor[i]
            active.discard(i)
    while active:
        links = {link for i in active for link in paths[i]}
        frozen_load = {link: sum(rate[j] for j in range(n) if j not in active and link in paths[j]) for link in links}

        def load(link, x):
            return frozen_load[link] + sum(a(i, x) for i in active if link in paths[i])

        # the level at which each link fills (inf if it never does)
        def fill_level(link):
            users = [i for i in active if link in paths[i]]
            cap = capacity[link]
            points = sorted({0.0} | {floor[i] / weights[i] for i in users} | {demand[i] / weights[i] for i in users
                                                                              if demand[i] < float("inf")})
            if load(link, 0.0) >= cap:
                return 0.0
            prev = 0.0
            for p in points[1:]:
                if load(link, p) >= cap:
                    break
                prev = p
            else:
                slope = sum(weights[i] for i in users if demand[i] == float("inf"))   # past every floor
                if slope == 0:
                    return float("inf")
                return prev + (cap - load(link, prev)) / slope
            lo, hi = prev, p                       # linear between consecutive breakpoints
            return lo + (hi - lo) * (cap - load(link, lo)) / (load(link, hi) - load(link, lo))

        levels = {link: fill_level(link) for link in links}
        demand_levels = [demand[i] / weights[i] for i in active if demand[i] < float("inf")]
        x = min(list(levels.values()) + demand_levels + [float("inf")])
        if x == float("inf"):
            raise ValueError("a flow without demand limit crosses no link that fills")
        eps = 1e-12 * max(1.0, x)
        full = {link for link, lv in levels.items() if lv <= x + eps}
        done = {i for i in active if any(link in full for link in paths[i]) or demand[i] / weights[i] <= x + eps}
        for i in done:
            rate[i] = a(i, x)
        active -= done
    return rate
