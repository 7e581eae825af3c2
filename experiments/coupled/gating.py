"""coupled-gating: RTT samples, sRTT, alpha, windows and goodput of LIA / LIA-VM per VM slice (Figs. 4-6, traced).

    bwfabric experiment coupled-gating [key=value ...]      (the options: :class:`Config`)
    python -m experiments.coupled gating [--key value ...]
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.coupled import report
from experiments.coupled.testbed import Path, testbed, select, Tracer, run_flows, vm_gate, quantile
from hostagent import bpfring
from hostagent.plan import MPTCP_CCS

KIND = 'gating'
HELP = 'RTT samples, sRTT, alpha, windows and goodput of LIA / LIA-VM per VM slice (Figs. 4-6, traced)'


@dataclass
class Config:
    """The options of coupled-gating and their defaults (the one source: the
    registry and ``python -m experiments.coupled`` both read this)."""
    seconds: float = 10.0
    slices: tuple[float, ...] = (30.0, 120.0, 480.0)


def measure(cfg: Config):
    return gating(cfg.seconds, list(cfg.slices))


def run(cfg: Config, out_dir):
    """The registry's entry: result.json (and figure.png) in ``out_dir``."""
    return report.run(KIND, measure, draw, cfg, out_dir)


def gating(seconds: float, slices: list[float], mbps: float = 100.0) -> dict:
    """The seed paper's Figs. 4-6 through the BPF controls: for each slice
    (and none), LIA and LIA-VM traced on the two gated paths of
    :func:`vm`: the RTT samples the programs saw (median, 90th
    percentile), the sRTT they kept, the alpha they used, their windows
    (segments) and the goodput."""
    out = []
    for sl in [None, *slices]:
        gate = vm_gate(sl)
        row: dict = {"slice_ms": sl}
        for kind in ("lia", "lia_vm"):
            with testbed([Path(250, mbps, gate=gate), Path(250, mbps, gate=gate)]) as bed:
                select(bed.all_addrs(), kind)
                try:
                    with Tracer() as tr:
                        mb = run_flows(bed, seconds, mptcp=1)["flows"][0]["mbps"]
                finally:
                    select(bed.all_addrs(), "bgwc")
            recs = [r for r in tr.records if r.kind == MPTCP_CCS.index(kind)]
            samples = [r for r in recs if r.type == bpfring.REC_SAMPLE]
            incs = [r for r in recs if r.type == bpfring.REC_INCREASE and not r.flags & 1]   # congestion avoidance
            row[kind] = {
                "mbps": mb, "records": len(recs),
                "rtt_us": {"median": quantile([r.rtt for r in samples], 0.5),
                           "p90": quantile([r.rtt for r in samples], 0.9)},
                "srtt_us": {"median": quantile([r.srtt8 / 8 for r in samples], 0.5),
                            "p90": quantile([r.srtt8 / 8 for r in samples], 0.9)},
                "alpha": {"median": quantile([r.alpha / 65536 for r in incs], 0.5),
                          "mean": sum(r.alpha for r in incs) / 65536 / len(incs) if incs else None},
                "cwnd": {"median": quantile([r.cwnd_after for r in recs if r.type != bpfring.REC_SAMPLE], 0.5)},
                "off_periods": sum(1 for r in samples if r.flags & 2)}
        out.append(row)
    return {"rows": out}


def draw(out: dict, ax) -> None:
    rows = out["rows"]
    xs = ["none" if r["slice_ms"] is None else f"{r['slice_ms']:g}" for r in rows]
    ax2 = ax.twinx()
    for kind, style in (("lia", "o-"), ("lia_vm", "s--")):
        ax.plot(xs, [r[kind]["srtt_us"]["p90"] / 1e3 for r in rows], style, label=f"{kind} sRTT p90 (ms)")
        ax2.plot(xs, [r[kind]["alpha"]["median"] for r in rows], style, color="grey", label=f"{kind} alpha")
    ax.set_yscale("log")
    ax.set_xlabel("VM slice (ms; off 3 slices)")
    ax.set_ylabel("sRTT the control kept, 90th pct (ms)")
    ax2.set_ylabel("median alpha (grey)")
