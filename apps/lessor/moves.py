"""Fewest moves: from the installed routing towards a new allocation, only as
far as it pays.

PMPT places every long flow afresh. When the installed routing falls short
of the new one (its one-path lambda below the new one's, or BG above mu x C
where the new one has none), adopting the new
routing whole moved 20-40 of the main job's ~60 long flows at once, most of
them for nothing: each move costs its TCP subflow a reordering, and every
switch on the old and new paths a flow-table change (userspace OVS
revalidates its datapath flows after each). Here the routing goes from the
installed one towards the new one a unit at a time (a flow, or a bundle:
one VM's BG to one ToR, which shares one path), each step the move that
leaves the fewest links with BG above mu x C, then the highest lambda, then
the least excess, and stops as soon as the routing is as good as the new
allocation asks.

Lambda alone is a bottleneck measure: it is the least capacity / load over
all links, so once the busiest link anywhere is as loaded as the
allocation's, no move on other links changes it. The main job's mixed ToRs
then kept all of their WC flows on one uplink and the analytics VM's BG
alone on the other -- 3.1-3.4 of its 5 Mb/s carried, the aggregate 0.82-0.91
of the ideal in 7 of 14 runs -- because their imbalance was not the
fabric's bottleneck. So each switch also has an **idle-beside-busy**
amount: of the links it sends on, the capacity the idle ones leave and the
load the overloaded ones carry beyond theirs, the lesser of the two -- what
moving flows between its links could put to use. A routing's excess is,
over the switches, how far that exceeds (1 + ``band``) x the allocation's
own, and at least ``band`` x the switch's mean link capacity; the moves go
on while a unit without BG can lower it. Not "each link within the allocation's load":
chasing the allocation's shape moved 7-9 flows at a demand step and went
on moving under steady demands (every allocation is placed afresh), where
both routings had every link busy.

Pure (no view, no messages): paths are opaque, links come from a function;
lambda is the least capacity / load over the links that carry load, as
:meth:`apps.lessor.logic.LessorLogic.routing_lambda` measures it. Each
trial is O(hops): loads are kept per link and a trial changes only the
links of the unit's old and new paths.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable, Sequence

import numpy as np

Link = tuple[str, str]
Path = tuple[str, ...]


class Problem:
    """fewest_moves' inputs, checked (each refused by name), and what every
    round reads: the routing so far (``cur``) and its load and BG per link
    (``sums``, ``bgs``), the links' capacities, each switch's links and its
    excess bound, and a unit's change. Shared with the first version of the
    rounds (bwtesting/moves_reference.py), which the tests hold equal."""

    def __init__(self, start: dict[Hashable, Path], target: dict[Hashable, Path], units: Sequence[Sequence[Hashable]],
                 load: dict[Hashable, float], bg: dict[Hashable, float], capacity: Callable[[Link], float],
                 links: Callable[[Path], list[Link]], mu: float, lam_goal: float, allowed_over: set[Link],
                 band: float | None):
        if isinstance(mu, bool) or not isinstance(mu, (int, float)) or not 0 < mu <= 1:
            raise ValueError(f"fewest_moves: mu {mu!r} must be in (0, 1]")
        if isinstance(lam_goal, bool) or not isinstance(lam_goal, (int, float)) or not lam_goal >= 0:
            raise ValueError(f"fewest_moves: lam_goal {lam_goal!r} must be a number >= 0")
        if band is not None and (isinstance(band, bool) or not isinstance(band, (int, float))
                                 or not math.isfinite(band) or band < 0):
            raise ValueError(f"fewest_moves: band {band!r} must be None or a finite number >= 0")
        seen: set[Hashable] = set()
        for unit in units:
            for k in unit:
                if k not in start or k not in target:
                    raise ValueError(f"fewest_moves: {k!r} of a unit has no start or no target path")
                if k in seen:
                    raise ValueError(f"fewest_moves: {k!r} is in two units")
                seen.add(k)
        self.target, self.units, self.load, self.bg = target, units, load, bg
        self.capacity, self.links, self.mu, self.lam_goal, self.allowed_over = capacity, links, mu, lam_goal, allowed_over
        self.cur = dict(start)
        self.sums: dict[Link, float] = {}
        self.bgs: dict[Link, float] = {}
        for k, path in self.cur.items():
            for link in links(path):
                self.sums[link] = self.sums.get(link, 0.0) + load.get(k, 0.0)
                self.bgs[link] = self.bgs.get(link, 0.0) + bg.get(k, 0.0)
        self.cap = {link: capacity(link) for link in self.sums}
        # per switch: the links it sends on; its idle-beside-busy amount under the target and the floor
        self.out_links: dict[str, set[Link]] = {}
        self.bound: dict[str, float] = {}
        if band is not None:
            goal: dict[Link, float] = {}
            for routing in (start, target):
                for path in routing.values():
                    for link in links(path):
                        self.out_links.setdefault(link[0], set()).add(link)
            for k, path in target.items():
                for link in links(path):
                    goal[link] = goal.get(link, 0.0) + load.get(k, 0.0)
            for node, own in self.out_links.items():
                mean_cap = sum(self.capof(link) for link in own) / len(own)
                self.bound[node] = max((1 + band) * self.idle_beside_busy(node, goal), band * mean_cap)

    def capof(self, link: Link) -> float:
        got = self.cap.get(link)
        if got is None:
            got = self.cap[link] = self.capacity(link)
        return got

    def ratio(self, link: Link, s: float) -> float:
        return self.capof(link) / s if s > 1e-12 else math.inf

    def over(self, link: Link, b: float) -> bool:
        return b > self.mu * self.capof(link) * (1 + 1e-9) and link not in self.allowed_over

    def idle_beside_busy(self, node: str, s: dict[Link, float], d: dict[Link, float] | None = None) -> float:
        # exactly rounded sums (math.fsum): the same whatever order the links are added in
        idle, busy = [], []
        for link in self.out_links[node]:
            used = s.get(link, 0.0) + (d or {}).get(link, 0.0)
            idle.append(max(0.0, self.capof(link) - used))
            busy.append(max(0.0, used - self.capof(link)))
        return min(math.fsum(idle), math.fsum(busy))

    def delta(self, unit: Sequence[Hashable]) -> tuple[dict[Link, float], dict[Link, float]]:
        """What moving ``unit`` to its target paths adds to each link's load and BG."""
        d: dict[Link, float] = {}
        db: dict[Link, float] = {}
        for k in unit:
            for sign, path in ((-1.0, self.cur[k]), (1.0, self.target[k])):
                for link in self.links(path):
                    d[link] = d.get(link, 0.0) + sign * self.load.get(k, 0.0)
                    db[link] = db.get(link, 0.0) + sign * self.bg.get(k, 0.0)
        return d, db


