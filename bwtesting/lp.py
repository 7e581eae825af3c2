"""Exact reference for PMPT: the max-concurrent-flow LP (1)-(3) over the same
candidate paths, in PuLP with the HiGHS solver.

    maximise lambda
    s.t.  sum_p x_{j,p} >= lambda * W_j          for every ToR-pair group j
          sum_{(j,p) uses e} x_{j,p} <= c(e)     for every link e
          x >= 0
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable

import pulp

from apps.lessor.paths import PathDictionary
from apps.lessor.pmpt import LongFlow


@dataclass
class LpResult:
    lam: float
    build_seconds: float
    solve_seconds: float
    status: str
    path_flows: dict[tuple[str, str], list[tuple[tuple[str, ...], float]]]


def max_concurrent_flow_lp(flows: Iterable[LongFlow], paths: PathDictionary,
                           time_limit: float | None = None) -> LpResult:
    t0 = time.perf_counter()
    demand: dict[tuple[str, str], float] = {}
    for f in flows:
        if f.src_tor != f.dst_tor:
            key = (f.src_tor, f.dst_tor)
            demand[key] = demand.get(key, 0.0) + f.demand
    unit = 1e6  # Mb/s keeps coefficients near 1
    prob = pulp.LpProblem("max_concurrent_flow", pulp.LpMaximize)
    lam = prob.add_variable("lam", lowBound=0)
    prob += lam
    link_terms: dict[int, list] = {}
    variables: dict[tuple[str, str], list] = {}
    for j, key in enumerate(sorted(demand)):
        nodes, idx = paths.paths(*key)
        xs = [prob.add_variable(f"x_{j}_{p}", lowBound=0) for p in range(len(nodes))]
        variables[key] = list(zip(nodes, xs))
        prob += pulp.lpSum(xs) >= (demand[key] / unit) * lam, f"demand_{j}"
        for p, row in enumerate(idx):
            for e in row:
                link_terms.setdefault(int(e), []).append(xs[p])
    for e, terms in sorted(link_terms.items()):
        prob += pulp.lpSum(terms) <= paths.capacity[e] / unit, f"cap_{e}"
    t1 = time.perf_counter()
    solver = pulp.HiGHS(msg=False, timeLimit=time_limit)
    prob.solve(solver)
    t2 = time.perf_counter()
    status = pulp.LpStatus[prob.status]
    flows_out = {key: [(n, (x.value() or 0.0) * unit) for n, x in pairs if (x.value() or 0) > 0]
                 for key, pairs in variables.items()}
    return LpResult(float(lam.value() or 0.0), t1 - t0, t2 - t1, status, flows_out)


def one_path_optimum_milp(flows: Iterable[LongFlow], paths: PathDictionary,
                          time_limit: float = 120.0) -> tuple[float | None, str, float]:
    """The best lambda any one-path-per-flow routing can reach (a MILP: choose
    one candidate path per flow, minimise the largest link load relative to
    capacity; lambda = 1 / that). Returns (lambda or None, status, seconds)."""
    t0 = time.perf_counter()
    prob = pulp.LpProblem("one_path_min_congestion", pulp.LpMinimize)
    z = prob.add_variable("z", lowBound=0)
    prob += z
    link_terms: dict[int, list] = {}
    unit = 1e6
    for i, f in enumerate(flows):
        if f.src_tor == f.dst_tor:
            continue
        nodes, idx = paths.paths(f.src_tor, f.dst_tor)
        ys = [prob.add_variable(f"y_{i}_{p}", cat="Binary") for p in range(len(nodes))]
        prob += pulp.lpSum(ys) == 1, f"one_path_{i}"
        for p, row in enumerate(idx):
            for e in row:
                link_terms.setdefault(int(e), []).append((f.demand / unit) * ys[p])
    for e, terms in sorted(link_terms.items()):
        prob += pulp.lpSum(terms) <= (paths.capacity[e] / unit) * z, f"cap_{e}"
    prob.solve(pulp.HiGHS(msg=False, timeLimit=time_limit))
    status = pulp.LpStatus[prob.status]
    value = z.value()
    lam = 1.0 / value if value else None
    return lam, status, time.perf_counter() - t0
