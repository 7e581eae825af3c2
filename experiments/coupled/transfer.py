"""coupled-transfer: time to move 61 MB (the paper's 610 MB / 10) at a 480 ms slice, LIA vs LIA-VM (Fig. 8).

    bwfabric experiment coupled-transfer [key=value ...]      (the options: :class:`Config`)
    python -m experiments.coupled transfer [--key value ...]
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.coupled import report
from experiments.coupled.report import mean
from experiments.coupled.testbed import Path, testbed, select, run_flows, vm_gate

KIND = 'transfer'
HELP = "time to move 61 MB (the paper's 610 MB / 10) at a 480 ms slice, LIA vs LIA-VM (Fig. 8)"


@dataclass
class Config:
    """The options of coupled-transfer and their defaults (the one source: the
    registry and ``python -m experiments.coupled`` both read this)."""
    runs: int = 2
    size_mb: float = 61.0
    slice_ms: float = 480.0


def measure(cfg: Config):
    return transfer(cfg.runs, cfg.size_mb, cfg.slice_ms)


def run(cfg: Config, out_dir):
    """The registry's entry: result.json (and figure.png) in ``out_dir``."""
    return report.run(KIND, measure, draw, cfg, out_dir)


def transfer(runs: int, size_mb: float, slice_ms: float) -> dict:
    """The seed paper's Fig. 8, scaled: the time to move ``size_mb`` MB
    (the paper: 610 MB) over two 100 Mb/s paths with the sender a
    descheduled VM (on a slice, off three), LIA vs LIA-VM."""
    gate = vm_gate(slice_ms)
    out: dict = {"size_mb": size_mb, "slice_ms": slice_ms}
    for kind in ("lia", "lia_vm", "uncoupled"):
        times = []
        for _ in range(runs):
            with testbed([Path(250, 100, gate=gate), Path(250, 100, gate=gate)]) as bed:
                select(bed.all_addrs(), kind)
                try:
                    f = run_flows(bed, 600, mptcp=1, warm=0.0, size=int(size_mb * 1e6))["flows"][0]
                finally:
                    select(bed.all_addrs(), "bgwc")
            times.append(f["seconds"])
        out[kind] = times
    return out


def draw(out: dict, ax) -> None:
    kinds = [k for k in ("lia", "lia_vm", "uncoupled") if k in out]
    ax.bar(range(len(kinds)), [mean(out[k]) for k in kinds])
    ax.set_xticks(range(len(kinds)), kinds)
    ax.set_ylabel(f"seconds to move {out['size_mb']:g} MB")
