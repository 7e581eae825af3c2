"""coupled-cubic: a CUBIC flow's goodput next to LIA / LIA-VM / uncoupled MPTCP (seed paper Figs. 9-10).

    bwfabric experiment coupled-cubic [key=value ...]      (the options: :class:`Config`)
    python -m experiments.coupled cubic [--key value ...]
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.coupled import report
from experiments.coupled.report import mean
from experiments.coupled.testbed import Path, testbed, select, run_flows, vm_gate, FREE_TOS

KIND = 'cubic'
HELP = "a CUBIC flow's goodput next to LIA / LIA-VM / uncoupled MPTCP (seed paper Figs. 9-10)"


@dataclass
class Config:
    """The options of coupled-cubic and their defaults (the one source: the
    registry and ``python -m experiments.coupled`` both read this)."""
    seconds: float = 15.0
    runs: int = 2
    slice_ms: float | None = None


def measure(cfg: Config):
    return cubic(cfg.seconds, cfg.runs, cfg.slice_ms)


def run(cfg: Config, out_dir):
    """The registry's entry: result.json (and figure.png) in ``out_dir``."""
    return report.run(KIND, measure, draw, cfg, out_dir)


def cubic(seconds: float, runs: int, slice_ms: float | None) -> dict:
    """The seed paper's Figs. 9-10: an MPTCP connection (LIA or LIA-VM) on
    two 100 Mb/s paths of 0.5 ms RTT and one CUBIC flow on the first path:
    the CUBIC flow's goodput next to each. ``slice_ms``: the sender VM
    descheduled (on a slice, off three; what reaches it held while off);
    the CUBIC flow is another VM's, on no schedule -- its frames (TOS
    0x28, reflected by the receiver) take an ungated delay line of their
    own into the same token bucket."""
    gate = vm_gate(slice_ms)
    out: dict = {"slice_ms": slice_ms}
    for kind in ("lia", "lia_vm", "uncoupled"):
        rows = []
        for _ in range(runs):
            with testbed([Path(250, 100, gate=gate, free_tos=FREE_TOS), Path(250, 100, gate=gate)]) as bed:
                select(bed.all_addrs(), kind)
                try:
                    f = run_flows(bed, seconds, mptcp=1, tcp=1, tcp_cc="cubic", tcp_tos=FREE_TOS[0])["flows"]
                finally:
                    select(bed.all_addrs(), "bgwc")
            rows.append({"mptcp_mbps": f[0]["mbps"], "cubic_mbps": f[1]["mbps"]})
        out[kind] = rows
    return out


def draw(out: dict, ax) -> None:
    kinds = [k for k in ("lia", "lia_vm", "uncoupled") if k in out]
    ax.bar([i - 0.2 for i in range(len(kinds))], [mean([r["mptcp_mbps"] for r in out[k]]) for k in kinds], 0.4,
           label="MPTCP")
    ax.bar([i + 0.2 for i in range(len(kinds))], [mean([r["cubic_mbps"] for r in out[k]]) for k in kinds], 0.4,
           label="CUBIC flow")
    ax.set_xticks(range(len(kinds)), kinds)
    ax.set_ylabel("goodput (Mb/s)")