def _exact_parts(values) -> list[float]:
    """Floats whose exact sum is the exact sum of ``values`` (Shewchuk's
    non-overlapping partials, as math.fsum keeps them inside): math.fsum of
    these and more values is the exactly rounded sum of all of them."""
    parts: list[float] = []
    for x in values:
        i = 0
        for y in parts:
            if abs(x) < abs(y):
                x, y = y, x
            hi = x + y
            lo = y - (hi - x)
            if lo:
                parts[i] = lo
                i += 1
            x = hi
        parts[i:] = [x]
    return parts


def fewest_moves(start: dict[Hashable, Path], target: dict[Hashable, Path], units: Sequence[Sequence[Hashable]],
                 load: dict[Hashable, float], bg: dict[Hashable, float], capacity: Callable[[Link], float],
                 links: Callable[[Path], list[Link]], mu: float, lam_goal: float,
                 allowed_over: set[Link], band: float | None = None) -> tuple[dict[Hashable, Path], int]:
    """The routing reached from ``start`` by moving whole ``units`` (each a
    list of keys) to their ``target`` paths, best move first, until its
    lambda (by ``load``) is at least ``lam_goal``, its BG (by ``bg``)
    exceeds mu x capacity on no link outside ``allowed_over``, and --
    with a ``band`` -- no switch leaves more capacity idle beside its
    overloaded links than (1 + band) x ``target`` does and band x its mean
    link capacity (the excess, above), as far as moving units without BG
    lowers it; and how many units it moved. With every unit moved it is
    ``start`` updated by ``target``. Keys of a unit missing from ``start``
    or ``target`` and a key in two units are a ValueError, as are a ``lam_goal`` that is not a
    number >= 0 (infinity: every unit moves), a ``mu`` outside (0, 1] and a
    ``band`` that is not None or a finite number >= 0."""
    p = Problem(start, target, units, load, bg, capacity, links, mu, lam_goal, allowed_over, band)
    cur, sums, bgs, out_links, bound = p.cur, p.sums, p.bgs, p.out_links, p.bound
    capof, ratio, over, delta = p.capof, p.ratio, p.over, p.delta

    # Each round's choice, kept incrementally (it was recomputed from scratch every round: O(links log
    # links) a round, 26-138 s per placement at k = 32 -- bwtesting/moves_reference.py, which the tests hold
    # this equal to). A unit's trial is the round's totals plus its own local terms, and those depend only
    # on the links it changes and the links its switches send on: they are cached, and recomputed when a
    # move changes one of those links. Lambda's "first link in order it does not change" comes from a heap.
    overs = {link for link, b in bgs.items() if over(link, b)}
    # each switch's idle and busy terms now, per link: a trial's sums are these with its own links' terms
    # replaced (added as new - old to math.fsum, exactly the sum idle_beside_busy takes)
    idle_t = {n: {link: max(0.0, capof(link) - sums.get(link, 0.0)) for link in own} for n, own in out_links.items()}
    busy_t = {n: {link: max(0.0, sums.get(link, 0.0) - capof(link)) for link in own} for n, own in out_links.items()}
    # ... each kept as its exact sum (a few floats, _exact_parts) so that a trial adds its corrections to
    # those, not to every link's term again
    idle_s = {n: _exact_parts(t.values()) for n, t in idle_t.items()}
    busy_s = {n: _exact_parts(t.values()) for n, t in busy_t.items()}

    def excess_with(node: str, d: dict[Link, float] | None = None) -> float:
        idle, busy = list(idle_s[node]), list(busy_s[node])
        for link, v in (d or {}).items():
            if link[0] == node:
                used = sums.get(link, 0.0) + v
                idle += (max(0.0, capof(link) - used), -idle_t[node][link])
                busy += (max(0.0, used - capof(link)), -busy_t[node][link])
        return max(0.0, min(math.fsum(idle), math.fsum(busy)) - bound[node] * (1 + 1e-9))

    now_excess = {node: excess_with(node) for node in out_links}
    heap = [(ratio(link, s), link) for link, s in sums.items()]
    heapq.heapify(heap)

    def lowest(n: int) -> list[tuple[float, Link]]:
        """The n lowest capacity / load ratios now (stale heap entries dropped)."""
        got: list[tuple[float, Link]] = []
        while heap and len(got) < n:
            r, link = heapq.heappop(heap)
            if r == ratio(link, sums[link]) and (not got or got[-1][1] != link):
                got.append((r, link))
        for item in got:
            heapq.heappush(heap, item)
        return got

    # the units that differ from their target; each one's change (its keys' paths move only with it:
    # the units are disjoint) and, per switch it sends through, its excess term (in the order the
    # reference sums them); the trial's numbers as arrays for each round's choice (numpy: 8192 units a
    # round at k = 32)
    todo = [list(u) for u in units if any(cur[k] != target[k] for k in u)]
    changes = [delta(u) for u in todo]
    terms: list[dict[str, float]] = [{} for _ in todo]
    by_link: dict[Link, set[int]] = {}
    by_node: dict[str, set[int]] = {}
    n_units = len(todo)
    a_over = np.zeros(n_units, dtype=np.int64)
    a_lam = np.zeros(n_units)
    a_exc = np.zeros(n_units)
    a_len = np.array([len(u) for u in todo], dtype=np.int64)
    a_bg = np.array([any(bg.get(k, 0.0) > 0 for k in u) for u in todo], dtype=bool)
    alive = np.ones(n_units, dtype=bool)

    def local(j: int) -> None:
        """Unit j's terms afresh (its links' loads or BG changed)."""
        d, db = changes[j]
        nodes = {link[0] for link in d} & out_links.keys()
        for link in d:
            by_link.setdefault(link, set()).add(j)
        for n in nodes:
            by_node.setdefault(n, set()).add(j)
        a_over[j] = -len(overs & db.keys()) + sum(over(link, bgs.get(link, 0.0) + v) for link, v in db.items())
        a_lam[j] = min((ratio(link, sums.get(link, 0.0) + v) for link, v in d.items()), default=math.inf)
        terms[j] = {n: excess_with(n, d) - now_excess[n] for n in nodes}
        a_exc[j] = sum(terms[j].values())

    def switches_changed(j: int, nodes: set[str]) -> None:
        """Only some of unit j's switches' other links changed: their excess terms afresh."""
        for n in nodes & terms[j].keys():
            terms[j][n] = excess_with(n, changes[j][0]) - now_excess[n]
        a_exc[j] = sum(terms[j].values())

    for j in range(n_units):
        local(j)
    moved = 0
    # how many of the lowest links a trial may change (more than a unit's own is harmless: the first one
    # not among its links is the same)
    widest = max((len(d) for d, _ in changes), default=0)
    while alive.any():
        total_excess = sum(now_excess.values())
        low = lowest(widest + 1)
        lam, first_link = low[0] if low else (math.inf, None)
        if not overs and lam >= lam_goal and total_excess <= 0:
            break
        only_excess = not overs and lam >= lam_goal
        # every pending unit's trial: (BG links over, -lambda, the excess rounded to 1e-9, its size, its
        # order) -- the least wins. A unit that changes the lowest link finds lambda's next lowest.
        rest = np.full(n_units, lam)
        for i in by_link.get(first_link, ()):
            if alive[i]:
                d = changes[i][0]
                rest[i] = next((r for r, link in low if link not in d), math.inf)
        t_over = len(overs) + a_over
        t_lam = np.minimum(rest, a_lam)
        t_exc = total_excess + a_exc
        ok = alive.copy()
        if only_excess:
            ok &= ~a_bg & (t_over == 0) & ~(t_lam < lam_goal) & ~(t_exc >= total_excess - 1e-9)
        idx = np.flatnonzero(ok)
        if idx.size == 0:
            break
        idx = idx[t_over[idx] == t_over[idx].min()]
        idx = idx[t_lam[idx] == t_lam[idx].max()]
        # the rounding decides only among excesses within a few 1e-9 of the least: those, exactly
        idx = idx[t_exc[idx] <= t_exc[idx].min() + 2e-9]
        j = min((round(float(t_exc[i]), 9), int(a_len[i]), int(i)) for i in idx)[2]
        alive[j] = False
        d, db = changes[j]
        for link, v in d.items():
            sums[link] = sums.get(link, 0.0) + v
            heapq.heappush(heap, (ratio(link, sums[link]), link))
        for link, v in db.items():
            bgs[link] = bgs.get(link, 0.0) + v
            if over(link, bgs[link]):
                overs.add(link)
            else:
                overs.discard(link)
        touched = {link[0] for link in d} & out_links.keys()
        for link in d:
            if link[0] in touched:
                idle_t[link[0]][link] = max(0.0, capof(link) - sums[link])
                busy_t[link[0]][link] = max(0.0, sums[link] - capof(link))
        for n in touched:
            idle_s[n], busy_s[n] = _exact_parts(idle_t[n].values()), _exact_parts(busy_t[n].values())
            now_excess[n] = excess_with(n)
        for k in todo[j]:
            cur[k] = target[k]
        moved += 1
        crossed = set().union(*(by_link.get(link, ()) for link in d))
        for i in crossed:
            if alive[i]:
                local(i)
        for i in set().union(*(by_node.get(n, ()) for n in touched)) - crossed:
            if alive[i]:
                switches_changed(i, touched)
    return cur, moved
