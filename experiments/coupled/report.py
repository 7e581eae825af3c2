"""What every coupled-* experiment does around its measurement: the agent's
BPF programs loaded first, result.json and the figure written, the result
printed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from hostagent import cc


def mean(values) -> float:
    return sum(values) / len(values)


def figure(kind: str, out, path, draw: Callable) -> None:
    """``draw(out, ax)`` on one figure, titled by the experiment, saved as PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.6))
    try:
        draw(out, ax)
        ax.set_title(f"experiments.coupled {kind}")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)


def run(kind: str, measure: Callable, draw: Callable | None, cfg, out_dir) -> dict | list:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cc.load()
    out = measure(cfg)
    (out_dir / "result.json").write_text(json.dumps(out, indent=1, default=str))
    if draw is not None:
        figure(kind, out, out_dir / "figure.png", draw)
    print(json.dumps(out, indent=1, default=str))
    return out
