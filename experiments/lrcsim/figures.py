"""The paper's §V-B figures (8, 9, 10) and the delay × β table, simulated.

Each figure runs LRC (the product's classes) and the ElasticSwitch-like
allocator on the same scenario and writes ``<name>.json`` and
``<name>.png`` under the output directory. Port statistics carry 2 %
noise in these runs (``load_noise``) so that LRC's steadiness is not an
artefact of exact measurements.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from experiments.lrcsim.engine import Run
from experiments.lrcsim.report import summarize
from experiments.lrcsim.scenario import parse

# the delay from the end of a port-statistics interval to the factor at the
# host, until the emulation measures ours (see docs/lrc.md)
DEFAULT_DELAY_S = 0.2
NOISE = 0.02
LINK = [{"id": "L", "capacity_mbps": 1000}]      # μ = 0.9: μC = 900 Mb/s, the paper's


def simulate(data: dict):
    sc = parse(data)
    run = Run(sc)
    tr = run.run()
    return run, tr, summarize(run, tr)


def _series(run, tr) -> dict:
    t = np.asarray(tr.t)
    keep = slice(None, None, max(1, int(round(0.1 / run.sc.record_every_s))))    # 100 ms in the JSON
    lim, rate = np.asarray(tr.limit)[keep], np.asarray(tr.rate)[keep]
    out = {"t_s": t[keep].round(3).tolist(), "limit_mbps": {}, "rate_mbps": {}}
    for j, fid in enumerate(run.flow_ids):
        out["limit_mbps"][fid] = [None if np.isnan(x) else round(float(x), 2) for x in lim[:, j]]
        out["rate_mbps"][fid] = [None if np.isnan(x) else round(float(x), 2) for x in rate[:, j]]
    out["link_load_mbps"] = {lid: np.asarray(tr.link_load)[keep][:, i].round(2).tolist()
                             for i, lid in enumerate(run.link_ids)}
    return out


def _plot(path: Path, title: str, runs: dict, mu_c: float) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(runs), figsize=(5.5 * len(runs), 3.8), sharey=True)
    axes = np.atleast_1d(axes)
    for ax, (name, (run, tr, _)) in zip(axes, runs.items()):
        t, lim = np.asarray(tr.t), np.asarray(tr.limit)
        for j, fid in enumerate(run.flow_ids):
            ax.plot(t, lim[:, j], lw=1.1, label=f"{fid} limit")
        ax.plot(t, np.nansum(lim, axis=1), lw=0.8, color="grey", ls=":", label="Σ limits")
        ax.axhline(mu_c, color="k", lw=0.6, ls="--", label="μC")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("time (s)")
    axes[0].set_ylabel("rate limit (Mb/s)")
    axes[-1].legend(fontsize=7, loc="upper right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _write(out: Path, name: str, doc: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1))


def _cov(summary: dict) -> float:
    flows = [f for f in summary["flows"].values() if f.get("limit_cov") is not None]
    return float(np.mean([f["limit_cov"] for f in flows])) if flows else 0.0


def _pair(name: str, flows: list, duration: float, delay_s: float, params: dict, out: Path, title: str,
          steady_window_s: float = 10.0):
    base = {"duration_s": duration, "delay_s": delay_s, "links": LINK, "flows": flows, "load_noise": NOISE,
            "steady_window_s": steady_window_s}
    if params.get("tau_v_s") and params["tau_v_s"] < 0.05:
        base["record_every_s"] = 0.015 if abs(params["tau_v_s"] - 0.015) < 1e-9 else 0.005
    runs = {"LRC": simulate({**base, "params": params}),
            "ElasticSwitch-like": simulate({**base, "controller": "elastic"})}
    _plot(out / f"{name}.png", title, runs, 900.0)
    doc = {"figure": name, "delay_s": delay_s, "params": params,
           "summary": {k: v[2] for k, v in runs.items()},
           "limit_cov": {k: _cov(v[2]) for k, v in runs.items()},
           "series": {k: _series(v[0], v[1]) for k, v in runs.items()}}
    _write(out, name, doc)
    return doc


def fig8(out: Path, delay_s: float = DEFAULT_DELAY_S, params: dict | None = None) -> dict:
    """X: B = 600 on μC = 900, Y: no guarantee, equal weights, Y joins at 15 s."""
    flows = [{"id": "X", "guarantee_mbps": 600, "links": ["L"]}, {"id": "Y", "links": ["L"], "start_s": 15}]
    doc = _pair("fig8", flows, 30, delay_s, params or {}, out,
                f"Fig. 8: X (B = 600) alone, Y joins at 15 s; delay {delay_s:g} s")
    lrc, es = doc["summary"]["LRC"], doc["summary"]["ElasticSwitch-like"]
    doc["verdict"] = {
        "time_to_95pct_utilisation_s": lrc["time_to_95pct_utilisation_s"],
        "time_to_jain_0_9_s": lrc["time_to_jain_0_9_s"],
        "peak_limits_over_muC": lrc["peak_limits_over_muC"],
        "cov_lrc_over_elastic": doc["limit_cov"]["LRC"] / doc["limit_cov"]["ElasticSwitch-like"]
        if doc["limit_cov"]["ElasticSwitch-like"] > 0 else None,
        "steady_mbps": {f: round(v["steady_rate_mbps"], 1) for f, v in lrc["flows"].items()},
        "elastic_steady_mbps": {f: round(v["steady_rate_mbps"], 1) for f, v in es["flows"].items()},
    }
    v = doc["verdict"]
    v["meets_bars"] = bool(v["time_to_95pct_utilisation_s"] is not None and v["time_to_95pct_utilisation_s"] <= 4
                           and v["time_to_jain_0_9_s"] is not None and v["time_to_jain_0_9_s"] <= 3
                           and v["peak_limits_over_muC"] <= 1.10
                           and v["cov_lrc_over_elastic"] is not None and v["cov_lrc_over_elastic"] <= 0.25)
    _write(out, "fig8", doc)
    return doc


def fig9(out: Path, delay_s: float = DEFAULT_DELAY_S, params: dict | None = None) -> dict:
    """No guarantees, weights 1:2; Y joins at 15 s; 60 s."""
    flows = [{"id": "X", "weight": 1, "links": ["L"]}, {"id": "Y", "weight": 2, "links": ["L"], "start_s": 15}]
    doc = _pair("fig9", flows, 60, delay_s, params or {}, out,
                f"Fig. 9: weights 1:2, no guarantees; delay {delay_s:g} s", steady_window_s=20)
    doc["verdict"] = {name: {"ratio_Y_to_X": s["flows"]["Y"]["steady_rate_mbps"] / s["flows"]["X"]["steady_rate_mbps"],
                             "limit_cov": doc["limit_cov"][name]}
                      for name, s in doc["summary"].items()}
    _write(out, "fig9", doc)
    return doc


def fig10(out: Path, delay_s: float = DEFAULT_DELAY_S, params: dict | None = None,
          rates_per_s=(5.0, 20.0)) -> dict:
    """X (B = 450) saturates the link; Y's short flows of 435 kB arrive as a
    Poisson process from 15 s to 60 s."""
    docs = {}
    for rate in rates_per_s:
        flows = [{"id": "X", "guarantee_mbps": 450, "links": ["L"]},
                 {"id": "Y", "links": ["L"], "arrivals": {"rate_per_s": rate, "size_bytes": 435e3, "start_s": 15,
                                                          "stop_s": 60}}]
        base = {"duration_s": 60, "delay_s": delay_s, "links": LINK, "flows": flows, "load_noise": NOISE}
        runs = {"LRC": simulate({**base, "params": params or {}}),
                "ElasticSwitch-like": simulate({**base, "controller": "elastic"})}
        name = f"fig10_{rate:g}per_s"
        _plot(out / f"{name}.png", f"Fig. 10: X (B = 450) and short flows at {rate:g}/s from 15 s", runs, 900.0)
        res = {}
        for k, (run, tr, s) in runs.items():
            t, rate_x = np.asarray(tr.t), np.asarray(tr.rate)[:, 0]
            load = np.asarray(tr.link_load)[:, 0]
            m = (t >= 15) & (t < 60)
            fct = np.asarray(run.short[1].fct_s)
            res[k] = {"x_mean_mbps": float(np.nanmean(rate_x[m])), "x_min_1s_mbps": float(_min_window(t[m], rate_x[m])),
                      "link_mean_mbps": float(load[m].mean()), "short_flows": int(fct.size),
                      "short_mean_mbps_offered": rate * 435e3 * 8 / 1e6,
                      "short_fct_mean_s": float(fct.mean()) if fct.size else None,
                      "short_fct_p99_s": float(np.percentile(fct, 99)) if fct.size else None,
                      "peak_limits_over_muC": s["peak_limits_over_muC"]}
        docs[name] = {"results": res, "series": {k: _series(v[0], v[1]) for k, v in runs.items()}}
        _write(out, name, {"figure": name, "delay_s": delay_s, **docs[name]})
    return {k: v["results"] for k, v in docs.items()}


def _min_window(t: np.ndarray, x: np.ndarray, window_s: float = 1.0) -> float:
    if not t.size:
        return 0.0
    step = float(t[1] - t[0]) if t.size > 1 else window_s
    n = max(1, int(round(window_s / step)))
    x = np.nan_to_num(x)
    if x.size < n:
        return float(x.mean())
    return float(np.min(np.convolve(x, np.ones(n) / n, mode="valid")))


VARIANTS = {
    # name: LRC parameters
    "paper (α=2, no re-seed, no anti-windup)": {"alpha": 2.0, "rescale": "none", "anti_windup": False,
                                                "saturation": None},
    "issue (α=2, Σw re-seed)": {"alpha": 2.0, "rescale": "weights", "anti_windup": False, "saturation": None},
    "bwfabric (α=10, equilibrium re-seed, anti-windup, full-link drop)": {},
}


def delay_table(out: Path, delays=(0.0, 0.1, 0.2, 0.3, 0.5), betas=(0.5, 1.0, 2.0, 4.0)) -> dict:
    """Peak Σ limits / μC and time to 95 % utilisation, for Fig. 8's
    scenario and a start-up of four pairs without guarantees (weights 1, 1,
    2, 4, at once), per delay × β, for three variants. The controller's
    estimate of the delay (``feedback_delay_s``) is the true one here;
    :func:`delay_mismatch` shows what a wrong estimate costs."""
    scenarios = {
        "fig8": [{"id": "X", "guarantee_mbps": 600, "links": ["L"]}, {"id": "Y", "links": ["L"], "start_s": 15}],
        "startup4": [{"id": f"S{i}", "weight": w, "links": ["L"]} for i, w in enumerate((1, 1, 2, 4))],
    }
    rows = []
    for variant, vparams in VARIANTS.items():
        for sc_name, flows in scenarios.items():
            for d in delays:
                for b in betas:
                    _, _, s = simulate({"duration_s": 30, "delay_s": d, "links": LINK, "flows": flows,
                                        "load_noise": NOISE, "params": {**vparams, "beta": b,
                                                                        "feedback_delay_s": d}})
                    rows.append({"variant": variant, "scenario": sc_name, "delay_s": d, "beta": b,
                                 "peak_limits_over_muC": round(s["peak_limits_over_muC"], 3),
                                 "time_to_95pct_utilisation_s": s["time_to_95pct_utilisation_s"],
                                 "time_to_jain_0_9_s": s["time_to_jain_0_9_s"]})
    doc = {"rows": rows, "noise": NOISE}
    _write(out, "delay_table", doc)
    (out / "delay_table.md").write_text(delay_markdown(rows))
    return doc


def delay_markdown(rows: list[dict]) -> str:
    def cell(r):
        t = r["time_to_95pct_utilisation_s"]
        return f"{r['peak_limits_over_muC']:.2f} / {'—' if t is None else f'{t:.1f}'}"
    lines = []
    for variant in dict.fromkeys(r["variant"] for r in rows):
        for sc_name in dict.fromkeys(r["scenario"] for r in rows):
            sub = [r for r in rows if r["variant"] == variant and r["scenario"] == sc_name]
            betas = sorted({r["beta"] for r in sub})
            lines += [f"**{variant}, {sc_name}** — peak Σ limits/μC / time to 95 % (s)", "",
                      "| delay (s) | " + " | ".join(f"β = {b:g}" for b in betas) + " |",
                      "|---|" + "---|" * len(betas)]
            for d in sorted({r["delay_s"] for r in sub}):
                lines.append(f"| {d:g} | " + " | ".join(cell(next(r for r in sub if r["delay_s"] == d
                                                                  and r["beta"] == b)) for b in betas) + " |")
            lines.append("")
    return "\n".join(lines)


def delay_mismatch(out: Path, estimate_s: float = 0.2, delays=(0.0, 0.1, 0.2, 0.3, 0.5), beta: float = 1.0) -> dict:
    """bwfabric's defaults with the delay estimate fixed while the true
    delay varies (start-up of four pairs, the harder case)."""
    flows = [{"id": f"S{i}", "weight": w, "links": ["L"]} for i, w in enumerate((1, 1, 2, 4))]
    rows = []
    for d in delays:
        _, _, s = simulate({"duration_s": 30, "delay_s": d, "links": LINK, "flows": flows, "load_noise": NOISE,
                            "params": {"beta": beta, "feedback_delay_s": estimate_s}})
        rows.append({"true_delay_s": d, "estimate_s": estimate_s, "beta": beta,
                     "peak_limits_over_muC": round(s["peak_limits_over_muC"], 3),
                     "time_to_95pct_utilisation_s": s["time_to_95pct_utilisation_s"]})
    _write(out, "delay_mismatch", {"rows": rows})
    return {"rows": rows}
