"""Seed 000's study at scale (BG/WC paper Figs. 18-20), simulated with
the product's code in the loop: ``bwfabric simulate bgwc-fig19``.

- Fabric (Fig. 18): ``mininet_topos.builders.bgwc_large``: 400 hosts in 4
  pods, 2 core, 8 aggregation and 16 ToR switches, 25 hosts per ToR,
  1 / 10 / 20 Gb/s by tier; the wiring the paper leaves open is every ToR
  to both aggregation switches of its pod and every aggregation switch to
  both cores: ToR over-subscription 1.25, aggregation 1. Routed by the ECMP
  app's groups (:mod:`.routing`).
- Slots: 2 mapper and 2 reducer slots per host, each a VM behind the host's
  NIC (4 VMs per host). The host's 800 Mb/s guarantee is its hose: 400 Mb/s
  per mapper VM sending, 400 per reducer VM receiving; VM-pairs' B_i by
  Eqs. 1-2 (``bwcommon.lrc``, as the agents pace them).
- Jobs: Facebook's SWIM traces are not available here
  (``../shared/workloads/README.md``); shuffle sizes S are drawn from their
  published shape (the LRC simulator's, ``experiments/lrcsim/shuffle.py``):
  80 % log-uniform in [10 kB, 100 MB], 15 % in [100 MB, 10 GB], 5 % in
  [10 GB, 200 GB]. Each job has ceil(S / 64 MB) mappers and as many
  reducers (the paper's S/64, one per 64 MB block), at least 1, at most
  ``max_tasks`` (100 by default: a job's tasks fit an eighth of the
  cluster's slots); every mapper sends S/(M R) to every reducer. Poisson
  arrivals; a job waits (FIFO) until its mappers and reducers all have
  free slots, picked at random.
- Schemes (:mod:`.sharing`): FullCompetition (``fair``: every connection
  max-min, TCP's share), BGOnly (``reservation``: each VM-pair held to
  B_i), WCOnly (``wc-only``: the low-priority subflow alone) and BG+WC
  (``bgwc``: BG to B_i first, WC over the rest). WC shares by the agents'
  WC policy (A_l by guarantee, ``docs/apps.md``): each sending VM's WC
  subflows together weigh its A_l -- equal here -- however many
  connections it opens.
- Measured: a job's shuffle-phase completion time, from its placement to
  its last connection's end, for the first ``jobs`` jobs: CDF (Fig. 19, cut
  at 5000 ms) and means by job size (Fig. 20). The paper gives an ordering
  for large jobs only: BG+WC < WCOnly < FullCompetition < BGOnly in time.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from experiments.flowsim.engine import Engine
from experiments.flowsim.net import SimError, SimNet
from experiments.flowsim.routing import make_router
from experiments.flowsim.workload import stats as _stats

SCHEMES = {"FullCompetition": "fair", "BGOnly": "reservation", "WCOnly": "wc-only", "BG+WC": "bgwc"}
SLOTS = 2                       # mapper slots and reducer slots per host
HOST_GUARANTEE_BPS = 800e6
BLOCK_BYTES = 64 * 2**20
LARGE_BYTES = 1e9               # "large" jobs: shuffle >= 1 GB


def make_jobs(n: int, seed: int, arrival_per_s: float, max_tasks: int = 100) -> list[dict]:
    if not (isinstance(n, int) and n >= 1):
        raise SimError(f"jobs {n!r}: an integer >= 1")
    if not (math.isfinite(arrival_per_s) and arrival_per_s > 0):
        raise SimError(f"arrival_per_s {arrival_per_s!r}: a finite rate > 0")
    if not (isinstance(max_tasks, int) and 1 <= max_tasks):
        raise SimError(f"max_tasks {max_tasks!r}: an integer >= 1")
    from experiments.lrcsim.shuffle import arrivals_and_sizes
    out = []
    for k, (t, size) in enumerate(arrivals_and_sizes(n, np.random.default_rng(seed), arrival_per_s)):
        m = int(min(max_tasks, max(1, math.ceil(size / BLOCK_BYTES))))
        out.append({"id": k, "arrival_s": t, "shuffle_bytes": size, "mappers": m, "reducers": m})
    return out


class ShuffleJobs:
    """A job source for :meth:`Engine.run`: places jobs on free slots
    (FIFO), hands over their mapper -> reducer connections, frees the slots
    when a job's last connection ends and places the jobs waiting."""

    def __init__(self, net: SimNet, jobs: list[dict], seed: int):
        if net.endpoints and len(net.endpoints) != 2 * SLOTS * len(net.view.hosts):
            raise SimError(f"shuffle: needs {2 * SLOTS} VMs per host (mapper and reducer slots)")
        self.rng = np.random.default_rng(seed)
        per = 2 * SLOTS
        n_hosts = len(net.view.hosts)
        self.free_map = [h * per + s for h in range(n_hosts) for s in range(SLOTS)]
        self.free_red = [h * per + SLOTS + s for h in range(n_hosts) for s in range(SLOTS)]
        if any(j["mappers"] > len(self.free_map) or j["reducers"] > len(self.free_red) for j in jobs):
            raise SimError("shuffle: a job needs more slots than the cluster has")
        self.jobs = sorted(jobs, key=lambda j: j["arrival_s"])
        self.next_job = 0
        self.waiting: list[dict] = []
        self.pending: list[tuple] = []          # (src, dst, start, size, job id), placed, not handed over
        self.job_of: list[int] = []             # per handed connection (global id order)
        self.left: dict[int, int] = {}
        self.slots: dict[int, tuple[list, list]] = {}
        self.placed_at: dict[int, float] = {}
        self.shuffle_s: dict[int, float] = {}
        self.last_end: dict[int, float] = {}

    def _place(self, job: dict, at: float) -> bool:
        m, r = job["mappers"], job["reducers"]
        if len(self.free_map) < m or len(self.free_red) < r:
            return False
        mi = sorted(self.rng.choice(len(self.free_map), m, replace=False).tolist(), reverse=True)
        ri = sorted(self.rng.choice(len(self.free_red), r, replace=False).tolist(), reverse=True)
        maps = [self.free_map.pop(i) for i in mi]
        reds = [self.free_red.pop(i) for i in ri]
        self.slots[job["id"]] = (maps, reds)
        self.placed_at[job["id"]] = at
        size = job["shuffle_bytes"] / (m * r)
        self.left[job["id"]] = m * r
        for a in maps:
            for b in reds:
                self.pending.append((a, b, at, size, job["id"]))
        return True

    def _drain_waiting(self, at: float) -> None:
        while self.waiting and self._place(self.waiting[0], at):
            self.waiting.pop(0)

    def next_start(self) -> float:
        nxt = self.jobs[self.next_job]["arrival_s"] if self.next_job < len(self.jobs) else math.inf
        return min([nxt] + [p[2] for p in self.pending])

    def take(self, until: float, inclusive: bool):
        while self.next_job < len(self.jobs) and (self.jobs[self.next_job]["arrival_s"] < until or (
                inclusive and self.jobs[self.next_job]["arrival_s"] <= until)):
            job = self.jobs[self.next_job]
            self.next_job += 1
            self.waiting.append(job)
            self._drain_waiting(job["arrival_s"])
        now, later = [], []
        for p in self.pending:
            (now if p[2] < until or (inclusive and p[2] <= until) else later).append(p)
        self.pending = later
        self.job_of.extend(p[4] for p in now)
        cols = list(zip(*now)) if now else [(), (), (), ()]
        return (np.array(cols[0], dtype=np.int64), np.array(cols[1], dtype=np.int64),
                np.array(cols[2], dtype=float), np.array(cols[3], dtype=float))

    def completed(self, gids, times, now: float) -> None:
        for g, t in zip(gids.tolist(), times.tolist()):
            jid = self.job_of[g]
            self.left[jid] -= 1
            self.last_end[jid] = max(self.last_end.get(jid, 0.0), t)
            if self.left[jid] == 0:
                self.shuffle_s[jid] = self.last_end[jid] - self.placed_at[jid]
                maps, reds = self.slots.pop(jid)
                self.free_map.extend(maps)
                self.free_red.extend(reds)
        self._drain_waiting(now)

    def exhausted(self) -> bool:
        return self.next_job >= len(self.jobs) and not self.waiting and not self.pending


