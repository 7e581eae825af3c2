"""LESSOR over time, on an emulated FatTree k=4: a link failure under long
flows, and Algorithm 1 adapting the polling period to the controller's CPU.

``bwfabric experiment lessor-failure``: a random permutation of long flows
(flowgen, 10 ms receiver byte counts) under LESSOR; once PMPT has placed
them, the fabric link carrying most installed long flows is taken down (both
ends, as a cable pull). Measured: when the controller sent every switch its
update (from its log), and per affected flow the longest run of zero
received bytes after the failure (TCP's retransmission timeout included),
the time until 100 ms goodput is back to half its pre-failure rate, and
whether it still receives at the end -- set beside the polling period.

``bwfabric experiment lessor-polling``: idle, then a storm of one-packet UDP
flows (every new 5-tuple is a counter the ToRs learn and LESSOR polls and
parses), then idle again. The controller's CPU and the period T of every
Algorithm 1 decision are plotted against time with LT and UT.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from experiments import results as R
from experiments import configs
from experiments.controller_proc import ControllerProcess
from experiments.fabric import Fabric
from experiments.options import OptionError
from experiments.traffic import FLOWGEN_PORT, run_workload
from experiments.workloads import FlowSpec, permutation
from mininet_topos import builders

BIN_S = 0.1


@dataclass
class Config:
    kind: str = "failure"            # failure | polling
    k: int = 4
    link_mbps: float = 10.0
    seed: int = 1
    # failure
    fail_after: float = 12.0         # seconds after the flows start
    duration: float = 30.0
    # polling
    idle_s: float = 20.0
    storm_s: float = 40.0
    after_s: float = 40.0
    storm_hosts: int = 4
    storm_rate: float = 500.0        # new UDP 5-tuples per second per storming host
    of_port: int = 6653

    def check(self) -> None:
        if self.kind not in ("failure", "polling"):
            raise OptionError(f"option kind={self.kind!r}: one of failure, polling")
        if not 0 < self.fail_after < self.duration - 5:
            raise OptionError(f"option fail_after={self.fail_after}: must leave 5 s of the "
                              f"{self.duration} s run after the failure")
        if min(self.idle_s, self.storm_s, self.after_s, self.storm_rate, self.link_mbps) <= 0:
            raise OptionError("options idle_s, storm_s, after_s, storm_rate, link_mbps must be positive")


FAILURE = dict(kind="failure")
POLLING = dict(kind="polling")


def run(cfg: Config, out_dir: Path) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    topo = builders.fattree(k=cfg.k, link_mbps=cfg.link_mbps)
    topo_file = out_dir / "topology.json"
    topo.save(topo_file)
    state_file = out_dir / "controller-state.json"
    report: dict = {"config": asdict(cfg), "topology": topo.name}
    with Fabric(topo, of_port=cfg.of_port) as fab:
        report["warnings"] = list(fab.warnings)
        fab.clear_forwarding()
        conf = configs.write(out_dir / "bwfabric.yaml", topo_file, "lessor", cfg.of_port, state_file=state_file)
        with ControllerProcess(conf, out_dir / "controller.log") as ctl:
            fab.wait_routes()
            if cfg.kind == "failure":
                report.update(_failure(fab, topo, cfg, out_dir, state_file))
            else:
                report.update(_polling(fab, topo, cfg, state_file, ctl))
    R.write_json(out_dir / "results.json", report)
    (plot_failure if cfg.kind == "failure" else plot_polling)(report, out_dir / "results.png")
    print(f"\nresults: {out_dir / 'results.json'}  plot: {out_dir / 'results.png'}")
    return report


# ---- link failure -------------------------------------------------------------------------------
def busiest_fabric_link(installed: dict[str, list[str]], hosts: set[str]) -> tuple[tuple[str, str], int]:
    """The switch-switch link (either direction) crossed by most installed
    long-flow paths, and how many cross it."""
    use: Counter = Counter()
    for path in installed.values():
        for a, b in zip(path, path[1:]):
            if a not in hosts and b not in hosts:
                use[tuple(sorted((a, b)))] += 1
    if not use:
        raise RuntimeError("LESSOR has installed no long flow on a fabric link: nothing to fail")
    link, n = max(sorted(use.items()), key=lambda kv: kv[1])
    return link, n


def _failure(fab: Fabric, topo, cfg: Config, out_dir: Path, state_file: Path) -> dict:
    hosts = [h.name for h in topo.hosts]
    ip_of = {h.name: h.ip for h in topo.hosts}
    pairs = permutation(hosts, random.Random(cfg.seed))
    size = int(cfg.link_mbps * 1e6 / 8 * (cfg.duration + 30))  # never finishes within the run
    flows = [FlowSpec(s, d, 0.0, size) for s, d in pairs]
    event: dict = {}

    def fail() -> None:
        try:
            state = json.loads(state_file.read_text())
            # data flows only (to the flowgen port), not their ACK streams
            data = {k: p for k, p in state["installed"].items() if k.split()[4] == str(FLOWGEN_PORT)}
            (a, b), n = busiest_fabric_link(data, set(hosts))
            affected = [key for key, path in data.items()
                        if any({x, y} == {a, b} for x, y in zip(path, path[1:]))]
            event.update(link=[a, b], long_flows_on_link=n, period_s=state["polling_period_s"],
                         affected=affected, installed_before=state["installed"])
            event["t_wall"] = time.time()
            fab.net.configLinkStatus(a, b, "down")
        except Exception as exc:  # reported, not swallowed: the run is then void
            event["error"] = repr(exc)
    timer = threading.Timer(2.5 + cfg.fail_after, fail)  # run_workload starts flows ~2.5 s in
    timer.start()
    try:
        run_workload(fab, flows, cfg.duration, out_dir / "flows", drain_s=0.0)
    finally:
        timer.cancel()
    if "error" in event or "t_wall" not in event:
        raise RuntimeError(f"the link failure did not happen: {event.get('error', 'timer did not fire')}")
    fab.net.configLinkStatus(*event["link"], "up")
    state = json.loads(state_file.read_text())
    dst_of_ip = {ip: h for h, ip in ip_of.items()}
    affected_dsts = sorted({dst_of_ip[k.split()[1]] for k in event["affected"]})
    series = {h: _rx_series(out_dir / "flows" / f"rx-{h}.json", event["t_wall"]) for h in hosts}
    per_flow = {h: failure_metrics(series[h], cfg.duration - cfg.fail_after - 1.0) for h in affected_dsts}
    updates = controller_updates(out_dir / "controller.log", event["t_wall"])
    verdict = failure_verdict(per_flow, event["period_s"], updates)
    print(json.dumps({"link": event["link"], "period_s": event["period_s"], **verdict}, indent=1))
    return {"failure": event, "affected_receivers": per_flow, "verdict": verdict,
            "series": {h: s for h, s in series.items()}, "reroutes": state.get("reroutes"),
            "polling_period_after_s": state.get("polling_period_s")}


def controller_updates(log_file: Path, t_fail_wall: float) -> list[float]:
    """Seconds after the failure at which the controller sent switches
    their rerouting updates (a line "ports X down, ...: updating N switches
    (S, ...)" in its log per recomputation that took a port down)."""
    import datetime
    import re
    out = []
    for line in log_file.read_text().splitlines():
        m = re.search(r" ports (.*): updating \d+ switches", line)
        if m is None or " down" not in m.group(1):
            continue
        stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if stamp >= t_fail_wall - 1.0:
            out.append(round(stamp - t_fail_wall, 4))
    return out


def failure_verdict(per_flow: dict[str, dict], period_s: float, updates: list[float]) -> dict:
    """Rerouted within one polling period: every switch's update (the failed
    link's long-flow entries removed, defaults rerouted) sent within the
    period after the failure, and every affected flow's traffic back (not
    blackholed) by the end. TCP's own gap, bounded below by its 200 ms
    minimum RTO, is reported beside it."""
    backs = [m["half_rate_back_after_s"] for m in per_flow.values()]
    return {
        "affected_flows": len(per_flow),
        "switch_updates": len(updates),
        "first_update_s": min(updates, default=None),
        "last_update_s": max(updates, default=None),
        "rerouted_within_one_period": bool(updates) and bool(per_flow) and max(updates) <= period_s,
        "worst_tcp_zero_run_s": max((m["longest_zero_s"] for m in per_flow.values()), default=0.0),
        "worst_half_rate_back_s": None if None in backs else max(backs, default=0.0),
        "blackholed": sorted(h for h, m in per_flow.items() if m["end_mbps"] <= 0.0),
    }


def _rx_series(path: Path, t_fail_wall: float) -> list[tuple[float, float]]:
    """(seconds relative to the failure, Mb/s) in BIN_S bins."""
    data = json.loads(path.read_text())
    per_bin = max(1, round(BIN_S / data["slot_s"]))
    b = data["bytes"]
    out = []
    for i in range(0, len(b), per_bin):
        t = data["t0"] + i * data["slot_s"] - t_fail_wall
        out.append((round(t, 3), sum(b[i:i + per_bin]) * 8 / BIN_S / 1e6))
    return out


def failure_metrics(series: list[tuple[float, float]], horizon_s: float) -> dict:
    """From a receiver's (t relative to failure, Mb/s) bins: the rate before
    (3 s), the longest zero run after, when half the rate is back, and the
    rate over the last 3 s of the horizon."""
    before = [r for t, r in series if -3.0 <= t < 0]
    after = [(t, r) for t, r in series if 0 <= t < horizon_s]
    pre = sum(before) / len(before) if before else 0.0
    longest = run = 0.0
    for _, r in after:
        run = run + BIN_S if r == 0 else 0.0
        longest = max(longest, run)
    back = next((t + BIN_S for t, r in after if r >= 0.5 * pre), None)
    tail = [r for t, r in after if t >= horizon_s - 3.0]
    return {"pre_mbps": pre, "longest_zero_s": round(longest, 2),
            "half_rate_back_after_s": None if back is None else round(back, 2),
            "end_mbps": sum(tail) / len(tail) if tail else 0.0}


def plot_failure(report: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.2))
    for h, s in report["series"].items():
        if h in report["affected_receivers"]:
            ax.plot([t for t, _ in s], [r for _, r in s], lw=1.2, label=f"→{h} (on failed link)")
        else:
            ax.plot([t for t, _ in s], [r for _, r in s], lw=0.5, color="grey", alpha=0.5)
    ev = report["failure"]
    ax.axvline(0, color="red", ls="--", lw=1, label=f"{ev['link'][0]}–{ev['link'][1]} down")
    ax.axvspan(0, ev["period_s"], color="orange", alpha=0.15, label=f"one polling period ({ev['period_s']:g} s)")
    ax.set_xlim(-5, None)
    ax.set_xlabel("time relative to the failure (s)")
    ax.set_ylabel(f"goodput per flow (Mb/s, {BIN_S:g} s bins)")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- polling period under controller load -----------------------------------------------------
