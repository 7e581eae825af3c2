"""PMPT: performance-oriented multipath transmission (LESSOR §4.3).

Problem (LP (1)-(3)): long flows are grouped per ToR pair j = (s, d) with
demand W_j (the sum of the flows' demands B_f); maximise lambda such that
every group routes at least lambda * W_j over its candidate paths and every
link carries at most its capacity c(e). This is the maximum concurrent flow
problem; we solve it with the Garg-Koenemann primal-dual FPTAS in
Fleischer's form:

    lengths l(e) = delta / c(e),  delta = (m / (1 - eps)) ** (-1 / eps)
    repeat phases until D(l) = sum_e l(e) c(e) >= 1:
        for each group j, route W_j in steps: take an (1+eps)-approximately
        lightest candidate path p, send u = min(remaining, min_{e in p} c(e)),
        and set l(e) <- l(e) * (1 + eps * u / c(e)) on every e in p.

Each phase routes every group's full demand, so after t phases group j has
routed t * W_j; scaling all flow by the largest link congestion gives a
feasible primal with lambda_primal = t / congestion. Any lengths give the
dual bound lambda* <= D(l) / alpha(l), alpha(l) = sum_j W_j dist_j(l).

How this departs from a literal Garg-Koenemann run, and why:
- Stopping: besides D(l) >= 1 we stop as soon as the best primal is
  within a factor (1 - eps) of the best dual bound (a certified gap), or
  after ``max_phases``. The certificate is exact, so the returned lambda is
  at least (1 - eps) * lambda* whenever it stops that way.
- The first dual bound is the ToR cut bound below (lambda* <= 1 once
  scaled), not infinity: on datacenter fabrics it is usually tight, and
  the length-based bound D(l) / alpha(l) takes hundreds of phases to come
  down to it (measured at k = 16: the primal was within 2 % of the cut
  bound after 25 phases; the length bound reached 1.05 x after 500).
- The first primal is every group split evenly over its candidate paths.
  On a Clos of equal links whose ToRs' demands fit their links it meets
  the cut bound exactly (each link carries at most its ToR's demand over
  its fan-out), so it is certified with no phase at all.
- The primal after t phases is the better of all t phases' flow and the
  flow of the phases since the last power of two at or below t / 2 (the
  early phases route on lengths that have not learnt the fabric yet).
  Either routes a whole number of phases of every demand and is scaled by
  its own measured congestion (instead of log_{1+eps}(1/delta)): always
  feasible, never worse.
- Demands are pre-scaled by a cut bound (ToR uplink/downlink capacity over
  the ToR's demand) so that lambda* <= 1 holds for the scaled instance, as
  the Garg-Koenemann analysis assumes; results are reported unscaled.
- Lengths are stored divided by delta and renormalised when they grow large:
  with small eps, delta underflows double precision otherwise.
- Approximately lightest paths come from the path dictionary: each group
  keeps its last lightest path and the length it had then (a lower bound on
  today's minimum, as lengths only grow); the path is reused while its
  current length is within (1 + eps) of that bound (Fleischer's rule), so
  candidate paths are not re-scanned on every step.
- Paths are the ToR pair's equal-cost candidates (PathDictionary); in a
  fat-tree that is a choice of core switch (the upward half), the rest
  follows.
- The paper's LESSOR text (its Algorithm 2) was not available to us; the
  description above is the algorithm as the issue and the primal-dual
  literature define it.

One path per flow (:mod:`apps.lessor.placement`): flows are placed in
minimum-remaining-time-first order on a path that keeps every link within
(1 + eps) / lambda of the fractional optimum, preferring the path with the
most fractional bandwidth left in the group's path dictionary (b - Delta_b);
congestion left over is negotiated away (PathFinder-style rip-up and
reroute). No flow is split; each gets b_f = min(B_f, lambda_int * B_f).
"""

from __future__ import annotations

import gc
import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Hashable, Iterable, Mapping

import numpy as np

from apps.lessor.paths import PathDictionary
from apps.lessor.placement import place
from apps.lessor.settings import DEFAULT_EPSILON
from bwcommon.validate import finite_number

