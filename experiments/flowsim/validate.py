"""The simulator against the emulator, on the emulator's own inputs
(issue #34 §1 (a)): ``bwfabric simulate fabric-validate emulator DIR...``
reads the results of emulated runs and simulates the same fabric, the
same connections and the same routing app:

- ``lessor-eval`` results (``experiments/lessor_eval.py``: ON-OFF web
  search at each load, every app): the flow list is regenerated from the
  run's recorded configuration and seed (and checked against the number of
  connections the run planned); compared: aggregate throughput over the
  emulator's window (2 s .. duration) and the mean FCT over the
  connections both finished;
- ``routing-comparison`` results (``fidelity``, ``lessor-permutation``:
  long flows in stride and permutation patterns): the same pairs, compared
  on the aggregate rate after the warm-up. ECMP's paths hang on the
  switches' hash of the emulator's random ephemeral ports: the emulated
  run is one draw. Where the run observed its paths (``pathprobe``: the
  switch ports each flow left by), the simulator replays that draw
  (``PinnedRouter``) and the ratio is on the same paths; the mean and
  range over ``draws`` of its own hash are reported beside it (the only
  comparison for runs without observed paths).

Prints one row per run: emulated, simulated, their ratio, and whether it
is within the issue's bounds (aggregate within 10 %, mean FCT within 20 %).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

from experiments.flowsim.engine import Engine, Flows
from experiments.flowsim.net import SimError, SimNet
from experiments.flowsim.routing import PinnedRouter, make_router

AGG_BOUND, FCT_BOUND = 0.10, 0.20
ECMP_DRAWS = 20


def _router(net: SimNet, app: str):
    te = dict(cpu=0.0, rtt_s=0.001) if app in ("lessor", "hedera") else {}
    return make_router(net, app, **te)


def lessor_eval_rows(path: Path) -> list[dict]:
    from experiments.lessor_eval import Config, run_key
    from experiments.workloads import SizeCdf, on_off_flows

    report = json.loads(path.read_text())
    raw = dict(report["config"])
    cfg = Config(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})
    topo = cfg.topo()
    net = SimNet(topo)
    hosts = [h.name for h in topo.hosts]
    cdf = SizeCdf.load(cfg.workload)
    rows = []
    for seed in cfg.seeds:
        for load in cfg.loads:
            specs = on_off_flows(hosts, cdf, load, cfg.link_mbps, cfg.duration, seed, cfg.model())
            for app in cfg.apps:
                emu = report["runs"].get(run_key(seed, load, app))
                if emu is None:
                    continue
                if emu.get("planned") != len(specs):
                    raise SimError(f"{path}: run {run_key(seed, load, app)} planned {emu.get('planned')} "
                                   f"connections, the configuration gives {len(specs)}")
                flows = Flows.from_specs(net, specs)
                order = np.argsort([f.start_s for f in specs], kind="stable")      # from_specs sorts by start
                res = Engine(net, _router(net, app), "fair", 0.0).run(flows, cfg.duration + cfg.drain)
                sim_fct = np.full(len(specs), np.nan)
                sim_fct[order] = res.fct_s
                emu_fct = np.full(len(specs), np.nan)
                for rec in emu["flows"]:
                    if rec.get("complete") and rec.get("fct") is not None:
                        emu_fct[rec["id"]] = rec["fct"]
                both = np.isfinite(sim_fct) & np.isfinite(emu_fct)
                rows.append(_row("web search", f"{load:g}", app, emu["aggregate_mbps"],
                                 res.aggregate_bps((2.0, cfg.duration)) / 1e6,
                                 float(emu_fct[both].mean()) if both.any() else None,
                                 float(sim_fct[both].mean()) if both.any() else None,
                                 extra={"seed": seed, "connections": len(specs), "both_finished": int(both.sum()),
                                        "emu_finished": int(np.isfinite(emu_fct).sum()),
                                        "sim_finished": int(np.isfinite(sim_fct).sum())}))
    return rows


def routing_comparison_rows(path: Path, draws: int = ECMP_DRAWS) -> list[dict]:
    from experiments.routing_comparison import _pairs
    from mininet_topos import builders

    report = json.loads(path.read_text())
    cfg = report["config"]
    topo = builders.evaluation_fabric(cfg["topology"], k=cfg["k"], link_mbps=cfg["link_mbps"],
                                      fabric_mbps=cfg["fabric_mbps"], servers_per_tor=cfg["servers_per_tor"])
    net = SimNet(topo)
    hosts = net.view.hosts
    omit, duration = cfg["omit"], cfg["long_duration"]
    rows = []
    for app, rep in report["apps"].items():
        for pattern, long in rep.get("long", {}).items():
            pairs = _pairs(pattern, hosts, cfg["seed"])
            if [(f["src"], f["dst"]) for f in long["flows"]] != [tuple(p) for p in pairs]:
                raise SimError(f"{path}: {app} {pattern}: the recorded pairs are not the pattern's")
            flows = Flows(np.array([net.endpoint(a) for a, _ in pairs]), np.array([net.endpoint(b) for _, b in pairs]),
                          np.zeros(len(pairs)), np.full(len(pairs), 1e12))
            end = math.ceil(omit + duration)
            window = (math.ceil(omit), end)
            sims = []
            for d in range(draws if app == "ecmp" else 1):
                res = Engine(net, _router(net, app), "fair", 0.0, port_seed=d).run(flows, end)
                sims.append(res.aggregate_bps(window) / 1e6)
            sim, extra = float(np.mean(sims)), {"sim_range_mbps": [min(sims), max(sims)], "draws": len(sims)}
            if app == "ecmp" and long.get("paths_observed"):
                pinned = PinnedRouter(net, {(f["src"], f["dst"]): tuple(f["path"]) for f in long["flows"]})
                sim = Engine(net, pinned, "fair", 0.0).run(flows, end).aggregate_bps(window) / 1e6
                extra.update(same_paths=True, sim_draws_mean_mbps=float(np.mean(sims)))
            rows.append(_row(pattern, "-", app, long["aggregate_mbps"], sim, None, None, extra=extra))
    return rows


def _row(workload, load, app, emu_agg, sim_agg, emu_fct, sim_fct, extra=None) -> dict:
    agg_ratio = sim_agg / emu_agg if emu_agg else None
    fct_ratio = sim_fct / emu_fct if emu_fct and sim_fct is not None else None
    ok = agg_ratio is not None and abs(agg_ratio - 1) <= AGG_BOUND and \
        (fct_ratio is None or abs(fct_ratio - 1) <= FCT_BOUND)
    return {"workload": workload, "load": load, "app": app, "emu_aggregate_mbps": emu_agg,
            "sim_aggregate_mbps": sim_agg, "aggregate_ratio": agg_ratio, "emu_mean_fct_s": emu_fct,
            "sim_mean_fct_s": sim_fct, "fct_ratio": fct_ratio, "within": ok, **(extra or {})}


def rows_for(path: Path) -> list[dict]:
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    report = json.loads(path.read_text())
    if "runs" in report:
        return lessor_eval_rows(path)
    if "apps" in report:
        return routing_comparison_rows(path)
    raise SimError(f"{path}: neither lessor-eval nor routing-comparison results")


def print_rows(rows: list[dict]) -> None:
    print(f"{'workload':<12} {'load':>4} {'app':<12} {'agg emu':>8} {'agg sim':>8} {'ratio':>6} "
          f"{'FCT emu':>8} {'FCT sim':>8} {'ratio':>6}  within")
    for r in rows:
        fe = "-" if r["emu_mean_fct_s"] is None else f"{r['emu_mean_fct_s'] * 1000:.0f}"
        fs = "-" if r["sim_mean_fct_s"] is None else f"{r['sim_mean_fct_s'] * 1000:.0f}"
        fr = "-" if r["fct_ratio"] is None else f"{r['fct_ratio']:.2f}"
        rng = f" (sim {r['sim_range_mbps'][0]:.0f}-{r['sim_range_mbps'][1]:.0f} over {r['draws']} hash draws)" \
            if r.get("draws", 1) > 1 else ""
        if r.get("same_paths"):
            lo, hi = r["sim_range_mbps"]
            rng = (f" (on the run's observed paths; the simulator's own {r['draws']} hash draws: "
                   f"mean {r['sim_draws_mean_mbps']:.0f}, {lo:.0f}-{hi:.0f})")
        print(f"{r['workload']:<12} {r['load']:>4} {r['app']:<12} {r['emu_aggregate_mbps']:>8.1f} "
              f"{r['sim_aggregate_mbps']:>8.1f} {r['aggregate_ratio']:>6.2f} {fe:>8} {fs:>8} {fr:>6}  "
              f"{'yes' if r['within'] else 'NO'}{rng}")


def main(paths: list[str], out: Path, as_json: bool) -> int:
    if not paths:
        print("bwfabric simulate fabric-validate: give emulated results (lessor-eval or routing-comparison "
              "directories or results.json files)", file=sys.stderr)
        return 2
    rows = []
    try:
        for p in paths:
            rows += rows_for(Path(p))
    except (SimError, OSError, KeyError, ValueError) as exc:
        print(f"bwfabric simulate fabric-validate: {exc}", file=sys.stderr)
        return 2
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "validate_emulator.json").write_text(json.dumps(rows, indent=1))
    if as_json:
        print(json.dumps(rows, indent=1))
    else:
        print_rows(rows)
    return 0
