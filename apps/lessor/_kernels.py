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
def _lightest(length, path_links, path_hops, lo, hi):
    """(the first lightest path among lo .. hi - 1, its length). (Each
    path summed whole: stopping a sum once it reaches the lightest so far
    gives the same answer and was measured 20 % slower -- the branch.)"""
    best = -1
    best_len = np.inf
    for r in range(lo, hi):
        val = _path_length(length, path_links, path_hops, r)
        if val < best_len:
            best_len = val
            best = r
    return best, best_len


@njit(cache=True)
def run_phase(demand, group_start, path_links, path_hops, bottleneck, cap, length, load, x,
              cache_path, cache_bound, epsilon, mark, phase, touched, before):
    """Route every group's demand once (one Garg-Koenemann phase); returns
    (steps, n): ``touched[:n]`` are the paths whose flow changed, each once,
    and ``before[:n]`` their flow before the phase (``mark[q] == phase``:
    recorded) -- the phase undone exactly by writing them back."""
    steps = 0
    n = 0
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
                best, best_len = _lightest(length, path_links, path_hops, group_start[j], group_start[j + 1])
                q = best
                cache_path[j] = best
                cache_bound[j] = best_len
            u = min(rem, bottleneck[q])
            for h in range(path_hops[q]):
                e = path_links[q, h]
                length[e] *= 1.0 + epsilon * u / cap[e]
                load[e] += u
            if mark[q] != phase:
                mark[q] = phase
                touched[n] = q
                before[n] = x[q]
                n += 1
            x[q] += u
            rem -= u
            steps += 1
    return steps, n


@njit(cache=True)
def dual_alpha(demand, group_start, path_links, path_hops, length):
    """alpha(l) = sum_j W_j * (lightest candidate path of j under l)."""
    total = 0.0
    for j in range(demand.shape[0]):
        total += demand[j] * _lightest(length, path_links, path_hops, group_start[j], group_start[j + 1])[1]
    return total


@njit(cache=True)
def cached_alpha(demand, path_links, path_hops, length, cache_path):
    """sum_j W_j * (length of group j's cached path under l): at least
    alpha(l), as no path is lighter than the lightest (inf if a group has no
    cached path)."""
    total = 0.0
    for j in range(demand.shape[0]):
        q = cache_path[j]
        if q < 0:
            return np.inf
        total += demand[j] * _path_length(length, path_links, path_hops, q)
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
            # only flows on a link over its limit, or one that has been: the others' cheapest path is
            # where they are (every link of it costs 1, the least a link can)
            contested = False
            for h in range(path_hops[q]):
                e = path_links[q, h]
                if history[e] > 0.0 or load[e] > limit[e] * (1 + 1e-9):
                    contested = True
                    break
            if not contested:
                continue
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
def _below(load, cap, path_links, path_hops, group_start, g, skip, d, bar, best):
    """A path of group g other than ``skip`` on which demand d stays below
    ``bar``: the one with the lowest peak if ``best``, else the first; -1 if none."""
    found = -1
    lowest = bar
    for r in range(group_start[g], group_start[g + 1]):
        if r == skip:
            continue
        pk = _path_peak(load, cap, path_links, path_hops, r, d)
        if pk < lowest:
            found = r
            if not best:
                break
            lowest = pk
    return found


@njit(cache=True)
def _blocked_only_by(load, cap, path_links, path_hops, r, d, bar, qx):
    """Does path qx cross every link of r that demand d would push to ``bar``?"""
    for h in range(path_hops[r]):
        e = path_links[r, h]
        if (load[e] + d) / cap[e] >= bar and not _on_path(path_links, path_hops, qx, e):
            return False
    return True


@njit(cache=True)
def _flows_on_links(flow_path, path_links, path_hops, n_links):
    """The flows crossing each link, in flow order: link e's are
    ``on_flow[on_start[e]:on_start[e + 1]]``."""
    on_start = np.zeros(n_links + 1, dtype=np.int64)
    for x in range(flow_path.shape[0]):
        q = flow_path[x]
        for h in range(path_hops[q]):
            on_start[path_links[q, h] + 1] += 1
    for e in range(n_links):
        on_start[e + 1] += on_start[e]
    fill = on_start[:-1].copy()
    on_flow = np.empty(on_start[n_links], dtype=np.int64)
    for x in range(flow_path.shape[0]):
        q = flow_path[x]
        for h in range(path_hops[q]):
            e = path_links[q, h]
            on_flow[fill[e]] = x
            fill[e] += 1
    return on_start, on_flow