# A ToR pair whose long flows add up to less than this (bits/s) has nothing
# to place; tinier demands would only overflow the scaling (a subnormal
# demand made the cut bound infinite).
MIN_DEMAND_BPS = 1.0
RESCALE_ABOVE = 1e150    # the FPTAS's lengths are divided down (log_scale keeps D(l)) above this, far below overflow
MAX_DEMAND_BPS = 1e15   # 1 Pb/s: a larger demand is a unit mistake, and sums of such overflow


@dataclass(frozen=True)
class LongFlow:
    key: Hashable
    src_tor: str
    dst_tor: str
    demand: float  # B_f, bits/s
    remaining_bytes: float | None = None
    # bits/s of the guaranteed class (BG) this flow carries: BG flows are
    # placed first, each link's BG sum within mu x C (:func:`place_bg`)
    bg: float = 0.0
    # flows that must share one path: the BG of one VM to one ToR, whose
    # split among its flows the fabric cannot know (None: the flow alone)
    bundle: Hashable = None
    # the switches from src_tor to dst_tor the flow is placed on, not chosen
    # here: a BG flow's default route (apps.lessor.bg_routes: the switches
    # send its BG that way whatever LESSOR installs), its BG counted on
    # every link; or a flow LESSOR will not move (LessorLogic.host_limited),
    # its demand counted on every link, the other flows placed around it
    fixed_path: tuple[str, ...] | None = None

    @property
    def remaining_time(self) -> float:
        if self.remaining_bytes is None or self.demand <= 0:
            return math.inf
        return self.remaining_bytes * 8 / self.demand


@dataclass
class Allocation:
    lam: float                    # lambda of the fractional solution (feasible)
    upper_bound: float            # dual bound: lambda* <= upper_bound
    group_paths: Mapping[tuple[str, str], list[tuple[tuple[str, ...], float]]]  # fractional bits/s
    flow_path: dict[Hashable, tuple[str, ...]]
    flow_rate: dict[Hashable, float]  # b_f
    integral_lam: float           # lambda of the one-path-per-flow routing
    phases: int = 0
    steps: int = 0
    seconds: float = 0.0
    stopped_by: str = ""
    unroutable: list[Hashable] = field(default_factory=list)
    placement: str = ""
    bg_load: dict[tuple[str, str], float] = field(default_factory=dict)   # link -> BG placed on it, bits/s
    bg_over: list[tuple[str, str]] = field(default_factory=list)   # links whose BG could not be kept within mu x C


class _FractionalPaths(Mapping):
    """ToR pair -> [(path, bits/s)] of the fractional solution, built per
    pair when asked for (the controller never asks; at k = 32 building all
    of them took longer than the rest of a decision)."""

    def __init__(self, groups: list["_Group"], congestion: float):
        self._groups = {g.key: g for g in groups}
        self._congestion = congestion

    def __getitem__(self, key):
        g = self._groups[key]
        nz = np.flatnonzero(g.x > 0)
        return [(g.nodes[p], float(v)) for p, v in zip(nz, g.x[nz] / self._congestion)]

    def __iter__(self):
        return iter(self._groups)

    def __len__(self) -> int:
        return len(self._groups)


@dataclass
class _Group:
    key: tuple[str, str]
    flows: list[LongFlow]
    demand: float
    nodes: list[tuple[str, ...]]
    idx: np.ndarray               # (n_paths, hops) link indices
    bottleneck: np.ndarray        # per path, min capacity
    x: np.ndarray                 # routed (scaled units) per path


def _groups(flows: Iterable[LongFlow], paths: PathDictionary) -> tuple[list[_Group], list[LongFlow], list]:
    by_key: dict[tuple[str, str], list[LongFlow]] = {}
    for f in flows:
        by_key.setdefault((f.src_tor, f.dst_tor), []).append(f)
    groups, local, unroutable = [], [], []
    for key in sorted(by_key):
        fl = by_key[key]
        if key[0] == key[1]:
            local.extend(fl)
            continue
        nodes, idx = paths.paths(*key)
        demand = sum(f.demand for f in fl)
        if len(nodes) == 0:
            unroutable.extend(f.key for f in fl)
            continue
        if demand < MIN_DEMAND_BPS:
            continue
        groups.append(_Group(key, fl, demand, nodes, idx, np.zeros(0), np.zeros(0)))   # arrays: _flatten
    return groups, local, unroutable


