"""LESSOR §5: routing schemes under a web-search workload across loads.

ON-OFF sources with log-normal periods and the random communication model
(experiments.workloads.on_off_flows), web-search flow sizes, every load x
seed x scheme on one emulated fabric (FatTree k=4 or a scaled VL2). Each run
gets a fresh controller and empty switch tables; every run uses the same flow
plan for every scheme (same seed and load).

Measured per run: aggregate receiver goodput over the arrival window, FCTs
(mean and 95th percentile over the flows every scheme completed, so that no
scheme looks fast by leaving its big flows unfinished), completed fraction,
controller CPU, and LESSOR's / Hedera's polling periods.

Results go to ``results.json`` after every run; ``resume=1`` keeps the runs
already there and does only the missing ones (refused, naming the settings,
if they were made with other settings); a run without ``resume`` first moves
an existing ``results.json`` aside (``results.<time>.json``).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from experiments import results as R
from experiments import configs
from experiments.controller_proc import ControllerProcess
from experiments.fabric import Fabric
from experiments.options import OptionError
from experiments.traffic import run_workload
from experiments.workloads import OnOffModel, SizeCdf, on_off_flows
from mininet_topos import builders

SCHEMES = ("single_path", "ecmp", "hedera", "lessor")
# what a run's identity does not depend on: may differ between resumed runs
_NOT_IDENTITY = {"apps", "loads", "seeds", "resume", "replot", "of_port"}


@dataclass
class Config:
    topology: str = "fattree"
    k: int = 4
    link_mbps: float = 10.0          # FatTree links; VL2 server links
    fabric_mbps: float = 25.0        # VL2 ToR-aggregation-intermediate links
    servers_per_tor: int = 5         # VL2: the paper's 20 servers at 1G under 2x10G uplinks, scaled to
    #                                  5 at 10 Mb/s under 2x25 Mb/s (the same 1:1 oversubscription)
    apps: tuple[str, ...] = SCHEMES
    loads: tuple[float, ...] = (0.1, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9)
    seeds: tuple[int, ...] = (1, 2, 3)
    workload: str = "websearch"
    duration: float = 20.0           # seconds of arrivals (throughput window: 2 s .. duration)
    drain: float = 15.0              # at most this long after the last arrival for flows to finish
    on_mean_s: float = 2.0
    off_mean_s: float = 2.0
    sigma: float = 1.0
    max_dests: int | None = None
    resume: bool = False
    replot: bool = False             # only redo summary, tables and plots from results.json
    of_port: int = 6653

    def check(self) -> None:
        if self.topology not in builders.EVALUATION_FABRICS:
            raise OptionError(f"option topology={self.topology!r}: one of "
                              + ", ".join(builders.EVALUATION_FABRICS))
        for a in self.apps:
            if a not in SCHEMES:
                raise OptionError(f"option apps: {a!r} is not one of {', '.join(SCHEMES)}")
        for load in self.loads:
            if not 0 < load <= 1:
                raise OptionError(f"option loads: {load} must be in (0, 1]")
        if not self.apps or not self.loads or not self.seeds:
            raise OptionError("options apps, loads, seeds must not be empty")
        if min(self.link_mbps, self.fabric_mbps, self.duration) <= 0 or self.drain < 0:
            raise OptionError("options link_mbps, fabric_mbps, duration must be positive, drain >= 0")
        SizeCdf.load(self.workload)
        self.model().check()

    def model(self) -> OnOffModel:
        return OnOffModel(self.on_mean_s, self.off_mean_s, self.sigma, self.max_dests)

    def topo(self):
        return builders.evaluation_fabric(self.topology, k=self.k, link_mbps=self.link_mbps,
                                          fabric_mbps=self.fabric_mbps, servers_per_tor=self.servers_per_tor)

    def identity(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k not in _NOT_IDENTITY}


VL2 = dict(topology="vl2", loads=(0.1, 0.3, 0.5, 0.7, 0.9))


def run_key(seed: int, load: float, app: str) -> str:
    return f"{seed}/{load:g}/{app}"


def _load_previous(path: Path, cfg: Config) -> dict:
    if not (cfg.resume and path.exists()):
        return {}
    data = json.loads(path.read_text())
    want = json.loads(json.dumps(cfg.identity()))
    have = data.get("identity") or {}
    differ = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
    if differ:
        changes = ", ".join(f"{k}: {have.get(k)!r} there, {want.get(k)!r} now" for k in differ)
        raise OptionError(f"resume: {path} was made with other settings ({changes}); "
                          "give the same options, or another --out")
    return data.get("runs", {})


def run(cfg: Config, out_dir: Path) -> dict:
    if cfg.replot:
        return replot(out_dir, cfg)
    out_dir.mkdir(parents=True, exist_ok=True)
    topo = cfg.topo()
    topo_file = out_dir / "topology.json"
    topo.save(topo_file)
    hosts = [h.name for h in topo.hosts]
    host_mbps = cfg.link_mbps  # server NICs in both topologies
    cdf = SizeCdf.load(cfg.workload)
    res_file = out_dir / "results.json"
    runs = _load_previous(res_file, cfg)
    if runs == {} and res_file.exists() and not cfg.resume:
        # never overwrite earlier runs silently: keep them beside the new ones
        res_file.replace(out_dir / f"results.{time.strftime('%Y%m%d-%H%M%S')}.json")
    report = {"identity": cfg.identity(), "config": asdict(cfg), "topology": topo.name, "runs": runs,
              "warnings": []}
    todo = [(s, ld, a) for s in cfg.seeds for ld in cfg.loads for a in cfg.apps if run_key(s, ld, a) not in runs]
    print(f"{topo.name}: {len(todo)} runs to do ({len(runs)} kept), about "
          f"{len(todo) * (cfg.duration + 0.5 * cfg.drain + 8) / 60:.0f} min", flush=True)
    with Fabric(topo, of_port=cfg.of_port) as fab:
        report["warnings"] += fab.warnings
        for n, (seed, load, app) in enumerate(todo, 1):
            flows = on_off_flows(hosts, cdf, load, host_mbps, cfg.duration, seed, cfg.model())
            print(f"[{n}/{len(todo)}] seed {seed} load {load:g} {app}: {len(flows)} flows", flush=True)
            runs[run_key(seed, load, app)] = _one_run(fab, topo_file, app, flows, cfg,
                                                      out_dir / "runs" / f"{seed}-{load:g}-{app}")
            R.write_json(res_file, report)
    report["summary"] = summarize(report)
    R.write_json(res_file, report)
    plot(report, out_dir)
    print_summary(report)
    print(f"\nresults: {res_file}  plots: {out_dir}/throughput_fct.png, {out_dir}/cpu_polling.png")
    return report


def _one_run(fab: Fabric, topo_file: Path, app: str, flows, cfg: Config, workdir: Path) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    fab.clear_forwarding()
    state_file = workdir / "controller-state.json"
    conf = configs.write(workdir / "bwfabric.yaml", topo_file, app, cfg.of_port,
                         state_file=state_file if app in ("lessor", "hedera") else None)
    with ControllerProcess(conf, workdir / "controller.log") as ctl:
        fab.wait_routes()
        t_from = ctl.elapsed()
        wr = run_workload(fab, flows, cfg.duration, workdir, drain_s=cfg.drain)
        cpu = ctl.cpu_between(t_from, ctl.elapsed())
    state = json.loads(state_file.read_text()) if state_file.exists() else {}
    periods = [p for _, _, p in state.get("cpu_log", [])]
    return {"aggregate_mbps": wr.aggregate_mbps, "controller_cpu_percent": cpu,
            "mean_polling_period_s": sum(periods) / len(periods) if periods else None,
            "reroutes": state.get("reroutes"), "packet_ins": state.get("packet_ins"),
            "allocations": state.get("allocations"), "moves_per_allocation": state.get("moves_per_allocation"),
            "controller_died": ctl.died,
            "flows": [{"id": r["id"], "size": r["size"], "fct": r["fct"], "complete": r["complete"]}
                      for r in wr.flows], "planned": len(flows)}


def _spread(values: list[float]) -> dict:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"mean": None, "min": None, "max": None, "n": 0}
    return {"mean": sum(vals) / len(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def summarize(report: dict) -> dict:
    """Per load and scheme: mean/min/max over seeds of throughput, common-set
    mean and p95 FCT, completed fraction, controller CPU, polling period."""
    cfg = report["config"]
    runs = report["runs"]
    out: dict = {}
    for load in cfg["loads"]:
        per_app: dict = {a: {"thr": [], "fct": [], "p95": [], "done": [], "cpu": [], "period": []}
                         for a in cfg["apps"]}
        for seed in cfg["seeds"]:
            have = {a: runs.get(run_key(seed, load, a)) for a in cfg["apps"]}
            have = {a: r for a, r in have.items() if r is not None}
            if not have:
                continue
            fct = R.common_fct_stats({a: r["flows"] for a, r in have.items()})
            for a, r in have.items():
                d = per_app[a]
                d["thr"].append(r["aggregate_mbps"])
                d["fct"].append(fct[a]["mean_fct_s"])
                d["p95"].append(fct[a]["p95_fct_s"])
                d["done"].append(fct[a]["completed_fraction"])
                d["cpu"].append(r["controller_cpu_percent"])
                d["period"].append(r.get("mean_polling_period_s"))
        out[f"{load:g}"] = {a: {"throughput_mbps": _spread(d["thr"]), "mean_fct_s": _spread(d["fct"]),
                                "p95_fct_s": _spread(d["p95"]), "completed_fraction": _spread(d["done"]),
                                "controller_cpu_percent": _spread(d["cpu"]),
                                "polling_period_s": _spread(d["period"])}
                            for a, d in per_app.items()}
    return out


def lessor_verdicts(summary: dict, min_load: float = 0.5) -> list[str]:
    """For each load >= min_load: is LESSOR's mean throughput >= every other
    scheme's (ECMP, Hedera), and its mean FCT <= theirs?"""
    lines = []
    for load, apps in summary.items():
        if float(load) < min_load or "lessor" not in apps:
            continue
        les = apps["lessor"]
        for other in ("ecmp", "hedera"):
            if other not in apps or apps[other]["throughput_mbps"]["mean"] is None:
                continue
            o = apps[other]
            thr_ok = les["throughput_mbps"]["mean"] >= o["throughput_mbps"]["mean"]
            fct_ok = les["mean_fct_s"]["mean"] <= o["mean_fct_s"]["mean"]
            lines.append(f"load {load}: throughput lessor {les['throughput_mbps']['mean']:.1f} vs {other} "
                         f"{o['throughput_mbps']['mean']:.1f} {'OK' if thr_ok else 'BELOW'}; mean FCT "
                         f"{les['mean_fct_s']['mean']:.3f} vs {o['mean_fct_s']['mean']:.3f} s "
                         f"{'OK' if fct_ok else 'ABOVE'}")
    return lines


