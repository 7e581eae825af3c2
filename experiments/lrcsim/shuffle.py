"""Fig. 11: MapReduce shuffles on a 600-server fabric, flow level.

What is drawn (the paper's §V-B setting, our stand-ins where it is silent):

- fabric: 40 racks of 15 servers (1 Gb/s), 5 aggregation switches; every
  ToR has one link to each aggregation switch of 3 Gb/s (full bisection) or
  750 Mb/s (4× over-subscribed); a VM-pair between racks is pinned to one
  aggregation switch by a hash (ECMP); every link carries at most μC
  (μ = 0.9: the highest TCP goodput, the same for every scheme);
- 4 VM slots per server, each VM guaranteed 250 Mb/s (full bisection) or
  62.5 Mb/s (over-subscribed: the ToR uplinks can carry every hose), weight 1;
- jobs: Facebook's SWIM traces are not available here (see
  ../shared/workloads/README.md), so shuffle sizes are drawn from their
  published shape: 80 % log-uniform in [10 kB, 100 MB], 15 % in
  [100 MB, 10 GB], 5 % in [10 GB, 200 GB]; M = clip(⌈S / 1 GB⌉, 1, 60)
  mapper VMs and R = clip(⌈M / 2⌉, 1, 30) reducer VMs on random free slots
  (a job waits FIFO for slots); every mapper sends S/(M·R) to every
  reducer; Poisson arrivals;
- schemes, each a rate allocation recomputed at every arrival and
  completion (event-driven, one flow per VM-pair):
  * best effort: max-min fair per VM-pair (TCP-like, no guarantees);
  * static reservation: every VM-pair at B_i (Eq. 2 over the job's
    unfinished pairs, so a VM's hose is re-split as its pairs finish),
    nothing more;
  * LRC: its equilibrium, weighted max-min with guarantees
    (max(B_i, w_i·x) with Eqs. 1 and 2) -- the allocation the simulated
    LRC dynamics reach (tests/unit/test_lrc_sim.py); the dynamics
    themselves are not stepped here (1600 links × 50 ms steps × hours of
    jobs);
- a job's shuffle time: from its placement to its last pair's end; pairs
  within 2 % (or 1 ms) of their end at an event end with it (fewer
  re-allocations; a shuffle time moves by at most that much).
"""

from __future__ import annotations

import heapq
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from apps.lrc._kernels import waterfill as _kernel_waterfill
from apps.lrc._kernels import waterfill_csr

RACKS, PER_RACK, AGGS, SLOTS = 40, 15, 5, 4
SERVERS = RACKS * PER_RACK
NIC_MBPS = 1000.0
MU = 0.9
LOCAL_MBPS = 10_000.0               # two VMs on one server: memory copy, no fabric link
SMALL_LARGE_BYTES = 1e9
BATCH = 0.02


def _waterfill(ptr, links, w, b, cap):
    return waterfill_csr(ptr, links, w, b, np.full(w.shape[0], np.inf), cap)


def waterfill(paths: list[list[int]], weights, floors, cap) -> np.ndarray:
    """Python entry (tests): flows' link lists -> rates."""
    return _kernel_waterfill(paths, weights, floors, [math.inf] * len(paths), cap)


@dataclass
class Fabric:
    oversub: float                   # 1 (full bisection) or 4
    vm_guarantee_mbps: float

    @property
    def uplink_mbps(self) -> float:
        return PER_RACK * NIC_MBPS / AGGS / self.oversub

    def capacities(self) -> np.ndarray:
        n = 2 * SERVERS + 2 * RACKS * AGGS
        cap = np.empty(n)
        cap[:2 * SERVERS] = NIC_MBPS
        cap[2 * SERVERS:] = self.uplink_mbps
        return cap * MU

    @staticmethod
    def path(s1: int, s2: int, agg: int) -> list[int]:
        if s1 == s2:
            return []
        t1, t2 = s1 // PER_RACK, s2 // PER_RACK
        if t1 == t2:
            return [s1, SERVERS + s2]
        return [s1, 2 * SERVERS + t1 * AGGS + agg, 2 * SERVERS + RACKS * AGGS + t2 * AGGS + agg, SERVERS + s2]