def _cut_bound(groups: list[_Group], paths: PathDictionary, cap: np.ndarray) -> float:
    """Upper bound on lambda*: each ToR's demand must leave (enter) through
    its up (down) links."""
    out_dem: dict[str, float] = {}
    in_dem: dict[str, float] = {}
    for g in groups:
        out_dem[g.key[0]] = out_dem.get(g.key[0], 0.0) + g.demand
        in_dem[g.key[1]] = in_dem.get(g.key[1], 0.0) + g.demand
    tail, head, alive = paths.link_ends()
    live = np.where(alive, cap, 0.0)
    out_cap = np.bincount(tail, weights=live, minlength=len(paths.nodes))
    in_cap = np.bincount(head, weights=live, minlength=len(paths.nodes))
    bound = math.inf
    for tor, d in out_dem.items():
        bound = min(bound, float(out_cap[paths.node_id[tor]]) / d)
    for tor, d in in_dem.items():
        bound = min(bound, float(in_cap[paths.node_id[tor]]) / d)
    return bound


def _flatten(groups: list[_Group], cap: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                              np.ndarray]:
    """Concatenate the groups' paths for the compiled kernels; each group's
    ``x`` and ``bottleneck`` become views into the flat per-path arrays
    (returned: links, hops, group starts, flow, bottleneck)."""
    counts = np.array([g.idx.shape[0] for g in groups], dtype=np.int64)
    widths = np.array([g.idx.shape[1] for g in groups], dtype=np.int32)     # path_hops: see paths.PATH_ROW
    group_start = np.zeros(len(groups) + 1, dtype=np.int64)
    np.cumsum(counts, out=group_start[1:])
    hops = int(widths.max())
    # one copy when every group's paths are as long (a fat-tree's inter-pod pairs); else padded per group
    path_links = np.concatenate([g.idx if g.idx.shape[1] == hops else
                                 np.pad(g.idx, ((0, 0), (0, hops - g.idx.shape[1]))) for g in groups])
    path_hops = np.repeat(widths, counts)
    x = np.zeros(int(group_start[-1]))
    for j, g in enumerate(groups):
        g.x = x[group_start[j]:group_start[j + 1]]
    from apps.lessor import _kernels as K
    bottleneck = K.path_bottleneck(cap, path_links, path_hops)
    for j, g in enumerate(groups):
        g.bottleneck = bottleneck[group_start[j]:group_start[j + 1]]
    return path_links, path_hops, group_start, x, bottleneck


def check_epsilon(epsilon: float) -> None:
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not 0 < epsilon < 0.5:
        raise ValueError(f"epsilon={epsilon!r}: must be a number in (0, 0.5)")


def check_inputs(flows: list[LongFlow], paths: PathDictionary) -> None:
    """PMPT's inputs, refused by name: every demand a finite number >= 0,
    remaining sizes finite and >= 0, flow keys unique (two flows with one
    key would be merged silently), link capacities finite and >= 0 (a zero
    capacity makes a link unusable; a negative one is an error)."""
    seen: set = set()
    switches = paths.switches
    for f in flows:
        if f.key in seen:
            raise ValueError(f"flow {f.key!r}: duplicate flow key")
        seen.add(f.key)
        for end in (f.src_tor, f.dst_tor):
            if not (isinstance(end, str) and end in switches):
                raise ValueError(f"flow {f.key!r}: ToR {end!r} is not a switch of the fabric")
        if isinstance(f.demand, bool) or not isinstance(f.demand, (int, float)) or not \
                (math.isfinite(f.demand) and 0 <= f.demand <= MAX_DEMAND_BPS):
            raise ValueError(f"flow {f.key!r}: demand {f.demand!r} must be a finite number in [0, {MAX_DEMAND_BPS:g}]")
        if f.remaining_bytes is not None and not (isinstance(f.remaining_bytes, (int, float))
                                                  and math.isfinite(f.remaining_bytes)
                                                  and f.remaining_bytes >= 0):
            raise ValueError(f"flow {f.key!r}: remaining_bytes {f.remaining_bytes!r} must be finite and >= 0")
        if not (finite_number(f.bg) and 0 <= f.bg <= MAX_DEMAND_BPS):
            raise ValueError(f"flow {f.key!r}: bg {f.bg!r} must be a finite number in [0, {MAX_DEMAND_BPS:g}]")
        if f.fixed_path is not None:
            p = f.fixed_path
            if not isinstance(p, tuple) or not p or p[0] != f.src_tor or p[-1] != f.dst_tor or \
                    any((a, b) not in paths.index for a, b in zip(p, p[1:])):
                raise ValueError(f"flow {f.key!r}: fixed path {p!r} is not a path of switch links from "
                                 f"{f.src_tor} to {f.dst_tor}")
    tors: dict = {}
    for f in flows:
        if f.bundle is not None and tors.setdefault(f.bundle, (f.src_tor, f.dst_tor)) != (f.src_tor, f.dst_tor):
            raise ValueError(f"flow {f.key!r}: bundle {f.bundle!r} joins ToR pairs {tors[f.bundle]} and "
                             f"{(f.src_tor, f.dst_tor)}: a bundle shares one path")
    cap = paths.capacity
    bad = np.flatnonzero(~np.isfinite(cap) | (cap < 0))
    if len(bad):
        u, v = paths.links[int(bad[0])]
        raise ValueError(f"link {u}->{v}: capacity {cap[bad[0]]!r} must be finite and >= 0")


