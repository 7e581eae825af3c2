"""What a simulated run shows, in the issue's terms.

- per flow: steady-state rate and enforced limit (means over the last
  ``steady_window_s`` before the flow stops or the run ends), the limit's
  coefficient of variation over that window, and the ideal: weighted
  max-min with guarantees (:func:`experiments.maxmin.weighted_max_min`, at
  μC) for the flows active at that moment;
- per epoch (a span with one set of active flows): the time from its start
  until the links that the ideal fills carry ≥ 95 % of μC *and stay
  there* to the epoch's end, and the time until Jain's index of the rates
  normalised by the ideal (x_i / a_i) is ≥ 0.9 and stays there (plain
  Jain's index would call Fig. 8's right answer, 600:300, unfair);
- the peak over the run of Σ limits / μC on any link.
"""

from __future__ import annotations

import math

import numpy as np

from experiments.maxmin import weighted_max_min
from experiments.lrcsim.engine import Run, Trace, jain


def ideal(run: Run, active: np.ndarray) -> np.ndarray:
    sc = run.sc
    idx = [j for j in range(len(sc.flows)) if active[j]]
    out = np.zeros(len(sc.flows))
    if not idx:
        return out
    cap = {lid: float(m) for lid, m in zip(run.link_ids, run.muC)}
    flows = [sc.flows[j] for j in idx]
    rates = weighted_max_min([f.links for f in flows], cap, [f.weight for f in flows],
                             [f.guarantee_mbps for f in flows],
                             [f.demand_mbps if f.demand_mbps is not None else math.inf for f in flows])
    out[idx] = rates
    return out


def _settles(t: np.ndarray, ok: np.ndarray, start: float) -> float | None:
    """Time from ``start`` until ``ok`` holds for every later sample."""
    if not ok.size or not ok[-1]:
        return None
    bad = np.nonzero(~ok)[0]
    first_good = bad[-1] + 1 if bad.size else 0
    return float(t[first_good] - start)


def summarize(run: Run, tr: Trace) -> dict:
    sc = run.sc
    t = np.asarray(tr.t)
    lim = np.asarray(tr.limit)
    rate = np.asarray(tr.rate)
    load = np.asarray(tr.link_load)
    lsum = np.asarray(tr.link_limits)
    active = ~np.isnan(rate)
    flows = {}
    for j, f in enumerate(sc.flows):
        end = min(f.stop_s or sc.duration_s, sc.duration_s)
        m = (t >= end - sc.steady_window_s) & (t < end) & active[:, j]
        if not m.any():
            flows[f.id] = {"active": False}
            continue
        at = int(np.nonzero(m)[0][-1])
        a = ideal(run, active[at])
        mean_lim = float(np.mean(lim[m, j]))
        flows[f.id] = {"steady_rate_mbps": float(np.mean(rate[m, j])), "steady_limit_mbps": mean_lim,
                       "limit_cov": float(np.std(lim[m, j]) / mean_lim) if mean_lim > 0 else 0.0,
                       "ideal_mbps": float(a[j])}
    epochs = []
    bounds = [e for e in run.events if e < sc.duration_s] + [sc.duration_s]
    if not run.short:                        # short flows change the active set all the time: no epochs
        for a_, b_ in zip(bounds, bounds[1:]):
            m = (t >= a_) & (t < b_)
            if not m.any():
                continue
            act = active[m][-1]
            if not act.any():
                continue
            want = ideal(run, act)
            full = (run.A @ want) >= run.muC * (1 - 1e-6)
            ok_util = np.all(load[m][:, full] >= 0.95 * run.muC[full], axis=1) if full.any() else None
            norm = np.where(act & (want > 0), rate[m] / np.where(want > 0, want, 1.0), np.nan)
            ok_jain = np.array([jain(row[~np.isnan(row)]) >= 0.9 for row in norm])
            epochs.append({"start_s": float(a_), "end_s": float(b_), "flows": [f.id for j, f in
                                                                               enumerate(sc.flows) if act[j]],
                           "time_to_95pct_utilisation_s": _settles(t[m], ok_util, a_) if ok_util is not None
                           else None,
                           "time_to_jain_0_9_s": _settles(t[m], ok_jain, a_)})
    times_u = [e["time_to_95pct_utilisation_s"] for e in epochs if e["time_to_95pct_utilisation_s"] is not None]
    times_j = [e["time_to_jain_0_9_s"] for e in epochs if e["time_to_jain_0_9_s"] is not None]
    unsettled = [e["start_s"] for e in epochs if e["time_to_jain_0_9_s"] is None]
    return {
        "controller": sc.controller, "delay_s": sc.delay_s, "params": sc.params.model_dump(),
        "flows": flows, "epochs": epochs,
        "time_to_95pct_utilisation_s": max(times_u) if times_u else None,
        "time_to_jain_0_9_s": max(times_j) if times_j and not unsettled else None,
        "peak_limits_over_muC": float(np.max(lsum / run.muC)) if lsum.size else 0.0,
        "mean_utilisation_of_C": float(np.mean(load / run.C)) if load.size else 0.0,
    }
