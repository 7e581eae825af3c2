"""LRC's equilibrium against the ideal, on generated instances.

- single bottleneck, no guarantees: Eq. 7, v_i = w_i·μC/Σw;
- random multi-bottleneck fabrics (2-6 links of 100-1000 Mb/s, 2-8 flows
  crossing 1-3 links, weights 0.5-4, half the flows with guarantees of up
  to 60 % of their narrowest link, scaled so no link's guarantees exceed
  60 % of μC): weighted max-min with guarantees, a_i = max(B_i, w_i·x),
  computed by :func:`experiments.maxmin.weighted_max_min`.

Each instance is simulated to steady state; the figure is the worst
relative error of a flow's steady rate against the ideal.
"""

from __future__ import annotations

import numpy as np

from experiments.lrcsim.engine import Run
from experiments.lrcsim.report import summarize
from experiments.lrcsim.scenario import Scenario, parse


def single_bottleneck(seed: int, params: dict | None = None, delay_s: float = 0.2) -> Scenario:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 9))
    flows = [{"id": f"f{j}", "weight": float(np.round(rng.uniform(0.5, 4), 2)), "links": ["L"],
              "start_s": float(np.round(rng.uniform(0, 5), 2))} for j in range(n)]
    return parse({"duration_s": 30, "delay_s": delay_s, "params": params or {}, "steady_window_s": 3,
                  "links": [{"id": "L", "capacity_mbps": float(rng.choice([100, 1000]))}], "flows": flows})


def multi_bottleneck(seed: int, params: dict | None = None, delay_s: float = 0.2) -> Scenario:
    rng = np.random.default_rng(seed)
    nl, nf = int(rng.integers(2, 7)), int(rng.integers(2, 9))
    links = [{"id": f"l{i}", "capacity_mbps": float(rng.choice([100, 200, 500, 1000]))} for i in range(nl)]
    mu_c = {link["id"]: 0.9 * link["capacity_mbps"] for link in links}
    flows = []
    for j in range(nf):
        on = sorted(rng.choice(nl, int(rng.integers(1, min(3, nl) + 1)), replace=False).tolist())
        f = {"id": f"f{j}", "weight": float(np.round(rng.uniform(0.5, 4), 2)), "links": [f"l{i}" for i in on]}
        if rng.random() < 0.5:
            f["guarantee_mbps"] = float(rng.uniform(0, 0.6)) * min(mu_c[x] for x in f["links"])
        flows.append(f)
    for link in links:                      # no link's guarantees above 60 % of μC (admission)
        total = sum(f.get("guarantee_mbps", 0.0) for f in flows if link["id"] in f["links"])
        if total > 0.6 * mu_c[link["id"]]:
            for f in flows:
                if link["id"] in f["links"] and "guarantee_mbps" in f:
                    f["guarantee_mbps"] *= 0.6 * mu_c[link["id"]] / total
    return parse({"duration_s": 30, "delay_s": delay_s, "params": params or {}, "steady_window_s": 3,
                  "links": links, "flows": flows})


def errors(sc: Scenario) -> list[tuple[str, float, float, float]]:
    """(flow, steady rate, ideal, relative error) per flow."""
    run = Run(sc)
    s = summarize(run, run.run())
    out = []
    for fid, f in s["flows"].items():
        out.append((fid, f["steady_rate_mbps"], f["ideal_mbps"],
                    abs(f["steady_rate_mbps"] - f["ideal_mbps"]) / f["ideal_mbps"]))
    return out


def worst(kind, seeds, params: dict | None = None, delay_s: float = 0.2) -> dict:
    make = {"single": single_bottleneck, "multi": multi_bottleneck}[kind]
    worst_err, at_floor, n_flows = 0.0, 0, 0
    for seed in seeds:
        sc = make(seed, params, delay_s)
        g = {f.id: f.guarantee_mbps for f in sc.flows}
        for fid, rate, ideal, err in errors(sc):
            n_flows += 1
            worst_err = max(worst_err, err)
            at_floor += g[fid] > 0 and abs(ideal - g[fid]) < 1e-6 * max(1.0, ideal)
    return {"kind": kind, "instances": len(list(seeds)), "flows": n_flows, "flows_held_at_their_guarantee": at_floor,
            "worst_relative_error": worst_err}