def check_mu(mu: float) -> None:
    if not (finite_number(mu) and 0 < mu <= 1):
        raise ValueError(f"mu={mu!r}: must be a number in (0, 1]")


def pmpt(flows: Iterable[LongFlow], paths: PathDictionary, epsilon: float = DEFAULT_EPSILON,
         max_phases: int = 5000, mu: float = 1.0) -> Allocation:
    """Groups with no usable path (a ToR cut off by failures, zero-capacity
    links) are reported in ``unroutable``; every other flow is still placed.

    Flows that carry BG (``bg`` > 0) are placed first, on their own, so that
    no link's BG sum exceeds ``mu`` x its capacity where that is possible
    (:func:`place_bg`): the strict-priority queues give BG whatever it
    sends, so a link whose BG exceeds it misses guarantees whatever the
    rest does; each gets b_f = bg. The other flows (WC subflows, flows of
    VMs without guarantees) are then placed by the FPTAS and
    :func:`apps.lessor.placement.place` on what BG leaves of every link
    (at least ``RESIDUAL_FLOOR`` of it: WC keeps a candidate path); the
    lambdas reported are theirs on that residual capacity.

    Python's cyclic collector is paused for the decision (and restored as
    it was, however the call ends): the decision allocates ~10^5 objects
    and no cycles, and the full collections they trigger rescan the
    controller's whole heap -- 0.3-0.4 s of a 1.0-1.4 s decision at k = 32
    right after a link failure (benchmarks/pmpt_scale.py)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _decide(flows, paths, epsilon, max_phases, mu)
    finally:
        if enabled:
            gc.enable()


def _decide(flows: Iterable[LongFlow], paths: PathDictionary, epsilon: float, max_phases: int,
            mu: float) -> Allocation:
    check_epsilon(epsilon)
    check_mu(mu)
    if isinstance(max_phases, bool) or not isinstance(max_phases, int) or max_phases < 1:
        raise ValueError(f"max_phases={max_phases!r}: must be an integer >= 1")
    t_start = time.perf_counter()
    flows = list(flows)
    check_inputs(flows, paths)
    # flows kept where they are (not BG): their demands on their paths, the rest placed around them
    kept = {f.key: f for f in flows if not f.bg > 0 and f.src_tor != f.dst_tor and _fixed_links(f, paths)}
    kept_load = np.zeros(len(paths.capacity))
    for f in kept.values():
        kept_load[_fixed_links(f, paths)] += f.demand
    bg = [f for f in flows if f.bg > 0 and f.src_tor != f.dst_tor]
    if not bg:
        if not kept:
            return _place_all(flows, paths, paths.capacity, epsilon, max_phases, t_start)
        residual = np.maximum(paths.capacity - kept_load, RESIDUAL_FLOOR * paths.capacity)
        alloc = _place_all([f for f in flows if f.key not in kept], paths, residual, epsilon, max_phases, t_start)
        return _with_kept(alloc, kept, t_start)
    # BG on its default route goes there; the rest of BG is placed around it
    preload = np.zeros(len(paths.capacity))
    fixed = {}
    for f in bg:
        links = _fixed_links(f, paths)
        if links:
            fixed[f.key] = f.fixed_path
            preload[links] += f.bg
    bg_path, bg_load, bg_unroutable = place_bg([f for f in bg if f.key not in fixed], paths, mu, preload)
    bg_path.update(fixed)
    residual = np.maximum(paths.capacity - bg_load - kept_load, RESIDUAL_FLOOR * paths.capacity)
    alloc = _place_all([f for f in flows if f.key not in bg_path and f.key not in bg_unroutable
                        and f.key not in kept], paths, residual, epsilon, max_phases, t_start)
    _with_kept(alloc, kept, t_start)
    for f in bg:
        if f.key in bg_path:
            alloc.flow_path[f.key] = bg_path[f.key]
            alloc.flow_rate[f.key] = f.bg
    alloc.unroutable = sorted([*alloc.unroutable, *bg_unroutable], key=str)
    alloc.bg_load = {paths.links[i]: float(bg_load[i]) for i in np.flatnonzero(bg_load > 0)}
    alloc.bg_over = [paths.links[i] for i in np.flatnonzero(bg_load > mu * paths.capacity * (1 + 1e-9))]
    alloc.placement = f"BG first ({len(bg_path)} flows); {alloc.placement or 'no other flows'}"
    alloc.seconds = time.perf_counter() - t_start
    return alloc


def _fixed_links(f: LongFlow, paths: PathDictionary) -> list[int]:
    """The link indices of a flow's fixed path if every link is up; else (no
    fixed path, or one that is down: the flow is placed here) none."""
    if f.fixed_path is None:
        return []
    links = [paths.index[lk] for lk in zip(f.fixed_path, f.fixed_path[1:])]
    return links if all(paths.up(i) for i in links) else []


def _with_kept(alloc: Allocation, kept: dict[Hashable, LongFlow], t_start: float) -> Allocation:
    """The allocation with the kept flows on their fixed paths at their demands."""
    for key, f in kept.items():
        alloc.flow_path[key] = f.fixed_path
        alloc.flow_rate[key] = f.demand
    if kept:
        alloc.placement = f"{len(kept)} flows kept; {alloc.placement or 'no other flows'}"
    alloc.seconds = time.perf_counter() - t_start
    return alloc


RESIDUAL_FLOOR = 0.05   # of a link's capacity, left to the other flows' placement however much BG it carries
BG_REPAIR_ROUNDS = 200  # moves of BG flows off links above mu x C after the greedy


def place_bg(flows: list[LongFlow], paths: PathDictionary, mu: float,
             preload: np.ndarray | None = None) -> tuple[dict[Hashable, tuple[str, ...]], np.ndarray, list[Hashable]]:
    """One path per BG flow -- one per bundle: the flows of a bundle share
    it, their BG summed -- such that every link's BG sum stays within
    ``mu`` x its capacity where the candidate paths allow it. Returns
    (flow -> ToR path, BG per link in bits/s, flows with no path).

    Largest BG first, each on the candidate path whose busiest link would
    be least full relative to mu x C (ties: least total, then path order):
    the longest-processing-time rule of bin packing, which keeps two
    guarantees that fit a ToR's uplinks together but not one uplink on
    different uplinks. Then, while a link is above mu x C, the step that
    lowers the total BG above mu x C the most is taken (at most
    ``BG_REPAIR_ROUNDS``): an item on such a link moves to another of its
    paths, or exchanges paths with an item of the same ToR pair (what
    largest-first leaves over -- 3, 3, 2, 2, 2 on two links of 6 -- a single
    move cannot undo). Deterministic: ties by key. ``preload``: BG already
    on each link (flows on their default routes), counted, never moved."""
    limit = mu * paths.capacity
    # (not mutated: the divisor only keeps 0/0 away -- a down link's 1 b/s, or 2, leaves it the busiest by
    # far; links of 1 b/s or less, where "> 0" and "> 1" part, carry nothing a fabric sends)
    safe = np.where(limit > 0, limit, 1.0)  # pragma: no mutate
    load = np.zeros(len(limit)) if preload is None else np.array(preload, dtype=float)
    members: dict[Hashable, list[LongFlow]] = {}
    for f in flows:
        # (True, bundle) or (False, flow): a bundle and a flow never share an item, whatever their names
        members.setdefault((True, f.bundle) if f.bundle is not None else (False, f.key), []).append(f)
    items = [_Item(k, fl[0].src_tor, fl[0].dst_tor, sum(f.bg for f in fl)) for k, fl in members.items()]
    chosen: dict[Hashable, int] = {}
    cand: dict[Hashable, tuple[list, np.ndarray]] = {}
    unroutable = []
    ordered = sorted(items, key=lambda it: (-it.bg, str(it.key)))
    for it in ordered:
        nodes, idx = paths.paths(it.src_tor, it.dst_tor)
        if len(nodes) == 0:
            unroutable.extend(f.key for f in members[it.key])
            continue
        cand[it.key] = (nodes, idx)
        util = (load[idx] + it.bg) / safe[idx]
        worst, total = util.max(axis=1), util.sum(axis=1)
        p = min(range(len(nodes)), key=lambda q: (worst[q], total[q], q))
        chosen[it.key] = p
        load[idx[p]] += it.bg

    def shifted(changes) -> np.ndarray:
        """The BG per link once each (item, path index) of ``changes`` has moved."""
        after = load.copy()
        for it, q in changes:
            idx = cand[it.key][1]
            after[idx[chosen[it.key]]] -= it.bg
            after[idx[q]] += it.bg
        return after

    def overflow(ld: np.ndarray) -> float:
        # (not mutated: a floor of 1.0 for 0.0 adds 1 b/s per link to both sides of every comparison)
        return float(np.maximum(ld - limit, 0.0).sum())  # pragma: no mutate

    placed = [it for it in ordered if it.key in chosen]
    for _ in range(BG_REPAIR_ROUNDS):
        # (not mutated: a link exactly at mu x C adds no overflow, so whether it counts as over changes no
        # trial's outcome -- the repair stops on overflow(), which is 0 there)
        over = load > limit * (1 + 1e-9)  # pragma: no mutate
        if not over.any():
            break
        trials = []
        for it in placed:
            nodes, idx = cand[it.key]
            if not over[idx[chosen[it.key]]].any():
                continue
            # a move: the item alone to another of its paths
            trials += [((it, q),) for q in range(len(nodes)) if q != chosen[it.key]]
            # an exchange: the item and one of its ToR pair on another path swap paths
            trials += [((it, chosen[other.key]), (other, chosen[it.key])) for other in placed
                       if (other.src_tor, other.dst_tor) == (it.src_tor, it.dst_tor)
                       and chosen[other.key] != chosen[it.key] and other.bg != it.bg]
        now = overflow(load)
        best = min(((overflow(shifted(t)), n, t) for n, t in enumerate(trials)), default=None)  # n: unique
        # (not mutated: ">" and ">=" part only when the best trial's overflow is exactly now x (1 - 1e-9):
        # a move that gains one part in 10^9, taken or not)
        if best is None or best[0] >= now * (1 - 1e-9):  # pragma: no mutate
            break
        load = shifted(best[2])
        for it, q in best[2]:
            chosen[it.key] = q
    return ({f.key: cand[k][0][p] for k, p in chosen.items() for f in members[k]}, load, unroutable)


@dataclass(frozen=True)
class _Item:
    """What place_bg places: a flow, or a bundle of flows on one path."""
    key: Hashable
    src_tor: str
    dst_tor: str
    bg: float


def _place_all(flows: list[LongFlow], paths: PathDictionary, cap: np.ndarray, epsilon: float,
               max_phases: int, t_start: float) -> Allocation:
    """The FPTAS and the one-path placement of ``flows`` on capacities ``cap``."""
    groups, local, unroutable = _groups(flows, paths)
    flow_path: dict[Hashable, tuple[str, ...]] = {f.key: (f.src_tor,) for f in local}
    flow_rate: dict[Hashable, float] = {f.key: f.demand for f in local}
    if not groups:
        return Allocation(math.inf, math.inf, {}, flow_path, flow_rate, math.inf,
                          seconds=time.perf_counter() - t_start, stopped_by="no fabric demand",
                          unroutable=unroutable)
    path_links, path_hops, group_start, x, bottleneck = _flatten(groups, cap)
    from apps.lessor import _kernels as K
    used = np.flatnonzero(K.links_crossed(path_links, path_hops, len(cap)))   # the links some path crosses
    scale = _cut_bound(groups, paths, cap)
    if not scale > 0:  # every group has a path of positive capacity, so this cannot happen
        raise AssertionError(f"PMPT: cut bound {scale} for groups that all have paths")
    demand = np.array([g.demand * scale for g in groups])  # scaled: lambda* <= 1
    ln_inv_delta = math.log(len(used) / (1 - epsilon)) / epsilon
    used_cap = cap[used]
    # the first primal: every group split evenly over its paths (exact on a Clos of equal links carrying
    # demands within the ToRs' capacity: then it meets the cut bound and no phase runs)
    x[:] = np.repeat(demand / np.diff(group_start), np.diff(group_start))
    load = _path_load(x, path_links, path_hops, len(cap))
    lam_scaled = 1.0 / float((load[used] / used_cap).max())
    best_ub = 1.0                       # the cut bound, scaled
    phases = steps = 0
    stopped_by = "certified gap"
    if lam_scaled < (1 - epsilon) * best_ub:
        lam_scaled, x[:], load, phases, steps, best_ub, stopped_by = _fptas(
            demand, group_start, path_links, path_hops, bottleneck, cap, used, epsilon, max_phases,
            ln_inv_delta, (lam_scaled, x.copy(), load))
    congestion = float((load[used] / used_cap).max())
    group_paths = _FractionalPaths(groups, congestion)
    lam = lam_scaled * scale
    order = sorted(((gi, f) for gi, g in enumerate(groups) for f in g.flows), key=lambda t: mrtf_key(t[1]))
    paths_of, rate_of, lam_int, method = place(
        groups, order, [g.x / congestion for g in groups], group_start, path_links, path_hops, cap,
        target_util=(1 + epsilon) / lam, view=paths.view)
    for g in groups:
        for f in g.flows:
            flow_path[f.key] = g.nodes[paths_of[f.key]]
            flow_rate[f.key] = rate_of[f.key]
    return Allocation(lam, best_ub * scale, group_paths, flow_path, flow_rate, lam_int,
                      phases, steps, time.perf_counter() - t_start, stopped_by, unroutable, method)


def _path_load(x: np.ndarray, path_links: np.ndarray, path_hops: np.ndarray, n_links: int) -> np.ndarray:
    """Load per link of flow ``x`` per path."""
    from apps.lessor import _kernels as K
    return K.flow_load(np.arange(len(x)), np.ascontiguousarray(x, dtype=float), path_links, path_hops, n_links)


# Primal windows: the flow of the phases since the last power of two at or below half the phases run
# (early phases route on lengths that have not yet learnt the fabric; the later ones alone are a
# better-balanced flow, as feasible once scaled by their own congestion).
def _fptas(demand, group_start, path_links, path_hops, bottleneck, cap, used, epsilon, max_phases,
           ln_inv_delta, first):
    """Garg-Koenemann phases (Fleischer's form) until the best primal --
    ``first`` (lambda, x, load), every phase's flow so far, or a window of
    the later phases -- is certified within (1 - eps) of the best dual
    bound, D(l) >= 1, or ``max_phases``. Returns (lambda, x, load, phases,
    steps, best dual bound, why it stopped); lambda, x and load scaled as
    ``demand`` is, x and load not yet divided by the congestion."""
    from apps.lessor import _kernels as K

    used_cap = cap[used]
    length = np.zeros(len(cap))
    length[used] = 1.0 / cap[used]      # l(e) / delta
    log_scale = 0.0                     # true l(e) = length * delta * exp(log_scale)
    load = np.zeros(len(cap))
    x = np.zeros(len(path_hops))
    cache_path = np.full(len(demand), -1, dtype=np.int64)
    cache_bound = np.zeros(len(demand))
    # each phase's undo record -- the paths it changed and their flow before it -- instead of a copy of
    # x per phase (2 million paths at k = 32: the copies were a fifth of the FPTAS's time)
    mark = np.full(len(x), -1, dtype=np.int64)
    touched = np.empty(len(x), dtype=np.int64)
    before = np.empty(len(x))
    undo: list[tuple[np.ndarray, np.ndarray]] = []
    snaps: dict[int, np.ndarray] = {0: load.copy()}     # load after phase p, p a power of two
    best = (first[0], None, None, first[2])             # (lambda, its last phase, its window's start, load)
    phases = steps = 0
    best_ub = 1.0
    stopped_by = "max phases"
    while phases < max_phases:
        done, n = K.run_phase(demand, group_start, path_links, path_hops, bottleneck, cap, length,
                              load, x, cache_path, cache_bound, epsilon, mark, phases, touched, before)
        steps += done
        undo.append((touched[:n].copy(), before[:n].copy()))
        phases += 1
        if phases & (phases - 1) == 0:
            snaps[phases] = load.copy()
        start = max(p for p in snaps if p <= phases // 2)   # the last power of two <= phases / 2, or 0
        for p in [p for p in snaps if p < start]:
            # (not mutated: keeping them only costs memory -- one load at most is ever read)
            del snaps[p]  # pragma: no mutate
        window = load - snaps[start]
        candidates = [(phases / float((load[used] / used_cap).max()), None),
                      ((phases - start) / float((window[used] / used_cap).max()), start)]
        lam, which = max(candidates, key=lambda c: c[0])
        if lam > best[0]:
            best = (lam, phases, which, load.copy() if which is None else window)
        d_l = float((length[used] * used_cap).sum())
        # the bound costs a phase's work: every other phase (one more phase at most). (Not mutated: which
        # phases compute it changes how many run, never whether the answer is certified.)
        # The groups' cached paths give alpha(l) from above in a few thousand reads, so D(l) / alpha(l) from
        # below: when that is no better than the bound in hand, the exact alpha (every candidate path read)
        # cannot be either, and is not computed (at k = 32 on uneven links it never was: a fifth of the time).
        if phases % 2 == 0 and d_l / K.cached_alpha(demand, path_links, path_hops, length, cache_path) < best_ub:  # pragma: no mutate
            best_ub = min(best_ub, d_l / K.dual_alpha(demand, group_start, path_links, path_hops, length))
        if best[0] >= (1 - epsilon) * best_ub:
            stopped_by = "certified gap"
            break
        if math.log(d_l) + log_scale >= ln_inv_delta:
            stopped_by = "D(l) >= 1"
            break
        top = float(length.max())
        if top > RESCALE_ABOVE:
            length /= top
            cache_bound /= top
            log_scale += math.log(top)
    lam, last, which, bload = best
    if last is None:
        return first[0], first[1], first[2], phases, steps, best_ub, stopped_by
    bx = _undo(x, undo, phases, last)
    if which is not None:
        bx = bx - _undo(bx, undo, last, which)
    return lam, bx, bload, phases, steps, best_ub, stopped_by


def _undo(x: np.ndarray, undo: list[tuple[np.ndarray, np.ndarray]], now: int, back_to: int) -> np.ndarray:
    """A copy of the flow ``x`` after phase ``now`` as it was after phase
    ``back_to``: the phases between undone, last first."""
    out = x.copy()
    for p in range(now, back_to, -1):
        paths, flow = undo[p - 1]
        out[paths] = flow
    return out


def mrtf_key(f: LongFlow) -> tuple:
    """Minimum remaining time first; unknown sizes last, larger demand first."""
    return (f.remaining_time, -f.demand, str(f.key))


# Not mutated (mutmut): warm_up's only effect is that the kernels are compiled before the first real
# allocation; which synthetic flows it places, and their sizes, change nothing any caller or test can see
def warm_up(paths: PathDictionary) -> float:  # pragma: no mutate block
    """Compile (or load from numba's cache) the kernels on the fabric the
    controller runs, with a few synthetic flows between its edge switches,
    so that the first real allocation is not delayed by compilation.
    Returns seconds. (Uses the controller's own view: production code never
    imports the emulation package.)"""
    view = paths.view
    t0 = time.perf_counter()
    edges = [sw for sw in view.switches if view.graph.nodes[sw]["role"] == "edge"]
    # lazily: the first six connected pairs, not every pair's paths first (on a k = 32 fabric, 261 632 pairs'
    # path enumerations kept the controller from starting for most of an hour)
    pairs = list(itertools.islice(((a, b) for a in edges for b in edges
                                   if a != b and len(paths.paths(a, b)[0]) > 0), 6))
    if not pairs:
        return time.perf_counter() - t0
    pmpt([LongFlow(i, a, b, 1e6 * (1 + i % 3)) for i, (a, b) in enumerate(pairs)], paths)
    a, b = pairs[0]
    pmpt([LongFlow(0, a, b, 10e6), LongFlow(1, a, b, 10e6)], paths)   # equal demands: the colouring path
    return time.perf_counter() - t0
