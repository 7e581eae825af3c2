"""apps.lessor.moves.fewest_moves as it was written first (a reference for
the tests): every round recomputes the routing's BG excess, lambda, the
links' order by capacity / load and each switch's excess from scratch --
O(links log links + pending units x hops) per round, which made LESSOR's
placements at k = 32 take 26-138 s (issue #34 §2). The product keeps the
same choices incrementally; tests/unit/test_fewest_moves.py holds the two
equal move by move."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence

Link = tuple[str, str]
Path = tuple[str, ...]


def reference_fewest_moves(start: dict[Hashable, Path], target: dict[Hashable, Path], units: Sequence[Sequence[Hashable]],
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
    or ``target`` are a ValueError, as are a ``lam_goal`` that is not a
    number >= 0 (infinity: every unit moves), a ``mu`` outside (0, 1] and a
    ``band`` that is not None or a finite number >= 0."""
    if isinstance(mu, bool) or not isinstance(mu, (int, float)) or not 0 < mu <= 1:
        raise ValueError(f"fewest_moves: mu {mu!r} must be in (0, 1]")
    if isinstance(lam_goal, bool) or not isinstance(lam_goal, (int, float)) or not lam_goal >= 0:
        raise ValueError(f"fewest_moves: lam_goal {lam_goal!r} must be a number >= 0")
    if band is not None and (isinstance(band, bool) or not isinstance(band, (int, float))
                             or not math.isfinite(band) or band < 0):
        raise ValueError(f"fewest_moves: band {band!r} must be None or a finite number >= 0")
    for unit in units:
        for k in unit:
            if k not in start or k not in target:
                raise ValueError(f"fewest_moves: {k!r} of a unit has no start or no target path")
    cur = dict(start)
    sums: dict[Link, float] = {}
    bgs: dict[Link, float] = {}
    for k, path in cur.items():
        for link in links(path):
            sums[link] = sums.get(link, 0.0) + load.get(k, 0.0)
            bgs[link] = bgs.get(link, 0.0) + bg.get(k, 0.0)
    cap = {link: capacity(link) for link in sums}

    def capof(link: Link) -> float:
        if link not in cap:
            cap[link] = capacity(link)
        return cap[link]

    def ratio(link: Link, s: float) -> float:
        return capof(link) / s if s > 1e-12 else math.inf

    def over(link: Link, b: float) -> bool:
        return b > mu * capof(link) * (1 + 1e-9) and link not in allowed_over

    # per switch: the links it sends on; its idle-beside-busy amount under the target and the floor
    out_links: dict[str, set[Link]] = {}
    bound: dict[str, float] = {}

    def idle_beside_busy(node: str, s: dict[Link, float], d: dict[Link, float] | None = None) -> float:
        # exactly rounded sums (math.fsum): the same whatever order the links are added in
        idle, busy = [], []
        for link in out_links[node]:
            used = s.get(link, 0.0) + (d or {}).get(link, 0.0)
            idle.append(max(0.0, capof(link) - used))
            busy.append(max(0.0, used - capof(link)))
        return min(math.fsum(idle), math.fsum(busy))

    if band is not None:
        goal: dict[Link, float] = {}
        for routing in (start, target):
            for path in routing.values():
                for link in links(path):
                    out_links.setdefault(link[0], set()).add(link)
        for k, path in target.items():
            for link in links(path):
                goal[link] = goal.get(link, 0.0) + load.get(k, 0.0)
        for node, own in out_links.items():
            mean_cap = sum(capof(link) for link in own) / len(own)
            bound[node] = max((1 + band) * idle_beside_busy(node, goal), band * mean_cap)

    def excess(node: str, s: dict[Link, float], d: dict[Link, float] | None = None) -> float:
        return max(0.0, idle_beside_busy(node, s, d) - bound[node] * (1 + 1e-9))

    def delta(unit: Sequence[Hashable]) -> tuple[dict[Link, float], dict[Link, float]]:
        d: dict[Link, float] = {}
        db: dict[Link, float] = {}
        for k in unit:
            for sign, path in ((-1.0, cur[k]), (1.0, target[k])):
                for link in links(path):
                    d[link] = d.get(link, 0.0) + sign * load.get(k, 0.0)
                    db[link] = db.get(link, 0.0) + sign * bg.get(k, 0.0)
        return d, db

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
