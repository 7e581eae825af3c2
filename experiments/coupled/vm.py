"""coupled-vm: LIA vs LIA-VM vs uncoupled under VM scheduling, slices 30/120/480 ms (seed paper Fig. 7a).

    bwfabric experiment coupled-vm [key=value ...]      (the options: :class:`Config`)
    python -m experiments.coupled vm [--key value ...]
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.coupled import report
from experiments.coupled.report import mean
from experiments.coupled.testbed import vm_gate, goodputs

KIND = 'vm'
HELP = 'LIA vs LIA-VM vs uncoupled under VM scheduling, slices 30/120/480 ms (seed paper Fig. 7a)'


@dataclass
class Config:
    """The options of coupled-vm and their defaults (the one source: the
    registry and ``python -m experiments.coupled`` both read this)."""
    seconds: float = 15.0
    slices: tuple[float, ...] = (30.0, 120.0, 480.0)
    runs: int = 2
    gate: str = "ba"


def measure(cfg: Config):
    return vm(cfg.seconds, list(cfg.slices), cfg.runs, gate_dir=cfg.gate)


def run(cfg: Config, out_dir):
    """The registry's entry: result.json (and figure.png) in ``out_dir``."""
    return report.run(KIND, measure, draw, cfg, out_dir)


def vm(seconds: float, slices: list[float], runs: int, gate_dir: str, mbps: float = 100.0) -> dict:
    """LIA and LIA-VM on two 100 Mb/s paths of 0.5 ms RTT, the sender a VM
    sharing its CPU with three others (on a slice, off three): by default
    what reaches it (the ACKs) waits for its slices, while what it sent
    drains (``gate_dir`` "ba"; "both" holds both directions, and caps the
    goodput at the duty cycle whatever the control): goodput of each (the
    seed paper's Fig. 7a)."""
    return {"rows": [{"slice_ms": sl, **goodputs(seconds, runs, vm_gate(sl, direction=gate_dir), mbps)}
                     for sl in [None, *slices]]}


def draw(out: dict, ax, guest: bool = False) -> None:
    rows = out["rows"]
    xs = ["none" if r["slice_ms"] is None else f"{r['slice_ms']:g}" for r in rows]
    for k, kind in enumerate(("lia", "lia_vm", "uncoupled")):
        ax.bar([i + 0.27 * (k - 1) for i in range(len(rows))], [mean(r[kind]) for r in rows], 0.27, label=kind)
    if guest and rows[0]["slice_ms"] is None:
        bound = out["duty"] * mean(rows[0]["lia"])
        ax.hlines([bound] * (len(rows) - 1), [i - 0.45 for i in range(1, len(rows))],
                  [i + 0.45 for i in range(1, len(rows))], colors="k", linestyles="dashed",
                  label="duty x unscheduled LIA")
    ax.set_xticks(range(len(rows)), xs)
    ax.set_xlabel("VM slice (ms; off 3 slices)")
    ax.set_ylabel("goodput (Mb/s)")
