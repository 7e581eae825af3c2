"""Result statistics, fidelity, JSON output and plots."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

from experiments.maxmin import max_min_fair
from controller.network_view import NetworkView

# Userspace OVS on this machine forwards about 65-75k packets/s in total,
# counted once per switch crossed (docs/platform.md); past this, results degrade.
ENVELOPE_PKT_HOPS_PER_S = 60000


def percentile(values: Sequence[float], p: float) -> float | None:
    """Linear-interpolated percentile (p in 0..100); None for no values."""
    vals = sorted(values)
    if not vals:
        return None
    if len(vals) == 1:
        return vals[0]
    pos = (len(vals) - 1) * p / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def fct_stats(records: list[dict]) -> dict[str, Any]:
    done = [r["fct"] for r in records if r.get("complete")]
    return {"flows": len(records), "completed": len(done),
            "mean_fct_s": mean(done), "p95_fct_s": percentile(done, 95)}


def max_min_ideal_mbps(view: NetworkView, paths: list[tuple[str, ...]]) -> list[float]:
    """Max-min fair rates (Mb/s) of long flows pinned to ``paths``."""
    links = [view.path_links(p) for p in paths]
    cap = {(u, v): view.capacity(u, v) / 1e6 for u, v in view.graph.edges}
    return max_min_fair(links, cap)


def non_blocking_ideal_mbps(view: NetworkView, pairs: list[tuple[str, str]]) -> list[float]:
    """Max-min fair rates if the fabric core were infinitely fast: only the
    hosts' own links limit (the best any routing could do)."""
    links, cap = [], {}
    for src, dst in pairs:
        s_sw, _ = view.host_switch(src)
        d_sw, _ = view.host_switch(dst)
        up, down = (src, s_sw), (d_sw, dst)
        links.append([up, down])
        cap[up] = view.capacity(*up) / 1e6
        cap[down] = view.capacity(*down) / 1e6
    return max_min_fair(links, cap)


def envelope_pkt_hops(view: NetworkView, paths: list[tuple[str, ...]], rates_mbps: list[float],
                      mtu: int) -> float:
    """Packets per second times switches crossed that the given rates need."""
    total = 0.0
    for path, rate in zip(paths, rates_mbps):
        switches = sum(1 for n in path if not view.is_host(n))
        total += rate * 1e6 / (mtu * 8) * switches
    return total


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")


def fmt(value: float | None, spec: str = ".2f", none: str = "n/a") -> str:
    return none if value is None else format(value, spec)


def common_fct_stats(runs: dict[str, list[dict]]) -> dict[str, dict[str, Any]]:
    """FCT statistics per scheme over the flows that *every* scheme completed
    (same flow plan, matched by flow id). Means over each scheme's own
    completions are biased: a scheme that leaves its largest flows unfinished
    looks fast. Also reports each scheme's completed fraction."""
    done = {app: {r["id"]: r["fct"] for r in recs if r.get("complete")} for app, recs in runs.items()}
    common = set.intersection(*(set(d) for d in done.values())) if done else set()
    out = {}
    for app, recs in runs.items():
        fcts = [done[app][i] for i in sorted(common)]
        out[app] = {"common_flows": len(common), "mean_fct_s": mean(fcts), "p95_fct_s": percentile(fcts, 95),
                    "completed_fraction": len(done[app]) / len(recs) if recs else None}
    return out
