"""``bwfabric simulate fabric [--set KEY=VALUE ...]``: routing schemes
across loads on a simulated fat-tree, with the product's routing and
allocation code in the loop (:mod:`experiments.flowsim`). The same
connections (one seed) run under every scheme; per load and scheme it
prints and saves the aggregate throughput, the FCT (mean, p50, p99, by
size bucket), the controller's decisions (polling period, PMPT's time)
and the simulator's own speed (connections and allocations per wall
second). JSON in ``OUT/fabric.json``, plots in ``OUT/fabric.png``."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from experiments.flowsim.engine import Engine
from experiments.flowsim.net import SimError, SimNet
from experiments.flowsim.routing import ROUTINGS, make_router
from experiments.flowsim.sharing import SHARINGS
from experiments.flowsim.workload import open_loop, summarize
from experiments.workloads import WORKLOADS, SizeCdf


@dataclass
class FabricConfig:
    k: int = 8
    link_mbps: float = 1000.0
    routings: tuple[str, ...] = ("ecmp", "hedera", "lessor")
    sharing: str = "fair"
    loads: tuple[float, ...] = (0.3, 0.5, 0.7)
    seconds: float = 10.0             # of arrivals
    drain: float = 10.0               # after them, for connections to finish
    warmup: float = 1.0               # the throughput window starts here
    seed: int = 1
    workload: str = "websearch"
    window_ms: float = 0.5
    vms_per_host: int = 0
    cpu: str = "measured"             # Algorithm 1's input: measured, or a fixed share 0..1
    rtt_ms: float = 0.1               # controller-switch round trip

    def check(self) -> None:
        if not isinstance(self.k, int) or self.k < 2 or self.k % 2 or self.k > 64:
            raise SimError(f"k {self.k!r}: an even integer in 2..64")
        for name in ("link_mbps", "seconds"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise SimError(f"{name} {v!r}: a finite number > 0")
        for name in ("drain", "warmup", "window_ms", "rtt_ms"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise SimError(f"{name} {v!r}: a finite number >= 0")
        if self.warmup >= self.seconds:
            raise SimError(f"warmup {self.warmup} must be below seconds {self.seconds}")
        if not self.routings or any(r not in ROUTINGS for r in self.routings):
            raise SimError(f"routings {','.join(self.routings)}: from {', '.join(ROUTINGS)}")
        if self.sharing not in ("fair", "wc-only"):
            raise SimError(f"sharing {self.sharing!r}: this command runs fair or wc-only (no guarantees declared; "
                           "guarantees: bwfabric simulate shuffle)")
        if not self.loads or any(not (math.isfinite(x) and 0 < x <= 1) for x in self.loads):
            raise SimError(f"loads {self.loads}: each in (0, 1]")
        if self.workload not in WORKLOADS:
            raise SimError(f"workload {self.workload!r}: one of {', '.join(WORKLOADS)}")
        if self.cpu != "measured":
            try:
                c = float(self.cpu)
            except ValueError:
                raise SimError(f"cpu {self.cpu!r}: 'measured' or a share in [0, 1]") from None
            if not (math.isfinite(c) and 0 <= c <= 1):
                raise SimError(f"cpu {self.cpu!r}: 'measured' or a share in [0, 1]")

    @classmethod
    def parse(cls, pairs: list[str]) -> "FabricConfig":
        return parse_sets(cls, pairs)


def parse_sets(cls, pairs: list[str]):
    """A settings dataclass from ``--set KEY=VALUE`` pairs (a tuple field:
    comma-separated; ``loads``: numbers), checked by its ``check``."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kw = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in fields:
            raise SimError(f"--set {pair!r}: KEY=VALUE with KEY one of {', '.join(fields)}")
        default = getattr(cls, key, None)
        try:
            if isinstance(default, tuple):
                items = [v for v in value.split(",") if v]
                kw[key] = tuple(float(v) for v in items) if key == "loads" else tuple(items)
            elif isinstance(default, int):
                kw[key] = int(value)
            elif isinstance(default, float):
                kw[key] = float(value)
            else:
                kw[key] = value
        except ValueError:
            raise SimError(f"--set {pair!r}: {value!r} is not a {type(default).__name__}") from None
    cfg = cls(**kw)
    cfg.check()
    return cfg


