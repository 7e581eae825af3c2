"""``bwfabric simulate ...``: the LRC simulator from the command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

FIGURES = {
    "lrc-fig8": "X (B = 600 of μC = 900) alone, Y joins at 15 s: LRC vs ElasticSwitch-like limits",
    "lrc-fig9": "weights 1:2 without guarantees",
    "lrc-fig10": "X (B = 450) saturating, short flows at 5/s and 20/s from 15 s to 60 s",
    "lrc-fig11": "MapReduce shuffles on 600 servers: LRC vs static reservation vs best effort",
    "lrc-delay-table": "peak Σ limits/μC and time to 95 % per delay × β, three variants",
    "lrc-validate": "equilibrium vs Eq. 7 (20 fabrics) and weighted max-min with guarantees (100 fabrics)",
}


def _fmt(x, unit="") -> str:
    return "—" if x is None else f"{x:.3g}{unit}"


def scenario(path: str, as_json: bool) -> int:
    from experiments.lrcsim.engine import Run
    from experiments.lrcsim.report import summarize
    from experiments.lrcsim.scenario import ScenarioError, load
    try:
        sc = load(path)
    except (ScenarioError, OSError) as exc:
        print(f"bwfabric simulate lrc: {exc}", file=sys.stderr)
        return 2
    run = Run(sc)
    s = summarize(run, run.run())
    if as_json:
        print(json.dumps(s, indent=2))
        return 0
    print(f"{sc.controller}, delay {sc.delay_s:g} s, {len(sc.links)} links, {len(sc.flows)} VM-flows")
    print(f"{'flow':<12} {'rate':>10} {'limit':>10} {'ideal':>10} {'limit CoV':>10}")
    for fid, f in s["flows"].items():
        if not f.get("steady_rate_mbps") and f.get("active") is False:
            print(f"{fid:<12} {'(not active at the end of its span)':>40}")
            continue
        print(f"{fid:<12} {f['steady_rate_mbps']:>10.1f} {f['steady_limit_mbps']:>10.1f} {f['ideal_mbps']:>10.1f} "
              f"{f['limit_cov']:>10.4f}")
    print(f"time to 95 % utilisation: {_fmt(s['time_to_95pct_utilisation_s'], ' s')}; "
          f"time to Jain 0.9 (of rate/ideal): {_fmt(s['time_to_jain_0_9_s'], ' s')}; "
          f"peak Σ limits/μC: {s['peak_limits_over_muC']:.3f}")
    return 0


def figure(name: str, out: Path, delay_s: float | None, tau_ms: float | None, as_json: bool) -> int:
    from experiments.lrcsim import figures, validate
    out = Path(out)
    delay = figures.DEFAULT_DELAY_S if delay_s is None else delay_s
    params = {"feedback_delay_s": delay}
    if tau_ms is not None:
        params.update({"tau_v_s": tau_ms / 1000, "tau_r_s": tau_ms / 1000})
        params["alpha"] = min(10.0, 0.5 / params["tau_v_s"])
        params["beta"] = min(1.0, 0.1 / params["tau_r_s"])
    if name == "lrc-fig8":
        doc = figures.fig8(out, delay, params)
        res = doc["verdict"]
    elif name == "lrc-fig9":
        res = figures.fig9(out, delay, params)["verdict"]
    elif name == "lrc-fig10":
        res = figures.fig10(out, delay, params)
    elif name == "lrc-fig11":
        from experiments.lrcsim import shuffle
        res = shuffle.fig11(out)
    elif name == "lrc-delay-table":
        doc = figures.delay_table(out)
        res = {"table": str(out / "delay_table.md"),
               "mismatch": figures.delay_mismatch(out)["rows"]}
        if not as_json:
            print((out / "delay_table.md").read_text())
    elif name == "lrc-validate":
        res = {"eq7": validate.worst("single", range(20)), "weighted_max_min": validate.worst("multi", range(100))}
        out.mkdir(parents=True, exist_ok=True)
        (out / "lrc_validate.json").write_text(json.dumps(res, indent=1))
    else:
        print(f"bwfabric simulate: unknown {name!r}; known: lrc SCENARIO, "
              + ", ".join(f"{k} ({v})" for k, v in FIGURES.items()), file=sys.stderr)
        return 2
    print(json.dumps(res, indent=1))
    if not as_json:
        print(f"results in {out}/", file=sys.stderr)
    return 0
