"""Compiled inner loops of PMPT (numba). Pure array code: the algorithm and
its explanation live in :mod:`apps.lessor.pmpt`.

Paths are stored flat: ``path_links[q, :path_hops[q]]`` are the link indices of
path q; group j owns paths ``group_start[j] .. group_start[j+1] - 1``.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _path_length(length, path_links, path_hops, q):
    s = 0.0
    for h in range(path_hops[q]):
        s += length[path_links[q, h]]
    return s


@njit(cache=True)
def run_phase(demand, group_start, path_links, path_hops, bottleneck, cap, length, load, x,
              cache_path, cache_bound, epsilon):
    """Route every group's demand once (one Garg-Koenemann phase); returns
    the number of steps."""
    steps = 0
    one_eps = 1.0 + epsilon
    for j in range(demand.shape[0]):
        rem = demand[j]
        tiny = 1e-12 * demand[j]
        while rem > tiny:
            q = cache_path[j]
            ok = False
            if q >= 0:
                cur = _path_length(length, path_links, path_hops, q)
                ok = cur <= one_eps * cache_bound[j]
            if not ok:
                best = -1
                best_len = np.inf
                for r in range(group_start[j], group_start[j + 1]):
                    val = _path_length(length, path_links, path_hops, r)
                    if val < best_len:
                        best_len = val
                        best = r
                q = best
                cache_path[j] = best
                cache_bound[j] = best_len
            u = min(rem, bottleneck[q])
            for h in range(path_hops[q]):
                e = path_links[q, h]
                length[e] *= 1.0 + epsilon * u / cap[e]
                load[e] += u
            x[q] += u
            rem -= u
            steps += 1
    return steps


@njit(cache=True)
def dual_alpha(demand, group_start, path_links, path_hops, length):
    """alpha(l) = sum_j W_j * (lightest candidate path of j under l)."""
    total = 0.0
    for j in range(demand.shape[0]):
        best = np.inf
        for r in range(group_start[j], group_start[j + 1]):
            val = _path_length(length, path_links, path_hops, r)
            if val < best:
                best = val
        total += demand[j] * best
    return total


@njit(cache=True)
def _congestion(load, cap, limit):
    util = 0.0
    overflow = 0.0
    for e in range(cap.shape[0]):
        u = load[e] / cap[e]
        if u > util:
            util = u
        if load[e] > limit[e]:
            overflow += (load[e] - limit[e]) / cap[e]
    return util, overflow


@njit(cache=True)
def negotiate(flow_group, flow_demand, flow_path, group_start, path_links, path_hops, cap, limit,
              load, max_iter, present0, growth, history_step, stall):
    """Negotiated-congestion rerouting (PathFinder) of unsplittable flows:
    each iteration rips up every flow in turn and puts it back on its
    cheapest candidate path, where a link costs
    (1 + history) * (1 + present * overflow / capacity). ``present`` grows
    every iteration; ``history`` accumulates on links left over-full, which
    also pushes flows that are not in conflict out of contested links (the
    exchanges single moves cannot make). Stops when no link exceeds
    ``limit`` or after ``stall`` iterations without a better routing; keeps
    the routing with the lowest (max utilisation, total overflow) seen.
    Returns (iterations, best max utilisation)."""
    n_links = cap.shape[0]
    history = np.zeros(n_links)
    best_paths = flow_path.copy()
    best_util, best_over = _congestion(load, cap, limit)
    present = present0
    it = 0
    last_better = 0
    while it < max_iter and best_over > 1e-9 and it - last_better < stall:
        it += 1
        for e in range(n_links):
            if load[e] > limit[e] * (1 + 1e-9):
                history[e] += history_step * (load[e] - limit[e]) / cap[e]
        for f in range(flow_group.shape[0]):
            q = flow_path[f]
            d = flow_demand[f]
            for h in range(path_hops[q]):
                load[path_links[q, h]] -= d
            g = flow_group[f]
            best_q = q
            best_cost = np.inf
            for r in range(group_start[g], group_start[g + 1]):
                cost = 0.0
                for h in range(path_hops[r]):
                    e = path_links[r, h]
                    overflow = load[e] + d - limit[e]
                    if overflow < 0.0:
                        overflow = 0.0
                    cost += (1.0 + history[e]) * (1.0 + present * overflow / cap[e])
                if cost < best_cost - 1e-12 or (abs(cost - best_cost) <= 1e-12 and r == q):
                    best_cost = cost
                    best_q = r
            flow_path[f] = best_q
            for h in range(path_hops[best_q]):
                load[path_links[best_q, h]] += d
        util, over = _congestion(load, cap, limit)
        if util < best_util - 1e-12 or (util <= best_util + 1e-12 and over < best_over - 1e-12):
            best_util = util
            best_over = over
            best_paths[:] = flow_path
            last_better = it
        present = min(present * growth, 1e6)
    flow_path[:] = best_paths
    return it, best_util


@njit(cache=True)
def _add(load, path_links, path_hops, q, d):
    for h in range(path_hops[q]):
        load[path_links[q, h]] += d


@njit(cache=True)
def _on_path(path_links, path_hops, q, e):
    for h in range(path_hops[q]):
        if path_links[q, h] == e:
            return True
    return False


@njit(cache=True)
def _crosses(load, cap, path_links, path_hops, q, bar):
    """Does path q cross a link whose utilisation is at or above ``bar``?"""
    for h in range(path_hops[q]):
        e = path_links[q, h]
        if load[e] / cap[e] >= bar:
            return True
    return False


@njit(cache=True)
def _path_peak(load, cap, path_links, path_hops, r, d):
    """Highest utilisation along path r once demand d is added."""
    peak = 0.0
    for h in range(path_hops[r]):
        e = path_links[r, h]
        u = (load[e] + d) / cap[e]
        if u > peak:
            peak = u
    return peak


@njit(cache=True)
def bottleneck_search(flow_group, flow_demand, flow_path, group_start, path_links, path_hops, cap, load,
                      max_rounds):
    """Local search on the one-path routing's bottleneck: U = the highest
    link utilisation. A round moves one flow off a link at U onto a path
    that stays below U, or -- when no single move can -- makes an exchange:
    the flow moves onto a path whose only links at or above U are freed by
    moving one other flow away (to a path below U). Each round lowers the
    number of links at U, or U itself, and never creates a new link at U,
    so it ends; stops when neither kind of move exists. Returns the rounds
    made."""
    n = flow_group.shape[0]
    tol = 1e-9
    rounds = 0
    while rounds < max_rounds:
        peak = 0.0
        for e in range(cap.shape[0]):
            u = load[e] / cap[e]
            if u > peak:
                peak = u
        bar = peak - tol
        moved = False
        # single moves
        for f in range(n):
            q = flow_path[f]
            if not _crosses(load, cap, path_links, path_hops, q, bar):
                continue
            d = flow_demand[f]
            g = flow_group[f]
            _add(load, path_links, path_hops, q, -d)
            best_r = -1
            best_peak = bar
            for r in range(group_start[g], group_start[g + 1]):
                if r == q:
                    continue
                pk = _path_peak(load, cap, path_links, path_hops, r, d)
                if pk < best_peak:
                    best_peak = pk
                    best_r = r
            if best_r >= 0:
                _add(load, path_links, path_hops, best_r, d)
                flow_path[f] = best_r
                moved = True
                break
            _add(load, path_links, path_hops, q, d)
        if not moved:
            # exchanges: f leaves a hot link for path r whose blocking links all lose flow x
            for f in range(n):
                q = flow_path[f]
                if not _crosses(load, cap, path_links, path_hops, q, bar):
                    continue
                d = flow_demand[f]
                g = flow_group[f]
                _add(load, path_links, path_hops, q, -d)
                for r in range(group_start[g], group_start[g + 1]):
                    if r == q:
                        continue
                    for x in range(n):
                        if x == f:
                            continue
                        qx = flow_path[x]
                        dx = flow_demand[x]
                        # x must cross every link of r that f would push to the bar
                        ok = True
                        for h in range(path_hops[r]):
                            e = path_links[r, h]
                            if (load[e] + d) / cap[e] >= bar and not _on_path(path_links, path_hops, qx, e):
                                ok = False
                                break
                        if not ok:
                            continue
                        gx = flow_group[x]
                        _add(load, path_links, path_hops, qx, -dx)
                        done = False
                        if _path_peak(load, cap, path_links, path_hops, r, d) < bar:
                            _add(load, path_links, path_hops, r, d)
                            for rx in range(group_start[gx], group_start[gx + 1]):
                                if rx == qx:
                                    continue
                                if _path_peak(load, cap, path_links, path_hops, rx, dx) < bar:
                                    _add(load, path_links, path_hops, rx, dx)
                                    flow_path[f] = r
                                    flow_path[x] = rx
                                    done = True
                                    break
                            if not done:
                                _add(load, path_links, path_hops, r, -d)
                        if done:
                            moved = True
                            break
                        _add(load, path_links, path_hops, qx, dx)
                    if moved:
                        break
                if moved:
                    break
                _add(load, path_links, path_hops, q, d)
        if not moved:
            break
        rounds += 1
    return rounds