def fabric() -> SimNet:
    from mininet_topos.builders import bgwc_large, with_vm_blocks
    return SimNet(with_vm_blocks(bgwc_large()), vms_per_host=2 * SLOTS)


def simulate(scheme: str, jobs: list[dict], seed: int, window_s: float = 0.005, end_s: float = 20_000.0,
             net: SimNet | None = None, progress=None) -> dict:
    net = net or fabric()
    guarantee = np.full(len(net.endpoints), HOST_GUARANTEE_BPS / SLOTS)
    # the WC classes share by the agents' WC policy (A_l by guarantee: equal here, every slot VM 400 Mb/s):
    # each sending VM's WC weighs the same however many connections it has; FullCompetition is plain TCP
    eng = Engine(net, make_router(net, "ecmp"), SCHEMES[scheme], window_s, guarantee_bps=guarantee,
                 wc_per_vm=scheme in ("WCOnly", "BG+WC"))
    source = ShuffleJobs(net, jobs, seed)
    res = eng.run(source, end_s, progress=progress)
    return {"shuffle_s": source.shuffle_s, "wall_s": res.wall_s, "allocations": res.allocations,
            "connections": int(res.fct_s.size), "unfinished_jobs": len(jobs) - len(source.shuffle_s)}


def fig19(out: Path, n_jobs: int = 1000, seed: int = 1, arrival_per_s: float = 2.0, window_ms: float = 5.0,
          max_tasks: int = 100, quiet: bool = False) -> dict:
    from rich.progress import Progress

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = make_jobs(n_jobs, seed, arrival_per_s, max_tasks)
    size = {j["id"]: j["shuffle_bytes"] for j in jobs}
    net = fabric()
    doc = {"jobs": n_jobs, "seed": seed, "arrival_per_s": arrival_per_s, "window_ms": window_ms,
           "max_tasks": max_tasks, "hosts": len(net.view.hosts),
           "tor_oversubscription": net.topo.params["tor_oversubscription"], "schemes": {}}
    with Progress(disable=quiet, transient=True) as bar:
        for scheme in SCHEMES:
            task = bar.add_task(scheme, total=None)
            r = simulate(scheme, jobs, seed, window_ms / 1000, net=net,
                         progress=lambda t, task=task: bar.update(task, description=f"{scheme}: {t:.0f} s"))
            bar.remove_task(task)
            t = r.pop("shuffle_s")
            large = np.array([v for j, v in t.items() if size[j] >= LARGE_BYTES])
            small = np.array([v for j, v in t.items() if size[j] < LARGE_BYTES])
            allj = np.array(list(t.values()))
            doc["schemes"][scheme] = {**r, "all": _stats(allj), "small": _stats(small), "large": _stats(large),
                                      "within_5000ms": float((allj <= 5.0).mean()) if allj.size else None,
                                      "times": {str(j): v for j, v in sorted(t.items())}}
            if not quiet:
                s = doc["schemes"][scheme]
                print(f"{scheme:<16} mean {_ms(s['all']['mean_s'])} ms (small {_ms(s['small']['mean_s'])}, "
                      f"large {_ms(s['large']['mean_s'])}); {s['within_5000ms']:.3f} within 5000 ms; "
                      f"{r['connections']} connections, {r['unfinished_jobs']} jobs unfinished, "
                      f"{r['wall_s']:.0f} s", flush=True)
    large = {s: doc["schemes"][s]["large"]["mean_s"] for s in SCHEMES}
    if all(v is not None for v in large.values()):
        doc["large_ratios_to_bgwc"] = {s: large[s] / large["BG+WC"] for s in SCHEMES}
        doc["paper_order_holds"] = bool(large["BG+WC"] < large["WCOnly"] < large["FullCompetition"]
                                        < large["BGOnly"])
    (out / "bgwc_fig19.json").write_text(json.dumps(doc, indent=1))
    _plot(doc, size, out / "bgwc_fig19_20.png")
    return doc


