"""Hedera (Al-Fares et al., NSDI 2010), the baseline LESSOR is compared with.

Demand estimation: a flow's *natural* demand is the rate it would get if only
the hosts' NICs limited it, under max-min fairness. Repeat until nothing
changes: each source splits what its converged flows leave equally among its
other flows (EST-SRC); each over-subscribed destination caps its
receiver-limited flows at an equal share of what the sender-limited ones
leave, and those flows converge (EST-DST). Demands are fractions of the NIC
rate.

Global First Fit: elephants (demand >= 10 % of the NIC rate) are taken in
turn; each goes to the first of its candidate paths whose every link still has
room for its demand, and that room is reserved. A flow no path can hold stays
on its ECMP path (``None``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

import numpy as np

ELEPHANT_FRACTION = 0.10
POLL_PERIOD_S = 5.0
_TOL = 1e-9


@dataclass
class _Est:
    src: Hashable
    dst: Hashable
    demand: float = 0.0
    converged: bool = False
    receiver_limited: bool = False


def estimate_demands(flows: Sequence[tuple[Hashable, Hashable]], max_rounds: int = 1000) -> list[float]:
    """Natural demands (fractions of the NIC rate) of flows given as
    (source host, destination host) pairs; duplicates are separate flows."""
    est = [_Est(s, d) for s, d in flows]
    by_src: dict[Hashable, list[_Est]] = {}
    by_dst: dict[Hashable, list[_Est]] = {}
    for e in est:
        by_src.setdefault(e.src, []).append(e)
        by_dst.setdefault(e.dst, []).append(e)
    for _ in range(max_rounds):
        before = [(e.demand, e.converged) for e in est]
        for fl in by_src.values():
            _est_src(fl)
        for fl in by_dst.values():
            _est_dst(fl)
        after = [(e.demand, e.converged) for e in est]
        if all(abs(a[0] - b[0]) <= _TOL and a[1] == b[1] for a, b in zip(before, after)):
            break
    return [e.demand for e in est]


def _est_src(flows: list[_Est]) -> None:
    converged = sum(f.demand for f in flows if f.converged)
    open_ = [f for f in flows if not f.converged]
    if open_:
        share = max(0.0, 1.0 - converged) / len(open_)
        for f in open_:
            f.demand = share


def _est_dst(flows: list[_Est]) -> None:
    total = sum(f.demand for f in flows)
    if total <= 1.0 + _TOL:
        return
    for f in flows:
        f.receiver_limited = True
    sender_limited = 0.0
    n_rl = len(flows)
    share = 1.0 / n_rl
    changed = True
    while changed and n_rl:
        changed = False
        n_rl = 0
        for f in flows:
            if not f.receiver_limited:
                continue
            if f.demand < share - _TOL:
                sender_limited += f.demand
                f.receiver_limited = False
                changed = True
            else:
                n_rl += 1
        if n_rl:
            share = (1.0 - sender_limited) / n_rl
    for f in flows:
        if f.receiver_limited:
            f.demand = share
            f.converged = True


def global_first_fit(demands_bps: Sequence[float], candidates: Sequence[np.ndarray],
                     capacity: np.ndarray, nic_bps: float) -> list[int | None]:
    """For each flow (in the given order), the index of the first candidate
    path (rows of link indices) with room for its demand, reserving it;
    None for mice (< 10 % of the NIC rate) and for flows no path can hold."""
    reserved = np.zeros(len(capacity))
    out: list[int | None] = []
    for demand, paths in zip(demands_bps, candidates):
        if demand < ELEPHANT_FRACTION * nic_bps:
            out.append(None)
            continue
        choice = None
        for p, links in enumerate(paths):
            if np.all(reserved[links] + demand <= capacity[links] * (1 + 1e-9)):
                reserved[links] += demand
                choice = p
                break
        out.append(choice)
    return out
