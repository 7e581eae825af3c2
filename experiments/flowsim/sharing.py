"""How subflows share the fabric: max-min at flow level, with two
priority classes, on the product's compiled weighted max-min kernel.

Policies (``SHARINGS``), per connection:

- ``fair``: one subflow; max-min fair per subflow (TCP's share; the papers'
  FullCompetition and best effort);
- ``wc-only``: one low-priority (WC) subflow; with every connection in the
  one class it shares as ``fair`` does (seed 000's WCOnly);
- ``reservation``: one BG subflow held to its VM-pair's guarantee B_i and
  nothing more (seed 000's BGOnly, seed 001's static reservation);
- ``bgwc``: a BG subflow (high priority, held to B_i at the host) and a WC
  subflow (low priority, max-min over what BG leaves on each link);
- ``lrc``: one subflow; LRC's equilibrium, weighted max-min with floors:
  max(B_i, w_i·x) per VM-pair (Eqs. 1-2), what the simulated LRC dynamics
  reach (``tests/unit/test_lrc_sim.py``).

A VM-pair's B_i (Eq. 2) is shared by its connections' BG subflows: each
pair is one more "link" of capacity B_i that they all cross (the host's
pacing of the pair). Strict priority: BG is allocated first over the links'
full capacity, WC over what is left.
"""

from __future__ import annotations

import numpy as np

from apps.lrc._kernels import maxmin_csr, waterfill_csr, wmaxmin_csr

SHARINGS = ("fair", "wc-only", "reservation", "bgwc", "lrc")
BG, WC = 0, 1
# the subflows each sharing gives a connection: (class, ...)
SUBFLOWS = {"fair": (WC,), "wc-only": (WC,), "reservation": (BG,), "bgwc": (BG, WC), "lrc": (WC,)}


def csr(links2d: np.ndarray, hops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Padded per-row link lists -> (ptr, links)."""
    ptr = np.zeros(hops.size + 1, dtype=np.int64)
    np.cumsum(hops, out=ptr[1:])
    mask = np.arange(links2d.shape[1])[None, :] < hops[:, None]
    return ptr, links2d[mask]


def pair_terms(src: np.ndarray, dst: np.ndarray, guarantee: np.ndarray, weight: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Eqs. 1 and 2 over the active VM-pairs, vectorised (the simulator's
    form of ``bwcommon.lrc.pair_terms``; tests hold the two equal).
    ``src``/``dst``: endpoints of each connection. Returns (pair index of
    each connection, w_i, B_i) per distinct pair."""
    n_ep = guarantee.size
    code = src.astype(np.int64) * n_ep + dst
    pairs, inv = np.unique(code, return_inverse=True)
    x, y = pairs // n_ep, pairs % n_ep
    n_recv = np.bincount(x, minlength=n_ep)             # |X^r|
    n_send = np.bincount(y, minlength=n_ep)             # |Y^s|
    w_recv = np.bincount(x, weights=weight[y], minlength=n_ep)   # Σ_{X^r} w
    w_send = np.bincount(y, weights=weight[x], minlength=n_ep)   # Σ_{Y^s} w
    w_i = weight[x] / n_recv[x] + weight[y] / n_send[y]
    b_i = np.minimum(guarantee[x] * weight[y] / w_recv[x], guarantee[y] * weight[x] / w_send[y])
    return inv, w_i, b_i


def allocate(links2d: np.ndarray, hops: np.ndarray, klass: np.ndarray, cap: np.ndarray,
             capacity: np.ndarray, pair: np.ndarray | None = None, pair_cap: np.ndarray | None = None,
             weight: np.ndarray | None = None, floor: np.ndarray | None = None) -> np.ndarray:
    """Rates (bits/s) of subflows: rows of ``links2d`` (``hops`` long),
    ``klass`` BG or WC, each capped at ``cap``. BG rows also cross their
    ``pair``'s virtual link of ``pair_cap``; WC rows share by ``weight``
    with ``floor`` (default 1 and 0). Rows without links get 0 here."""
    n = hops.size
    rate = np.zeros(n)
    if n == 0:
        return rate
    residual = capacity.astype(float).copy()
    bg = klass == BG
    if bg.any():
        rows = np.flatnonzero(bg & (hops > 0))
        if rows.size:
            ext = np.full((rows.size, links2d.shape[1] + 1), -1, dtype=np.int64)
            ext[:, :-1] = links2d[rows]
            h = hops[rows]
            ext[np.arange(rows.size), h] = capacity.size + pair[rows]
            ptr, lk = csr(ext, h + 1)
            r = maxmin_csr(ptr, lk, cap[rows], np.concatenate([residual, pair_cap.astype(float)]))
            rate[rows] = r
            fab = lk < capacity.size
            np.subtract.at(residual, lk[fab], np.repeat(r, h + 1)[fab])
            np.maximum(residual, 0.0, out=residual)
    rows = np.flatnonzero(~bg & (hops > 0))
    if rows.size:
        ptr, lk = csr(links2d[rows], hops[rows])
        if weight is None and floor is None:
            rate[rows] = maxmin_csr(ptr, lk, cap[rows], residual)
        elif floor is None:
            rate[rows] = wmaxmin_csr(ptr, lk, weight[rows], cap[rows], residual)
        else:
            w = np.ones(rows.size) if weight is None else weight[rows]
            b = np.zeros(rows.size) if floor is None else floor[rows]
            rate[rows] = waterfill_csr(ptr, lk, w, b, cap[rows], residual)
    return rate