def run(cfg: FabricConfig, out: Path, quiet: bool = False) -> dict:
    from mininet_topos.builders import fattree, with_vm_blocks
    from rich.progress import Progress

    cfg.check()
    topo = fattree(cfg.k, link_mbps=cfg.link_mbps)
    if cfg.vms_per_host:
        topo = with_vm_blocks(topo)
    net = SimNet(topo, cfg.vms_per_host)
    cdf = SizeCdf.load(cfg.workload)
    cpu = None if cfg.cpu == "measured" else float(cfg.cpu)
    doc = {"config": dataclasses.asdict(cfg), "hosts": len(net.view.hosts), "switches": len(net.view.switches),
           "links": len(net.links), "runs": {}}
    end = cfg.seconds + cfg.drain
    with Progress(disable=quiet, transient=True) as bar:
        for load in cfg.loads:
            flows = open_loop(net, cdf, load, cfg.seconds, cfg.seed)
            inside = (flows.start_s >= cfg.warmup) & (flows.start_s < cfg.seconds)
            fcts = {}
            for routing in cfg.routings:
                te = dict(cpu=cpu, rtt_s=cfg.rtt_ms / 1000) if routing in ("lessor", "hedera") else {}
                router = make_router(net, routing, **te)
                eng = Engine(net, router, cfg.sharing, cfg.window_ms / 1000)
                task = bar.add_task(f"load {load:g} {routing}: {flows.src.size} connections", total=end)
                res = eng.run(flows, end, progress=lambda t, task=task: bar.update(task, completed=t))
                bar.remove_task(task)
                s = summarize(flows, res, (cfg.warmup, cfg.seconds))
                s["offered_mbps"] = float(flows.size_bytes[(flows.start_s >= cfg.warmup)
                                                           & (flows.start_s < cfg.seconds)].sum() * 8 / 1e6
                                          / (cfg.seconds - cfg.warmup))
                s["speed"] = {"connections": int(flows.src.size), "wall_s": res.wall_s,
                              "connections_per_s": flows.src.size / res.wall_s,
                              "allocations_per_s": res.allocations / res.wall_s,
                              "events": res.events, "events_per_s": res.events / res.wall_s}
                if res.decisions:
                    pm = [d["pmpt_s"] for d in res.decisions if d["pmpt_s"] > 0]
                    s["controller"] = {"decisions": len(res.decisions),
                                       "period_s_median": float(np.median([d["period_s"] for d in res.decisions])),
                                       "allocations": len(pm),
                                       "allocation_s_median": float(np.median(pm)) if pm else None,
                                       "allocation_s_max": max(pm) if pm else None,
                                       "long_flows_max": max(d["long_flows"] for d in res.decisions),
                                       "moved": sum(d["moved"] for d in res.decisions)}
                doc["runs"][f"{load:g}/{routing}"] = s
                fcts[routing] = res.fct_s[inside]
                if not quiet:
                    _line(load, routing, s)
            # the mean FCT over the connections every scheme finished (each scheme's own mean leaves out
            # its own unfinished ones: the slowest)
            common = np.logical_and.reduce([np.isfinite(f) for f in fcts.values()])
            for routing, f in fcts.items():
                doc["runs"][f"{load:g}/{routing}"]["fct_common"] = {
                    "n": int(common.sum()), "mean_s": float(f[common].mean()) if common.any() else None}
            if not quiet and len(fcts) > 1:
                print(f"load {load:<4g} mean FCT over the {int(common.sum())} connections all finished: "
                      + ", ".join(f"{r} {fmt_ms(doc['runs'][f'{load:g}/{r}']['fct_common']['mean_s'])} ms"
                                  for r in fcts), flush=True)
    save(doc, out, "fabric", _plot)
    return doc


def fmt_ms(x) -> str:
    return "-" if x is None else f"{x * 1000:.1f}"


def _line(load: float, routing: str, s: dict) -> None:
    c = s.get("controller")
    extra = "" if c is None else (f"  period {c['period_s_median']:.2f} s, {c['allocations']} placements "
                                  f"(median {fmt_ms(c['allocation_s_median'])} ms, max "
                                  f"{fmt_ms(c['allocation_s_max'])} ms, <= {c['long_flows_max']} long flows)")
    sp = s["speed"]
    print(f"load {load:<4g} {routing:<12} aggregate {s['aggregate_mbps']:10.0f} Mb/s (offered "
          f"{s['offered_mbps']:.0f})  FCT mean {fmt_ms(s['fct']['mean_s'])} p50 {fmt_ms(s['fct']['p50_s'])} "
          f"p99 {fmt_ms(s['fct']['p99_s'])} ms  unfinished {s['unfinished']}  "
          f"[{sp['connections']} conns in {sp['wall_s']:.0f} s: {sp['connections_per_s']:.0f} conns/s, "
          f"{sp['events_per_s']:.0f} events/s, {sp['allocations_per_s']:.0f} allocations/s]{extra}", flush=True)


def _plot(doc: dict, path: Path) -> None:
    cfg = doc["config"]
    series = {}
    for routing in cfg["routings"]:
        xs = [ld for ld in cfg["loads"] if f"{ld:g}/{routing}" in doc["runs"]]
        rs = [doc["runs"][f"{ld:g}/{routing}"] for ld in xs]
        series[routing] = (xs, [r["aggregate_mbps"] for r in rs], [r["fct"]["mean_s"] for r in rs],
                           [r["fct"]["p99_s"] for r in rs])
    load_panels(series, f"FatTree k={cfg['k']} ({doc['hosts']} hosts, {cfg['link_mbps']:g} Mb/s), {cfg['workload']}, "
                f"{cfg['seconds']:g} s of arrivals, flow-level simulation", path)


def load_panels(series: dict, title: str, path: Path) -> None:
    """Aggregate throughput, mean FCT and p99 FCT against the load, one line
    per series: {label: (loads, aggregate Mb/s, mean FCT s, p99 FCT s)}."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for label, (xs, agg, mean, p99) in series.items():
        axes[0].plot(xs, [a / 1000 for a in agg], "o-", label=label)
        axes[1].plot(xs, [m * 1000 for m in mean], "o-", label=label)
        axes[2].plot(xs, [p * 1000 for p in p99], "o-", label=label)
    for ax, name in zip(axes, ("aggregate throughput (Gb/s)", "mean FCT (ms)", "p99 FCT (ms)")):
        ax.set_xlabel("load")
        ax.set_title(name, fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def save(doc: dict, out: Path, stem: str, plot) -> None:
    """``OUT/stem.json`` and ``plot(doc, OUT/stem.png)``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=1))
    plot(doc, out / f"{stem}.png")


def main(sets: list[str], out: Path, as_json: bool) -> int:
    try:
        cfg = FabricConfig.parse(sets)
    except SimError as exc:
        print(f"bwfabric simulate fabric: {exc}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    doc = run(cfg, out, quiet=as_json)
    if as_json:
        print(json.dumps(doc["runs"], indent=1))
    else:
        print(f"{time.perf_counter() - t0:.0f} s; results in {out}/fabric.json, {out}/fabric.png", file=sys.stderr)
    return 0
