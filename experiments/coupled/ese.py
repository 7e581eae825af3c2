"""coupled-ese: MPTCP-D's extra-subflow elimination: TP on a shared bottleneck, FP on disjoint paths, per alpha.

    bwfabric experiment coupled-ese [key=value ...]      (the options: :class:`Config`)
    python -m experiments.coupled ese [--key value ...]
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.coupled import report
from experiments.coupled.testbed import Path, testbed, select, set_conf, CONF, Stalled, run_flows, closer

KIND = 'ese'
HELP = "MPTCP-D's extra-subflow elimination: TP on a shared bottleneck, FP on disjoint paths, per alpha"


@dataclass
class Config:
    """The options of coupled-ese and their defaults (the one source: the
    registry and ``python -m experiments.coupled`` both read this)."""
    runs: int = 10
    alpha: tuple[float, ...] = (1.3,)
    per_path: int = 1
    delay_us: float = 2500.0
    frozen: bool = False
    confirm: int = 0
    by_endpoint: bool = False


def measure(cfg: Config):
    return [ese(cfg.runs, alpha=a, per_path=cfg.per_path, delay_us=cfg.delay_us, frozen=cfg.frozen,
                confirm=cfg.confirm, by_endpoint=cfg.by_endpoint) for a in cfg.alpha]


def run(cfg: Config, out_dir):
    """The registry's entry: result.json (and figure.png) in ``out_dir``."""
    return report.run(KIND, measure, draw, cfg, out_dir)


def ese(runs: int, alpha: float, per_path: int, delay_us: float, frozen: bool, confirm: int, by_endpoint: bool,
        seconds: float = 3.0) -> dict:
    """MPTCP-D's extra-subflow elimination: ``per_path`` + 1 subflows on one
    bottleneck (a closing there is right: TP) and ``per_path`` subflows on
    each of two disjoint paths of the same rate and delay (a closing of
    the only subflow of a path is wrong: FP). ``by_endpoint``: the closer
    removes subflows by deleting their address's path-manager endpoint
    (each subflow has its own here) instead of destroying the socket."""
    set_conf(CONF["ese_alpha"], round(alpha * 1000))
    set_conf(CONF["ese_frozen"], int(frozen))
    set_conf(CONF["ese_confirm"], confirm)
    res = {"alpha": alpha, "delay_us": delay_us, "frozen_reference": frozen, "confirm": confirm, "per_path": per_path,
           "by_endpoint": by_endpoint, "shared": [], "disjoint": []}
    try:
        for setup in ("shared", "disjoint"):
            for _ in range(runs):
                paths = [Path(delay_us, 50, addrs=2 * per_path)] if setup == "shared" else \
                    [Path(delay_us, 50, addrs=per_path), Path(delay_us, 50, addrs=per_path)]
                with testbed(paths) as bed:
                    select(bed.all_addrs(), "mptcp_d")
                    try:
                        with closer(bed, by_endpoint) as closed:
                            flows = run_flows(bed, seconds, mptcp=1, warm=0.5)["flows"]
                    except Stalled as exc:
                        res[setup].append({"stalled": True, "closed": len(closed), "sockets": exc.args[1]})
                        continue
                    finally:
                        select(bed.all_addrs(), "bgwc")
                by_path: dict = {}
                for c in closed:
                    p = c["src"].split(".")[2]
                    by_path[p] = by_path.get(p, 0) + 1
                res[setup].append({"closed": len(closed), "destroyed": sum(c["destroyed"] for c in closed),
                                   "forced": sum(1 for c in closed if c.get("held_at_close")),
                                   "drain_s": [c.get("drain_s") for c in closed],
                                   "by_path": by_path, "mbps": flows[0]["mbps"]})
    finally:
        set_conf(CONF["ese_alpha"], 0)
        set_conf(CONF["ese_frozen"], 0)
        set_conf(CONF["ese_confirm"], 0)
    done = {k: [r for r in res[k] if not r.get("stalled")] for k in ("shared", "disjoint")}
    res["stalled"] = {k: len(res[k]) - len(done[k]) for k in done}
    n = max(1, len(done["shared"]))
    res["tp"] = sum(1 for r in done["shared"] if r["closed"]) / n
    # the shared bottleneck's 2 x per_path subflows: all but one are extra (the paper's closing success)
    res["closing_success"] = sum(min(r["closed"], 2 * per_path - 1) for r in done["shared"]) / n / (2 * per_path - 1)
    # wrong: a disjoint path left with none of its subflows
    res["fp"] = sum(1 for r in done["disjoint"] if any(v >= per_path for v in r["by_path"].values())) / \
        max(1, len(done["disjoint"]))
    return res


def draw(out: dict, ax) -> None:
    xs = [r["alpha"] for r in out]
    ax.plot(xs, [r["tp"] for r in out], "o-", label="TP (shared bottleneck)")
    ax.plot(xs, [r["fp"] for r in out], "s-", label="FP (disjoint paths)")
    ax.set_xlabel("ESE alpha")
    ax.set_ylabel("rate")
    ax.set_ylim(-0.05, 1.05)