def arrivals_and_sizes(n: int, rng: np.random.Generator, arrival_per_s: float):
    """Poisson job arrivals and shuffle sizes of SWIM's published shape:
    80 % log-uniform in [10 kB, 100 MB], 15 % in [100 MB, 10 GB], 5 % in
    [10 GB, 200 GB] (also seed 000's study, experiments/flowsim/shuffle.py)."""
    t = 0.0
    for _ in range(n):
        t += rng.exponential(1 / arrival_per_s)
        u = rng.random()
        lo, hi = (1e4, 1e8) if u < 0.80 else (1e8, 1e10) if u < 0.95 else (1e10, 2e11)
        yield t, math.exp(rng.uniform(math.log(lo), math.log(hi)))


def jobs(n: int, seed: int, arrival_per_s: float) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for k, (t, size) in enumerate(arrivals_and_sizes(n, rng, arrival_per_s)):
        m = int(min(60, max(1, math.ceil(size / 1e9))))
        r = int(min(30, max(1, math.ceil(m / 2))))
        out.append({"id": k, "arrival_s": t, "shuffle_bytes": size, "mappers": m, "reducers": r})
    return out


def simulate(fabric: Fabric, scheme: str, job_list: list[dict], seed: int) -> dict:
    """Shuffle times of every job under one scheme."""
    rng = np.random.default_rng(seed)           # the same seed: the same placements for every scheme
    cap = fabric.capacities()
    free = list(range(SERVERS * SLOTS))
    waiting: list[dict] = []
    # the active VM-pairs, as arrays
    job_of = np.zeros(0, dtype=np.int64)
    left = np.zeros(0)
    paths = np.zeros((0, 4), dtype=np.int64)
    hops = np.zeros(0, dtype=np.int64)
    mapper_of = np.zeros(0, dtype=np.int64)
    reducer_of = np.zeros(0, dtype=np.int64)
    started: dict[int, float] = {}
    slots_of: dict[int, list[int]] = {}
    finished: dict[int, float] = {}
    now = 0.0
    arrivals = [(j["arrival_s"], j["id"]) for j in job_list]
    heapq.heapify(arrivals)
    by_id = {j["id"]: j for j in job_list}
    allocations = 0

    def place(job):
        nonlocal job_of, left, paths, hops, mapper_of, reducer_of
        m, r = job["mappers"], job["reducers"]
        if len(free) < m + r:
            return False
        pick = rng.choice(len(free), m + r, replace=False)
        slots = [free[i] for i in pick]
        for i in sorted(pick, reverse=True):
            free.pop(i)
        slots_of[job["id"]] = slots
        started[job["id"]] = now
        n = m * r
        p = np.zeros((n, 4), dtype=np.int64)
        h = np.zeros(n, dtype=np.int64)
        aggs = rng.integers(AGGS, size=n)
        for k in range(n):
            a, c = divmod(k, r)
            path = Fabric.path(slots[a] // SLOTS, slots[m + c] // SLOTS, int(aggs[k]))
            p[k, :len(path)] = path
            h[k] = len(path)
        base = job["id"] * 1000
        job_of = np.concatenate([job_of, np.full(n, job["id"])])
        left = np.concatenate([left, np.full(n, job["shuffle_bytes"] * 8 / 1e6 / n)])
        paths = np.concatenate([paths, p])
        hops = np.concatenate([hops, h])
        mapper_of = np.concatenate([mapper_of, base + np.arange(n) // r])
        reducer_of = np.concatenate([reducer_of, base + m + np.arange(n) % r])
        return True

    while arrivals or waiting or job_of.size:
        rate = np.zeros(0)
        dt = math.inf
        if job_of.size:
            _, mi, n_recv = np.unique(mapper_of, return_inverse=True, return_counts=True)
            _, ri, n_send = np.unique(reducer_of, return_inverse=True, return_counts=True)
            xr, ys = n_recv[mi], n_send[ri]           # |X^r| of the pair's mapper, |Y^s| of its reducer
            b_i = fabric.vm_guarantee_mbps * np.minimum(1 / xr, 1 / ys)      # Eq. 2 (equal weights)
            w_i = 1 / xr + 1 / ys                                            # Eq. 1
            ptr = np.zeros(hops.size + 1, dtype=np.int64)
            ptr[1:] = np.cumsum(hops)
            links = paths[np.arange(4)[None, :] < hops[:, None]]
            if scheme == "best-effort":
                rate = _waterfill(ptr, links, np.ones(hops.size), np.zeros(hops.size), cap)
            elif scheme == "lrc":
                rate = _waterfill(ptr, links, w_i, b_i, cap)
            elif scheme == "reservation":
                rate = b_i.copy()
            else:
                raise ValueError(scheme)
            allocations += 1
            rate[hops == 0] = LOCAL_MBPS
            with np.errstate(divide="ignore"):
                dt = float(np.min(np.where(rate > 0, left / rate, np.inf)))
        t_arr = arrivals[0][0] - now if arrivals else math.inf
        step = min(dt, t_arr)
        if step == math.inf:
            raise RuntimeError("no progress: a pair without rate and no arrival")
        now += step
        if job_of.size:
            left = left - rate * step
            # pairs within 2 % (or 1 ms) of finishing end with this event: one allocation, not dozens
            done = left <= 1e-9 + rate * max(step * BATCH, 1e-3)
            ended = set(job_of[done].tolist())
            keep = ~done
            job_of, left, paths, hops = job_of[keep], left[keep], paths[keep], hops[keep]
            mapper_of, reducer_of = mapper_of[keep], reducer_of[keep]
            for jid in ended - set(job_of.tolist()):
                finished[jid] = now - started[jid]
                free.extend(slots_of.pop(jid))
        while arrivals and arrivals[0][0] <= now + 1e-12:
            _, jid = heapq.heappop(arrivals)
            waiting.append(by_id[jid])
        while waiting and place(waiting[0]):
            waiting.pop(0)
    return {"shuffle_s": finished, "allocations": allocations, "makespan_s": now}


def fig11(out: Path, n_jobs: int = 1000, seed: int = 1, arrival_per_s: float = 2.0) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    job_list = jobs(n_jobs, seed, arrival_per_s)
    size = {j["id"]: j["shuffle_bytes"] for j in job_list}
    res: dict = {"jobs": n_jobs, "arrival_per_s": arrival_per_s, "seed": seed, "fabrics": {}}
    for name, fab in (("full-bisection", Fabric(1, 250.0)), ("oversubscribed-4x", Fabric(4, 62.5))):
        per = {}
        for scheme in ("best-effort", "reservation", "lrc"):
            r = simulate(fab, scheme, job_list, seed)
            t = r["shuffle_s"]
            small = np.array([t[j] for j in t if size[j] < SMALL_LARGE_BYTES])
            large = np.array([t[j] for j in t if size[j] >= SMALL_LARGE_BYTES])
            per[scheme] = {"small": _stats(small), "large": _stats(large), "allocations": r["allocations"],
                           "makespan_s": r["makespan_s"], "times": {str(j): v for j, v in t.items()}}
        be, rs, lrc = (per[s]["large"]["mean_s"] for s in ("best-effort", "reservation", "lrc"))
        per["verdict"] = {"lrc_large_over_reservation": lrc / rs, "lrc_speed_vs_best_effort": be / lrc,
                          "meets_bars": bool(lrc <= rs and be / lrc >= 0.9)}
        res["fabrics"][name] = per
    (out / "fig11.json").write_text(json.dumps(res, indent=1))
    _plot(res, size, out / "fig11.png")
    return {f: {s: ({k: v for k, v in d.items() if k != "times"} if s != "verdict" else d) for s, d in per.items()}
            for f, per in res["fabrics"].items()}


def _stats(x: np.ndarray) -> dict:
    if not x.size:
        return {"n": 0, "mean_s": None, "p50_s": None, "p90_s": None}
    return {"n": int(x.size), "mean_s": float(x.mean()), "p50_s": float(np.median(x)),
            "p90_s": float(np.percentile(x, 90))}


def _plot(res: dict, size: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fabrics = list(res["fabrics"])
    fig, axes = plt.subplots(len(fabrics), 2, figsize=(10, 3.6 * len(fabrics)))
    for row, fname in zip(np.atleast_2d(axes), fabrics):
        for ax, (label, test) in zip(row, (("small jobs (< 1 GB)", lambda s: s < SMALL_LARGE_BYTES),
                                           ("large jobs (≥ 1 GB)", lambda s: s >= SMALL_LARGE_BYTES))):
            for scheme in ("best-effort", "reservation", "lrc"):
                t = res["fabrics"][fname][scheme]["times"]
                x = np.sort([v for j, v in t.items() if test(size[int(j)])])
                if x.size:
                    ax.plot(x, np.arange(1, x.size + 1) / x.size, label=scheme)
            ax.set_xscale("log")
            ax.set_title(f"{fname}: {label}", fontsize=9)
            ax.set_xlabel("shuffle time (s)")
            ax.set_ylabel("CDF")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
