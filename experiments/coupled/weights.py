"""coupled-weights: LIA vs LIA-VM vs uncoupled as the sender VM's scheduler weight changes (seed paper Fig. 7b).

    bwfabric experiment coupled-weights [key=value ...]      (the options: :class:`Config`)
    python -m experiments.coupled weights [--key value ...]
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.coupled import report
from experiments.coupled.report import mean
from experiments.coupled.testbed import vm_gate, goodputs

KIND = 'weights'
HELP = "LIA vs LIA-VM vs uncoupled as the sender VM's scheduler weight changes (seed paper Fig. 7b)"


@dataclass
class Config:
    """The options of coupled-weights and their defaults (the one source: the
    registry and ``python -m experiments.coupled`` both read this)."""
    seconds: float = 10.0
    runs: int = 2
    weights: tuple[float, ...] = (128.0, 256.0, 512.0, 1024.0)
    slice_ms: float = 30.0


def measure(cfg: Config):
    return weights(cfg.seconds, cfg.runs, list(cfg.weights), cfg.slice_ms)


def run(cfg: Config, out_dir):
    """The registry's entry: result.json (and figure.png) in ``out_dir``."""
    return report.run(KIND, measure, draw, cfg, out_dir)


def weights(seconds: float, runs: int, weights_: list[float], slice_ms: float, mbps: float = 100.0) -> dict:
    """The seed paper's Fig. 7b: the sender VM's scheduler weight. Three
    other VMs of the default weight (256) share its CPU; a VM of weight w
    then runs one slice in (w + 3 x 256) / w: on ``slice_ms``, off
    3 x ``slice_ms`` x 256 / w (a proportional-share scheduler's duty
    cycle; the gate as in :func:`vm`)."""
    out = []
    for w in weights_:
        if not w > 0 or w == float("inf"):
            raise ValueError(f"weight {w!r} must be a finite number > 0")
        out.append({"weight": w, "duty": w / (w + 3 * 256),
                    **goodputs(seconds, runs, vm_gate(slice_ms, 3 * slice_ms * 256 / w), mbps)})
    return {"slice_ms": slice_ms, "rows": out}


def draw(out: dict, ax) -> None:
    rows = out["rows"]
    for k, kind in enumerate(("lia", "lia_vm", "uncoupled")):
        ax.bar([i + 0.27 * (k - 1) for i in range(len(rows))], [mean(r[kind]) for r in rows], 0.27, label=kind)
    ax.set_xticks(range(len(rows)), [f"{r['weight']:g}" for r in rows])
    ax.set_xlabel(f"sender VM's weight (3 others at 256; slice {out['slice_ms']:g} ms)")
    ax.set_ylabel("goodput (Mb/s)")