def print_summary(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    cfg = report["config"]
    con = Console(width=max(130, Console().width))
    t = Table(title=f"{cfg['workload']} ON-OFF on {report['topology']}: mean [min..max] over seeds "
                    f"{','.join(map(str, cfg['seeds']))}; FCT over flows every scheme completed")
    for col in ("load", "app", "throughput Mb/s", "mean FCT s", "p95 FCT s", "completed", "ctl CPU %",
                "poll period s"):
        t.add_column(col, justify="left" if col == "app" else "right")

    def cell(s: dict, spec: str) -> str:
        if s["mean"] is None:
            return "n/a"
        return f"{s['mean']:{spec}} [{s['min']:{spec}}..{s['max']:{spec}}]"
    for load, apps in report["summary"].items():
        for app, s in apps.items():
            t.add_row(load, app, cell(s["throughput_mbps"], ".1f"), cell(s["mean_fct_s"], ".2f"),
                      cell(s["p95_fct_s"], ".1f"), R.fmt(s["completed_fraction"]["mean"], ".3f"),
                      R.fmt(s["controller_cpu_percent"]["mean"], ".1f"),
                      R.fmt(s["polling_period_s"]["mean"], ".2f", "-"))
    con.print(t)
    for line in lessor_verdicts(report["summary"]):
        con.print(line)
    for key, run in sorted(report.get("runs", {}).items()):
        moves = run.get("moves_per_allocation")
        if moves:
            con.print(f"{key}: {run.get('allocations')} allocations, moves per allocation after the first "
                      f"{sum(moves[1:]) / max(1, len(moves) - 1):.2f} (max {max(moves[1:], default=0)})")
        if run.get("controller_died"):
            con.print(f"[bold red]{key}: FAILED RUN: {run['controller_died']}")
    for w in report["warnings"]:
        con.print(f"[yellow]warning: {w}")


def plot(report: dict, out_dir: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = report["summary"]
    loads = [float(x) for x in summary]
    apps = report["config"]["apps"]
    metrics = [("throughput_mbps", "aggregate throughput (Mb/s)"), ("mean_fct_s", "mean FCT (s)"),
               ("p95_fct_s", "95th percentile FCT (s)")]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, (metric, label) in zip(axes, metrics):
        for i, app in enumerate(apps):
            pts = [(ld, summary[f"{ld:g}"][app][metric]) for ld in loads]
            pts = [(ld + (i - 1.5) * 0.006, s) for ld, s in pts if s["mean"] is not None]
            if not pts:
                continue
            xs = [p[0] for p in pts]
            ys = [p[1]["mean"] for p in pts]
            err = [[y - p[1]["min"] for y, p in zip(ys, pts)], [p[1]["max"] - y for y, p in zip(ys, pts)]]
            ax.errorbar(xs, ys, yerr=err, marker="o", ms=4, capsize=3, label=app)
        ax.set_xlabel("offered load (fraction of NIC rate)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{report['config']['workload']} ON-OFF on {report['topology']} "
                 f"(mean over seeds, bars: min..max)")
    fig.tight_layout()
    fig.savefig(out_dir / "throughput_fct.png", dpi=110)
    plt.close(fig)

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4.0))
    for app in apps:
        cpu = [summary[f"{ld:g}"][app]["controller_cpu_percent"]["mean"] for ld in loads]
        ax1.plot(loads, cpu, marker="o", ms=4, label=app)
        per = [summary[f"{ld:g}"][app]["polling_period_s"]["mean"] for ld in loads]
        if any(p is not None for p in per):
            ax2.plot([ld for ld, p in zip(loads, per) if p is not None], [p for p in per if p is not None],
                     marker="o", ms=4, label=app)
    ax1.set_xlabel("offered load")
    ax1.set_ylabel("controller CPU (% of one core)")
    ax1.legend(fontsize=8)
    ax2.set_xlabel("offered load")
    ax2.set_ylabel("mean polling period (s)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "cpu_polling.png", dpi=110)
    plt.close(fig)


def replot(out_dir: Path, cfg: Config | None = None) -> dict:
    """Summary, tables and plots again from a results.json (no emulation),
    over ``cfg``'s apps, loads and seeds if given (runs missing for some are
    left out of their means)."""
    report = json.loads((out_dir / "results.json").read_text())
    if cfg is not None:
        report["config"].update(apps=list(cfg.apps), loads=list(cfg.loads), seeds=list(cfg.seeds))
    report["summary"] = summarize(report)
    plot(report, out_dir)
    print_summary(report)
    return report