def _polling(fab: Fabric, topo, cfg: Config, state_file: Path, ctl: ControllerProcess) -> dict:
    hosts = [h.name for h in topo.hosts]
    t_start = time.time()
    phases = {"storm_from_s": cfg.idle_s, "storm_to_s": cfg.idle_s + cfg.storm_s}
    time.sleep(cfg.idle_s)
    storms = []
    n = min(cfg.storm_hosts, len(hosts) // 2)
    for i in range(n):  # host i storms a host in the other half of the fabric
        src, dst = hosts[i], hosts[len(hosts) - 1 - i]
        storms.append(fab.host(src).popen(
            [sys.executable, "-m", "experiments.flowgen", "storm", "--dst", topo.host(dst).ip,
             "--rate", str(cfg.storm_rate), "--duration", str(cfg.storm_s)]))
    sent = 0
    for p in storms:
        out, _ = p.communicate(timeout=cfg.storm_s + 30)
        sent += int(out.strip() or 0)
    time.sleep(max(0.0, t_start + cfg.idle_s + cfg.storm_s + cfg.after_s - time.time()))
    state = json.loads(state_file.read_text())
    offset = state["t0_wall"] - t_start
    decisions = [{"t": round(t + offset, 2), "cpu": cpu, "period_s": period}
                 for t, cpu, period in state["cpu_log"]]
    why = [w for _, _, w in state["polling_history"]]
    report = {"phases": phases, "storm_flows_sent": sent, "decisions": decisions,
              "reasons": dict(Counter(why)), "cpu_samples": ctl.cpu_samples,
              "polling": {"lower": 0.5, "upper": 0.7}}
    report["verdict"] = polling_verdict(decisions, phases, report["polling"])
    print(json.dumps(report["verdict"], indent=1))
    return report


def polling_verdict(decisions: list[dict], phases: dict, bounds: dict) -> dict:
    """Did T shrink while idle and grow once CPU passed UT?"""
    idle = [d for d in decisions if d["t"] < phases["storm_from_s"]]
    storm = [d for d in decisions if phases["storm_from_s"] <= d["t"] < phases["storm_to_s"]]
    after = [d for d in decisions if d["t"] >= phases["storm_to_s"]]
    over = [d for d in storm if d["cpu"] > bounds["upper"]]
    grew = [d for d in over if any(e["t"] > d["t"] and e["period_s"] > d["period_s"] for e in decisions)]
    return {
        "idle_period_first_last_s": [idle[0]["period_s"], idle[-1]["period_s"]] if idle else None,
        "storm_max_cpu": max((d["cpu"] for d in storm), default=None),
        "storm_max_period_s": max((d["period_s"] for d in storm), default=None),
        "decisions_over_upper": len(over),
        "after_last_period_s": after[-1]["period_s"] if after else None,
        "shrinks_when_idle": bool(idle) and idle[-1]["period_s"] < idle[0]["period_s"],
        "grows_over_upper": bool(over) and bool(grew),
    }


def plot_polling(report: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = report["decisions"]
    fig, ax1 = plt.subplots(figsize=(10, 4.2))
    ax1.plot([x["t"] for x in d], [100 * x["cpu"] for x in d], ".-", color="tab:red", lw=0.8,
             label="controller CPU at each decision")
    for level, name in ((report["polling"]["lower"], "LT"), (report["polling"]["upper"], "UT")):
        ax1.axhline(100 * level, color="tab:red", ls=":", lw=0.8)
        ax1.text(0, 100 * level + 1, name, color="tab:red", fontsize=8)
    ax1.set_ylabel("controller CPU (% of one core)")
    ax1.set_xlabel("time (s)")
    ax2 = ax1.twinx()
    ax2.step([x["t"] for x in d], [x["period_s"] for x in d], where="post", color="tab:blue",
             label="polling period T")
    ax2.set_ylabel("polling period T (s)")
    ax2.set_yscale("log", base=2)
    ph = report["phases"]
    ax1.axvspan(ph["storm_from_s"], ph["storm_to_s"], color="grey", alpha=0.15,
                label=f"UDP flow storm ({report['storm_flows_sent']} flows)")
    lines = ax1.get_legend_handles_labels()
    l2 = ax2.get_legend_handles_labels()
    ax1.legend(lines[0] + l2[0], lines[1] + l2[1], fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
