"""coupled-lia-shared: LIA vs one TCP flow on one bottleneck (ratio), uncoupled and TCP/TCP beside it.

    bwfabric experiment coupled-lia-shared [key=value ...]      (the options: :class:`Config`)
    python -m experiments.coupled lia-shared [--key value ...]
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.coupled import report
from experiments.coupled.report import mean
from experiments.coupled.testbed import Path, testbed, select, run_flows

KIND = 'lia-shared'
HELP = 'LIA vs one TCP flow on one bottleneck (ratio), uncoupled and TCP/TCP beside it'


@dataclass
class Config:
    """The options of coupled-lia-shared and their defaults (the one source: the
    registry and ``python -m experiments.coupled`` both read this)."""
    seconds: float = 15.0
    runs: int = 3


def measure(cfg: Config):
    return lia_shared(cfg.seconds, cfg.runs)


def run(cfg: Config, out_dir):
    """The registry's entry: result.json (and figure.png) in ``out_dir``."""
    return report.run(KIND, measure, draw, cfg, out_dir)


def lia_shared(seconds: float, runs: int, delay_us: float = 2500, mbps: float = 50) -> dict:
    """RFC 6356's goal on a shared bottleneck: one MPTCP connection of two
    subflows and one Reno TCP flow through the same token bucket (50 Mb/s,
    5 ms base RTT, a FIFO of 2 bandwidth-delay products): goodput ratio
    MPTCP / TCP for LIA and for uncoupled Reno subflows, next to two TCP
    flows (the ratio's noise floor); and LIA alone on two disjoint paths
    (it should use both)."""
    out: dict = {}
    bdp = mbps * 1e6 / 8 * 2 * delay_us * 1e-6
    for kind in ("lia", "uncoupled", "tcp"):
        ratios = []
        for _ in range(runs):
            with testbed([Path(delay_us, mbps, addrs=2, queue_bytes=int(2 * bdp))]) as bed:
                if kind != "tcp":
                    select(bed.all_addrs(), kind)
                try:
                    flows = run_flows(bed, seconds, mptcp=0 if kind == "tcp" else 1, tcp=2 if kind == "tcp" else 1)
                finally:
                    select(bed.all_addrs(), "bgwc")
            f = flows["flows"]
            ratios.append(f[0]["mbps"] / f[1]["mbps"])
        out[f"{kind}_ratio"] = ratios
    with testbed([Path(delay_us, mbps), Path(delay_us, mbps)]) as bed:
        select(bed.all_addrs(), "lia")
        try:
            out["lia_disjoint_mbps"] = run_flows(bed, seconds, mptcp=1)["flows"][0]["mbps"]
        finally:
            select(bed.all_addrs(), "bgwc")
    out["disjoint_capacity_mbps"] = 2 * mbps
    return out


def draw(out: dict, ax) -> None:
    keys = [k for k in out if k.endswith("_ratio")]
    ax.bar(range(len(keys)), [mean(out[k]) for k in keys])
    for i, k in enumerate(keys):
        ax.plot([i] * len(out[k]), out[k], "k.")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(keys)), [k.replace("_ratio", "") for k in keys])
    ax.set_ylabel("goodput / competing TCP flow")
