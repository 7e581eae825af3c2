"""apps.lessor.moves.fewest_moves as it was written first (a reference for
the tests): every round recomputes the routing's BG excess, lambda, the
links' order by capacity / load and each switch's excess from scratch --
O(links log links + pending units x hops) per round, which made LESSOR's
placements at k = 32 take 26-138 s (issue #34 §2). The product keeps the
same choices incrementally; tests/unit/test_fewest_moves.py holds the two
equal. Both read the inputs, the links' terms and a unit's change from
:class:`apps.lessor.moves.Problem`: what differs is the rounds."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence

from apps.lessor.moves import Problem

Link = tuple[str, str]
Path = tuple[str, ...]


def reference_fewest_moves(start: dict[Hashable, Path], target: dict[Hashable, Path], units: Sequence[Sequence[Hashable]],
                 load: dict[Hashable, float], bg: dict[Hashable, float], capacity: Callable[[Link], float],
                 links: Callable[[Path], list[Link]], mu: float, lam_goal: float,
                 allowed_over: set[Link], band: float | None = None) -> tuple[dict[Hashable, Path], int]:
    """fewest_moves' rounds as first written (see the module's text): the
    same inputs (checked by :class:`apps.lessor.moves.Problem`), the same
    answer, each round's terms recomputed."""
    p = Problem(start, target, units, load, bg, capacity, links, mu, lam_goal, allowed_over, band)
    cur, sums, bgs, out_links, bound = p.cur, p.sums, p.bgs, p.out_links, p.bound
    ratio, over, delta, idle_beside_busy = p.ratio, p.over, p.delta, p.idle_beside_busy

    def excess(node: str, s: dict[Link, float], d: dict[Link, float] | None = None) -> float:
        return max(0.0, idle_beside_busy(node, s, d) - bound[node] * (1 + 1e-9))

    pending = [list(u) for u in units if any(cur[k] != target[k] for k in u)]
    moved = 0
    while pending:
        overs = {link for link, b in bgs.items() if over(link, b)}
        lam = min((ratio(link, s) for link, s in sums.items()), default=math.inf)
        now_excess = {node: excess(node, sums) for node in out_links}
        total_excess = sum(now_excess.values())
        if not overs and lam >= lam_goal and total_excess <= 0:
            break
        # the links in order of capacity / load: a trial's lambda is the least of the links it
        # changes and the first link in this order it does not change
        order = sorted(sums, key=lambda link: ratio(link, sums[link]))
        # lambda and BG met, only the excess left: a move for it is a WC unit's (BG stays where the BG
        # placement put it: a BG subflow's move is a reordering the guarantee pays for) that lowers the
        # excess and undoes neither; none: stop
        only_excess = not overs and lam >= lam_goal
        best = None
        for i, unit in enumerate(pending):
            if only_excess and any(bg.get(k, 0.0) > 0 for k in unit):
                continue
            d, db = delta(unit)
            rest = next((ratio(link, sums[link]) for link in order if link not in d), math.inf)
            trial_lam = min([rest, *(ratio(link, sums.get(link, 0.0) + v) for link, v in d.items())])
            trial_over = len(overs - set(db)) + sum(over(link, bgs.get(link, 0.0) + v) for link, v in db.items())
            nodes = {link[0] for link in d} & out_links.keys()
            trial_excess = total_excess + sum(excess(n, sums, d) - now_excess[n] for n in nodes)
            if only_excess and (trial_over or trial_lam < lam_goal or trial_excess >= total_excess - 1e-9):
                continue
            score = (trial_over, -trial_lam, round(trial_excess, 9), len(unit), i)
            if best is None or score < best[0]:
                best = (score, i, d, db)
        if best is None:
            break
        _, i, d, db = best
        for link, v in d.items():
            sums[link] = sums.get(link, 0.0) + v
        for link, v in db.items():
            bgs[link] = bgs.get(link, 0.0) + v
        for k in pending.pop(i):
            cur[k] = target[k]
        moved += 1
    return cur, moved
