"""BG/WC plots and the per-row share spread printed after a run."""

from __future__ import annotations

from pathlib import Path

from experiments.bgwc.testbed import PAPER_LINK, SENDERS

def share_spread_lines(report: dict) -> list[str]:
    """Table 3 / Figs. 14-15: per row, the error of the mean shares, the
    spread of single runs' errors, and each run's lowest BG / guarantee."""
    rows = report.get("rows") or report.get("runs") or []
    lines = []
    for r in rows:
        if not isinstance(r, dict) or "run_errors" not in r:
            continue
        name = r.get("row") or f"{r.get('conns')} conns, {r.get('policy')}"
        errs = [e for e in r["run_errors"] if e is not None]
        g = r.get("guarantees") or {}
        bg_min = [min((run["bg"][s] / g[s] for s in g if g.get(s)), default=None) for run in r.get("runs", [])]
        bg_min = [b for b in bg_min if b is not None]
        lines.append(f"{name}: error of the mean {r['max_rel_error']:.3f}; single runs "
                     f"{min(errs, default=float('nan')):.3f}..{max(errs, default=float('nan')):.3f}"
                     + (f"; BG/guarantee per run min {min(bg_min):.3f}" if bg_min else ""))
    return lines


def plot(report: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = report.get("rates")
    fig, ax = plt.subplots(figsize=(10, 4.2))
    if rates:
        ts = [r["t"] for r in rates]
        for s in SENDERS:
            for cls, ls in (("bg", "-"), ("wc", "--"), ("udp", ":")):
                ys = [r.get(f"{cls}-{s}", 0.0) for r in rates]
                if any(y > 0.05 for y in ys):
                    ax.plot(ts, ys, ls, lw=1, label=f"{s} {cls}")
        ax.set_xlabel("time (s)")
        ax.set_ylabel("Mb/s at the receiver")
    elif report["config"]["kind"] == "sched":
        runs = report["runs"]
        xs = range(len(runs))
        ax.bar(xs, [r["bg"] for r in runs], 0.6, label="S1 BG")
        ax.bar(xs, [r["wc"] for r in runs], 0.6, bottom=[r["bg"] for r in runs], label="S1 WC")
        g = 350 * report["config"]["link_mbps"] / PAPER_LINK
        ax.axhline(g, color="k", lw=0.8, ls=":", label="guarantee")
        ax.set_xticks(list(xs), [f"{r['variant']}\n{r['demand']}" for r in runs], fontsize=7)
        ax.set_ylabel("Mb/s at the receiver")
    else:
        rows = report.get("rows") or report.get("runs") or []
        labels = [str(r.get("row", (r.get("conns"), r.get("policy")))) for r in rows]
        for i, s in enumerate(("s1", "s2", "s3", "s4")):
            vals = [r["wc"].get(s, 0.0) for r in rows]
            if any(vals):
                ax.bar([j + i * 0.2 for j in range(len(rows))], vals, 0.2, label=f"{s} WC")
        ax.set_xticks(range(len(rows)), labels, fontsize=7)
        ax.set_ylabel("WC Mb/s")
    ax.set_title(f"BG/WC {report['config']['kind']} ({report['scale']})")
    ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