@njit(cache=True)
def _exchange(f, d, q, flow_group, flow_demand, flow_path, group_start, path_links, path_hops, cap, load, bar,
              on_start, on_flow):
    """With f's demand d lifted off its path q: move f onto a path r whose
    links at the bar all lose another flow x, and x onto a path below the bar.
    Such an x crosses r's first link at the bar, so only the flows on that
    link are tried (in flow order, as a scan of every flow would meet them);
    every flow is tried only if r has no link at the bar."""
    g = flow_group[f]
    everyone = np.arange(flow_group.shape[0])
    for r in range(group_start[g], group_start[g + 1]):
        if r == q:
            continue
        tried = everyone
        for h in range(path_hops[r]):
            e = path_links[r, h]
            if (load[e] + d) / cap[e] >= bar:
                tried = on_flow[on_start[e]:on_start[e + 1]]
                break
        for x in tried:
            if x == f:
                continue
            qx = flow_path[x]
            dx = flow_demand[x]
            if not _blocked_only_by(load, cap, path_links, path_hops, r, d, bar, qx):
                continue
            _add(load, path_links, path_hops, qx, -dx)
            if _path_peak(load, cap, path_links, path_hops, r, d) < bar:
                _add(load, path_links, path_hops, r, d)
                rx = _below(load, cap, path_links, path_hops, group_start, flow_group[x], qx, dx, bar, False)
                if rx >= 0:
                    _add(load, path_links, path_hops, rx, dx)
                    flow_path[f] = r
                    flow_path[x] = rx
                    return True
                _add(load, path_links, path_hops, r, -d)
            _add(load, path_links, path_hops, qx, dx)
    return False


@njit(cache=True)
def _improve(exchange, flow_group, flow_demand, flow_path, group_start, path_links, path_hops, cap, load, bar):
    """One move off the bar: the first flow crossing a link at ``bar`` that
    a single move (the best path below the bar) or, with ``exchange``, an
    exchange can relieve. Returns whether a move was made."""
    if exchange:
        on_start, on_flow = _flows_on_links(flow_path, path_links, path_hops, cap.shape[0])
    else:
        on_start, on_flow = np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    for f in range(flow_group.shape[0]):
        q = flow_path[f]
        if not _crosses(load, cap, path_links, path_hops, q, bar):
            continue
        d = flow_demand[f]
        _add(load, path_links, path_hops, q, -d)
        if exchange:
            if _exchange(f, d, q, flow_group, flow_demand, flow_path, group_start, path_links, path_hops, cap,
                         load, bar, on_start, on_flow):
                return True
        else:
            r = _below(load, cap, path_links, path_hops, group_start, flow_group[f], q, d, bar, True)
            if r >= 0:
                _add(load, path_links, path_hops, r, d)
                flow_path[f] = r
                return True
        _add(load, path_links, path_hops, q, d)
    return False


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
    rounds = 0
    while rounds < max_rounds:
        peak = 0.0
        for e in range(cap.shape[0]):
            u = load[e] / cap[e]
            if u > peak:
                peak = u
        bar = peak - 1e-9
        if not (_improve(False, flow_group, flow_demand, flow_path, group_start, path_links, path_hops, cap, load,
                         bar)
                or _improve(True, flow_group, flow_demand, flow_path, group_start, path_links, path_hops, cap,
                            load, bar)):
            break
        rounds += 1
    return rounds


@njit(cache=True)
def path_bottleneck(cap, path_links, path_hops):
    """Per path, its least link capacity (inf for a path of no links)."""
    out = np.full(path_links.shape[0], np.inf)
    for q in range(path_links.shape[0]):
        for h in range(path_hops[q]):
            c = cap[path_links[q, h]]
            if c < out[q]:
                out[q] = c
    return out


@njit(cache=True)
def links_crossed(path_links, path_hops, n_links):
    """Which links some path crosses."""
    on = np.zeros(n_links, dtype=np.bool_)
    for q in range(path_links.shape[0]):
        for h in range(path_hops[q]):
            on[path_links[q, h]] = True
    return on


@njit(cache=True)
def greedy_place(flow_group, flow_demand, group_start, path_links, path_hops, fractional, limit, safe_cap, load,
                 flow_path):
    """The greedy one-path routing of :func:`apps.lessor.placement._greedy_and_negotiate`,
    flows in the given order: each takes, among its group's paths on which
    it fits within ``limit`` (1e-9 of slack), the one with the most of the
    fractional flow not yet handed out (ties: the first); if none fits, the
    lowest peak utilisation after it, then the lowest total (ties: the
    first). Fills ``flow_path`` (flat path indices) and ``load``."""
    handed = np.zeros(fractional.shape[0])
    for i in range(flow_group.shape[0]):
        g = flow_group[i]
        d = flow_demand[i]
        best_free = -1
        best_left = -np.inf
        best_any = -1
        best_worst = np.inf
        best_total = np.inf
        for q in range(group_start[g], group_start[g + 1]):
            fits = True
            worst = -np.inf
            total = 0.0
            for h in range(path_hops[q]):
                e = path_links[q, h]
                after = load[e] + d
                if not after <= limit[e] * (1 + 1e-9):
                    fits = False
                u = after / safe_cap[e]
                if u > worst:
                    worst = u
                total += u
            if fits:
                left = fractional[q] - handed[q]
                if best_free < 0 or left > best_left:
                    best_free = q
                    best_left = left
            if best_any < 0 or worst < best_worst or (worst == best_worst and total < best_total):
                best_any = q
                best_worst = worst
                best_total = total
        q = best_free if best_free >= 0 else best_any
        for h in range(path_hops[q]):
            load[path_links[q, h]] += d
        handed[q] += d
        flow_path[i] = q


@njit(cache=True)
def flow_load(flow_path, flow_demand, path_links, path_hops, n_links):
    """Load per link of flows ``flow_demand[i]`` on flat paths ``flow_path[i]``."""
    load = np.zeros(n_links)
    for i in range(flow_path.shape[0]):
        q = flow_path[i]
        for h in range(path_hops[q]):
            load[path_links[q, h]] += flow_demand[i]
    return load
