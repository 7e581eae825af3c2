"""Workloads at simulator scale (numpy, seeded) and the summary of a run.

``open_loop``: every endpoint starts connections to uniformly random other
endpoints as a Poisson process whose offered load is ``load`` of its NIC
rate, sizes from a flow-size CDF (experiments/data: DCTCP web search,
Facebook Hadoop) -- the same process as ``experiments.workloads.
open_loop_flows``, vectorised: a million connections in a second, not a
minute. The emulator's own flow lists (ON-OFF sources,
``experiments.workloads.on_off_flows``) enter through
``Flows.from_specs`` instead.
"""

from __future__ import annotations

import numpy as np

from experiments.flowsim.engine import Flows, Result
from experiments.flowsim.net import SimError, SimNet
from experiments.workloads import SizeCdf

SIZE_BUCKETS = ((0, 100e3, "< 100 KB"), (100e3, 1e6, "100 KB - 1 MB"), (1e6, 10e6, "1 - 10 MB"),
                (10e6, float("inf"), ">= 10 MB"))


def sample_sizes(cdf: SizeCdf, u: np.ndarray) -> np.ndarray:
    """Inverse of the piecewise-linear CDF (as ``SizeCdf.sample``, for arrays)."""
    probs, sizes = np.array(cdf.probs), np.array(cdf.sizes)
    keep = np.concatenate([[True], np.diff(probs) > 0])       # flat steps: the later size
    return np.maximum(1.0, np.round(np.interp(u, probs[keep], sizes[keep])))


def open_loop(net: SimNet, cdf: SizeCdf, load: float, seconds: float, seed: int) -> Flows:
    if not (isinstance(load, (int, float)) and np.isfinite(load) and 0 < load <= 1):
        raise SimError(f"load {load!r}: must be in (0, 1]")
    if not (isinstance(seconds, (int, float)) and np.isfinite(seconds) and seconds > 0):
        raise SimError(f"seconds {seconds!r}: must be a finite number > 0")
    n_ep = len(net.endpoints)
    if n_ep < 2:
        raise SimError("open_loop: needs at least two endpoints")
    rng = np.random.default_rng(seed)
    nic = np.array([net.nic_bps(e.host) for e in net.endpoints])
    per_host = np.bincount(net.ep_host, minlength=len(net.view.hosts))[net.ep_host]   # VMs share the NIC
    rate = load * nic / per_host / 8.0 / cdf.mean()          # connections/s per endpoint
    counts = rng.poisson(rate * seconds)
    src = np.repeat(np.arange(n_ep), counts)
    start = rng.random(src.size) * seconds
    dst = rng.integers(0, n_ep - 1, size=src.size)
    dst = dst + (dst >= src)                                  # any endpoint but itself
    size = sample_sizes(cdf, rng.random(src.size))
    order = np.argsort(start, kind="stable")
    return Flows(src[order], dst[order].astype(np.int64), start[order], size[order])


def summarize(flows: Flows, res: Result, window: tuple[float, float]) -> dict:
    """Aggregate throughput in ``window``; FCT of the connections started
    in it (mean, p50, p99, by size bucket); how many did not finish."""
    inside = (flows.start_s >= window[0]) & (flows.start_s < window[1])
    f = res.fct_s[inside]
    sizes = flows.size_bytes[inside]
    done = np.isfinite(f)
    out = {"aggregate_mbps": res.aggregate_bps(window) / 1e6, "connections": int(inside.sum()),
           "unfinished": int((~done).sum()), "fct": stats(f[done]), "by_size": {}}
    for lo, hi, name in SIZE_BUCKETS:
        sel = done & (sizes >= lo) & (sizes < hi)
        out["by_size"][name] = stats(f[sel])
    out["allocations"] = res.allocations
    out["wall_s"] = res.wall_s
    return out


def stats(x: np.ndarray) -> dict:
    if x.size == 0:
        return {"n": 0, "mean_s": None, "p50_s": None, "p99_s": None}
    return {"n": int(x.size), "mean_s": float(x.mean()), "p50_s": float(np.median(x)),
            "p99_s": float(np.percentile(x, 99))}
