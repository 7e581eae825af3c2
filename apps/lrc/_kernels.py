"""Compiled weighted max-min with floors and caps (numba), for LRC's
joint equilibrium of full links at the controller (every τ_r) and for the
flow-level simulators. The plain reference is
:func:`experiments.maxmin.weighted_max_min`; the tests hold the two equal."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def waterfill_csr(ptr, links, w, b, d, cap):
    """Weighted max-min with floors and caps: rate_i = min(d_i, max(b_i,
    w_i·x)) with x rising per bottleneck. Flows are CSR rows
    (``links[ptr[i]:ptr[i+1]]``); every round fixes every link whose level
    is the least among the links its flows cross, and every flow whose cap
    is below that least level (the parallel form of progressive filling:
    exact)."""
    n = ptr.shape[0] - 1
    n_links = cap.shape[0]
    rate = np.zeros(n)
    frozen = np.zeros(n, dtype=np.bool_)
    frozen_load = np.zeros(n_links)
    # links -> flows (CSR)
    count = np.zeros(n_links + 1, dtype=np.int64)
    for e in range(ptr[n]):
        count[links[e] + 1] += 1
    for l_ in range(n_links):
        count[l_ + 1] += count[l_]
    lflows = np.empty(ptr[n], dtype=np.int64)
    fill = count[:-1].copy()
    for i in range(n):
        for e in range(ptr[i], ptr[i + 1]):
            lflows[fill[links[e]]] = i
            fill[links[e]] += 1
    left = 0
    for i in range(n):
        if ptr[i + 1] == ptr[i]:
            frozen[i] = True          # no fabric link: the caller sets its rate
        elif d[i] <= b[i]:
            frozen[i] = True          # held below its floor by its cap
            rate[i] = d[i]
            for e in range(ptr[i], ptr[i + 1]):
                frozen_load[links[e]] += d[i]
        else:
            left += 1
    level = np.full(n_links, np.inf)
    bp = np.empty(n)
    for i in range(n):
        bp[i] = b[i] / w[i]
    for l_ in range(n_links):             # each link's flows by breakpoint b/w, once
        lo, hi = count[l_], count[l_ + 1]
        if hi - lo > 1:
            seg = lflows[lo:hi].copy()
            order = np.argsort(bp[seg])
            for q in range(hi - lo):
                lflows[lo + q] = seg[order[q]]
    while left > 0:
        for l_ in range(n_links):
            lo, hi = count[l_], count[l_ + 1]
            btot = 0.0
            m = 0
            for k in range(lo, hi):
                f = lflows[k]
                if not frozen[f]:
                    m += 1
                    btot += b[f]
            if m == 0:
                level[l_] = np.inf
                continue
            rem = cap[l_] - frozen_load[l_]
            if btot >= rem:
                level[l_] = 0.0       # the floors alone fill it
                continue
            # load(x) = Σ_{bp <= x} w·x + Σ_{bp > x} b over the unfrozen flows, walked up the breakpoints
            wsum = 0.0
            bcum = 0.0
            x = np.inf
            k = lo
            while k < hi:
                f = lflows[k]
                k += 1
                if frozen[f]:
                    continue
                wsum += w[f]
                bcum += b[f]
                cand = (rem - (btot - bcum)) / wsum
                nxt = np.inf
                while k < hi and frozen[lflows[k]]:
                    k += 1
                if k < hi:
                    nxt = bp[lflows[k]]
                if cand <= nxt:
                    x = max(cand, bp[f])
                    break
            level[l_] = x
        # a flow's level: its least link's; a link is settled when none of its flows sees a lower one
        flevel = np.full(n, np.inf)
        for i in range(n):
            if not frozen[i]:
                for e in range(ptr[i], ptr[i + 1]):
                    if level[links[e]] < flevel[i]:
                        flevel[i] = level[links[e]]
        # a flow whose cap comes before every link on its path stops at its cap; the links it crosses
        # are then decided next round (their levels counted it as still rising)
        capped = False
        for i in range(n):
            if not frozen[i] and d[i] / w[i] <= flevel[i]:
                rate[i] = d[i]
                frozen[i] = True
                left -= 1
                capped = True
                for e in range(ptr[i], ptr[i + 1]):
                    frozen_load[links[e]] += d[i]
        if capped:
            continue
        # decide every settled link on this round's levels first, then freeze
        settled = np.zeros(n_links, dtype=np.bool_)
        for l_ in range(n_links):
            if level[l_] == np.inf:
                continue
            ok = True
            for k in range(count[l_], count[l_ + 1]):
                f = lflows[k]
                if not frozen[f] and flevel[f] < level[l_] * (1 - 1e-12):
                    ok = False
                    break
            settled[l_] = ok
        progressed = False
        for l_ in range(n_links):
            if not settled[l_]:
                continue
            for k in range(count[l_], count[l_ + 1]):
                f = lflows[k]
                if not frozen[f]:
                    r = max(b[f], w[f] * flevel[f])
                    rate[f] = r
                    frozen[f] = True
                    left -= 1
                    progressed = True
                    for e in range(ptr[f], ptr[f + 1]):
                        frozen_load[links[e]] += r
        if not progressed:
            break
    return rate


@njit(cache=True)
def _heap_push(keys, vals, size, key, val):
    """Binary min-heap on arrays (numba's heapq on tuple lists is several
    times slower here); returns the new size."""
    i = size
    keys[i] = key
    vals[i] = val
    while i > 0:
        parent = (i - 1) >> 1
        if keys[parent] <= keys[i]:
            break
        keys[parent], keys[i] = keys[i], keys[parent]
        vals[parent], vals[i] = vals[i], vals[parent]
        i = parent
    return size + 1


@njit(cache=True)
def _heap_pop(keys, vals, size):
    """Removes the least entry; returns the new size."""
    size -= 1
    keys[0] = keys[size]
    vals[0] = vals[size]
    i = 0
    while True:
        a = 2 * i + 1
        if a >= size:
            break
        b = a + 1
        c = b if b < size and keys[b] < keys[a] else a
        if keys[i] <= keys[c]:
            break
        keys[c], keys[i] = keys[i], keys[c]
        vals[c], vals[i] = vals[i], vals[c]
        i = c
    return size


@njit(cache=True)
def maxmin_csr(ptr, links, d, cap):
    """Plain max-min with caps: :func:`wmaxmin_csr` with every weight 1."""
    return wmaxmin_csr(ptr, links, np.ones(ptr.shape[0] - 1), d, cap)


@njit(cache=True)
def wmaxmin_csr(ptr, links, w, d, cap):
    """Weighted max-min with caps, no floors: what ``waterfill_csr`` gives
    for b = 0 -- rate_i = min(d_i, w_i x) with x rising per bottleneck --
    by sequential progressive filling: the least of the links' levels
    (residual / weight of the flows still rising) from a heap, against the
    least cap level d/w still rising. A link's level never falls as flows
    freeze (they freeze at or below it), so each link keeps one heap entry,
    re-keyed when it reaches the top stale: O(nnz + L log L) in practice,
    where the parallel rounds of ``waterfill_csr`` cost O(rounds x nnz) --
    tens of rounds on a fat-tree's many NIC levels. The flow-level
    simulator allocates every event with it (experiments.flowsim.sharing)."""
    n = ptr.shape[0] - 1
    n_links = cap.shape[0]
    nnz = ptr[n]
    rate = np.zeros(n)
    frozen = np.zeros(n, dtype=np.bool_)
    count = np.zeros(n_links + 1, dtype=np.int64)
    for e in range(nnz):
        count[links[e] + 1] += 1
    for l_ in range(n_links):
        count[l_ + 1] += count[l_]
    lflows = np.empty(nnz, dtype=np.int64)
    fill = count[:-1].copy()
    for i in range(n):
        for e in range(ptr[i], ptr[i + 1]):
            lflows[fill[links[e]]] = i
            fill[links[e]] += 1
    residual = cap.astype(np.float64).copy()
    users = np.zeros(n_links, dtype=np.int64)       # flows still rising (the weight sum drifts: never 0 exactly)
    wsum = np.zeros(n_links)
    left = 0
    n_capped = 0
    for i in range(n):
        if ptr[i + 1] == ptr[i]:
            frozen[i] = True          # no fabric link: the caller sets its rate
        else:
            left += 1
            if d[i] < np.inf:
                n_capped += 1
            for e in range(ptr[i], ptr[i + 1]):
                users[links[e]] += 1
                wsum[links[e]] += w[i]
    capped = np.empty(n_capped, dtype=np.int64)      # the finite caps, by their level d/w
    q = 0
    for i in range(n):
        if not frozen[i] and d[i] < np.inf:
            capped[q] = i
            q += 1
    capped = capped[np.argsort(d[capped] / w[capped])]
    keys = np.empty(n_links)
    vals = np.empty(n_links, dtype=np.int64)
    size = 0
    for l_ in range(n_links):
        if users[l_] > 0:
            size = _heap_push(keys, vals, size, max(residual[l_], 0.0) / wsum[l_], l_)
    nc = 0
    while left > 0:
        while nc < n_capped and frozen[capped[nc]]:
            nc += 1
        lvl = np.inf
        link = -1
        while size > 0:
            l_ = vals[0]
            if users[l_] == 0:
                size = _heap_pop(keys, vals, size)
                continue
            now = max(residual[l_], 0.0) / max(wsum[l_], 1e-300)
            if now > keys[0]:          # risen since it was keyed: re-key it
                size = _heap_pop(keys, vals, size)
                size = _heap_push(keys, vals, size, now, l_)
                continue
            lvl = now
            link = l_
            break
        if nc < n_capped and d[capped[nc]] / w[capped[nc]] <= lvl:
            i = capped[nc]            # its cap comes first: it stops there
            _freeze(i, d[i], w[i], ptr, links, residual, users, wsum, rate, frozen)
            left -= 1
            continue
        if link < 0:
            break
        size = _heap_pop(keys, vals, size)
        for k in range(count[link], count[link + 1]):
            f = lflows[k]
            if not frozen[f]:
                _freeze(f, w[f] * lvl, w[f], ptr, links, residual, users, wsum, rate, frozen)
                left -= 1
    return rate


@njit(cache=True)
def _freeze(f, x, wf, ptr, links, residual, users, wsum, rate, frozen):
    """Flow ``f`` (weight ``wf``) stops rising at ``x``: its links lose it
    and carry x."""
    frozen[f] = True
    rate[f] = x
    for e in range(ptr[f], ptr[f + 1]):
        residual[links[e]] -= x
        users[links[e]] -= 1
        wsum[links[e]] -= wf


def waterfill(paths, weights, floors, caps, capacity) -> np.ndarray:
    """Flows' link-index lists -> rates (the CSR form built here)."""
    ptr = np.zeros(len(paths) + 1, dtype=np.int64)
    for i, p in enumerate(paths):
        ptr[i + 1] = ptr[i] + len(p)
    links = np.array([x for p in paths for x in p], dtype=np.int64)
    return waterfill_csr(ptr, links, np.asarray(weights, float), np.asarray(floors, float),
                         np.asarray(caps, float), np.asarray(capacity, float))