def _ms(x) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


def _plot(doc: dict, size: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    for scheme, s in doc["schemes"].items():
        x = np.sort(np.array(list(s["times"].values())) * 1000)
        if x.size:
            y = np.arange(1, x.size + 1) / x.size
            a.plot(x[x <= 5000], y[x <= 5000], label=scheme)
    a.set_xlim(0, 5000)
    a.set_xlabel("shuffle completion time (ms)")
    a.set_ylabel("CDF")
    a.set_title("Fig. 19: first jobs' shuffle times (cut at 5000 ms)", fontsize=9)
    a.legend(fontsize=7)
    names = list(doc["schemes"])
    for i, cls in enumerate(("small", "large")):
        vals = [doc["schemes"][n][cls]["mean_s"] or 0.0 for n in names]
        b.bar([j + 0.4 * i for j in range(len(names))], vals, width=0.4, label=f"{cls} jobs (mean, s)")
    b.set_xticks([j + 0.2 for j in range(len(names))], names, fontsize=8)
    b.set_yscale("log")
    b.set_title("Fig. 20: mean shuffle time by job size", fontsize=9)
    b.legend(fontsize=7)
    fig.suptitle(f"BG/WC at scale: {doc['hosts']} hosts, {doc['jobs']} jobs, flow-level simulation", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(out: Path, sets: list[str], as_json: bool) -> int:
    kw = {}
    types = {"jobs": int, "seed": int, "arrival_per_s": float, "window_ms": float, "max_tasks": int}
    for pair in sets:
        key, sep, value = pair.partition("=")
        if not sep or key not in types:
            print(f"bwfabric simulate bgwc-fig19: --set {pair!r}: KEY=VALUE with KEY one of {', '.join(types)}",
                  file=sys.stderr)
            return 2
        try:
            kw[{"jobs": "n_jobs"}.get(key, key)] = types[key](value)
        except ValueError:
            print(f"bwfabric simulate bgwc-fig19: --set {pair!r}: not a {types[key].__name__}", file=sys.stderr)
            return 2
    t0 = time.perf_counter()
    try:
        doc = fig19(out, quiet=as_json, **kw)
    except SimError as exc:
        print(f"bwfabric simulate bgwc-fig19: {exc}", file=sys.stderr)
        return 2
    summary = {k: v for k, v in doc.items() if k != "schemes"}
    summary["schemes"] = {s: {k: v for k, v in d.items() if k != "times"} for s, d in doc["schemes"].items()}
    print(json.dumps(summary, indent=1))
    if not as_json:
        print(f"{time.perf_counter() - t0:.0f} s; results in {out}/bgwc_fig19.json, {out}/bgwc_fig19_20.png",
              file=sys.stderr)
    return 0
