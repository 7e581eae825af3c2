"""Routing apps compared on an emulated FatTree: long-flow patterns
(iperf3) and an open-loop flow-size workload, against the max-min fair ideal.

The main job (``bwfabric experiment``) is the default configuration: FatTree
k=4 at 10 Mb/s, a random permutation of long flows and the web-search
workload, single_path vs ecmp. ``bwfabric experiment fidelity`` runs the
stride-4, stride-8 and permutation patterns with single_path only.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from apps.routing.logic import DestinationRouting
from controller.network_view import NetworkView
from experiments import results as R
from experiments import configs
from experiments.controller_proc import ControllerProcess
from experiments.fabric import Fabric
from experiments import pathprobe
from experiments.traffic import IPERF_BASE_PORT, run_long_flows, run_workload
from experiments.workloads import SizeCdf, open_loop_flows, permutation, stride
from mininet_topos import builders
from experiments.options import OptionError

PATTERNS = ("permutation", "stride1", "stride2", "stride4", "stride5", "stride8", "stride10", "many2one", "random")
APPS = ("single_path", "ecmp", "hedera", "lessor")
PROBE_S = 1.5       # ECMP: how long at most the switch ports are watched for the hash's paths (in the warm-up)


@dataclass
class Config:
    topology: str = "fattree"
    k: int = 4
    link_mbps: float = 10.0          # FatTree links; VL2 server links
    fabric_mbps: float = 25.0        # VL2 ToR-aggregation-intermediate links
    servers_per_tor: int = 5         # VL2
    mtu: int = builders.JUMBO_MTU
    queue_bytes: int = builders.DEFAULT_QUEUE_BYTES
    apps: tuple[str, ...] = ("single_path", "ecmp")
    patterns: tuple[str, ...] = ("permutation",)
    long_duration: float = 20.0
    omit: float = 3.0
    workload: str | None = "websearch"
    load: float = 0.5
    ws_duration: float = 30.0
    drain: float = 15.0
    mptcp: bool = False
    seed: int = 1
    of_port: int = 6653
    # the emulated switches serve TCP packets without payload first (mininet_topos.queues.ack_first_commands):
    # what bwfabric's agents do with prio queues (every ACK BG), for fabrics that run LESSOR alone
    ack_first: bool = False
    # every switch port drops data packets at random before its FIFO is full (RED's thresholds; ACKs never):
    # bwf_aqm with every_class, as a switch's WRED would -- drop-tail losses fall on the flows with the
    # fewest segments in flight (the intra-ToR flow of docs/results.md)
    early_drop: bool = False
    # every emulated host asks for ECN (net.ipv4.tcp_ecn=1): with early_drop, its ports mark CE instead of
    # dropping, as a datacenter's WRED+ECN switches do for ECN-capable TCP
    ecn: bool = False

    def check(self) -> None:
        if self.topology not in builders.EVALUATION_FABRICS:
            raise OptionError(f"option topology={self.topology!r}: one of "
                              + ", ".join(builders.EVALUATION_FABRICS))
        for p in self.patterns:
            if p not in PATTERNS:
                raise OptionError(f"option patterns: {p!r} is not one of {', '.join(PATTERNS)}")
        for a in self.apps:
            if a not in APPS:
                raise OptionError(f"option apps: {a!r} is not one of {', '.join(APPS)}")
        if not 0 < self.load <= 1:
            raise OptionError(f"option load={self.load}: must be in (0, 1]")
        if min(self.link_mbps, self.fabric_mbps, self.long_duration, self.ws_duration) <= 0:
            raise OptionError("options link_mbps, fabric_mbps, long_duration, ws_duration must be positive")
        if self.servers_per_tor < 1:
            raise OptionError(f"option servers_per_tor={self.servers_per_tor}: must be at least 1")
        if self.workload is not None:
            SizeCdf.load(self.workload)


FIDELITY = dict(apps=("single_path",), patterns=("stride4", "stride8", "permutation"), workload=None)
# VL2 (d0=2, d1=4, d2=4) scaled as in lessor-vl2: 5 servers per ToR at 10 Mb/s
# under 25 Mb/s fabric links; stride 5 sends every flow to another ToR.
FIDELITY_VL2 = dict(FIDELITY, topology="vl2", patterns=("stride5", "stride10", "permutation"))
# Measured with the default 3 s warm-up: it includes LESSOR's convergence
# (flows start on the ECMP defaults, are found within one polling period and
# moved onto PMPT's paths).
LESSOR_PERMUTATION = dict(apps=("single_path", "ecmp", "hedera", "lessor"), patterns=("permutation",),
                          workload=None)
# many senders to one receiver: no placement can help; LESSOR must not churn
LESSOR_MANY2ONE = dict(apps=("lessor",), patterns=("many2one",), workload=None, long_duration=25.0)


def _pairs(name: str, hosts: list[str], seed: int) -> list[tuple[str, str]]:
    if name == "permutation":
        return permutation(hosts, random.Random(seed))
    if name == "many2one":      # every other host to the last one: all limited by its link
        return [(h, hosts[-1]) for h in hosts[:-1]]
    if name == "random":        # every host to a random other one: some receive two or three (issue #32 §3)
        rng = random.Random(seed)
        return [(h, rng.choice([d for d in hosts if d != h])) for h in hosts]
    return stride(hosts, int(name.removeprefix("stride")))


def _known_paths(view: NetworkView, app: str, pairs) -> list[tuple[str, ...]] | None:
    if app != "single_path":
        return None  # ECMP: the switches' hash picks the path (observed, when probed); LESSOR/Hedera move flows
    routing = DestinationRouting(view, multipath=False)
    return [routing.single_path(s, d) for s, d in pairs]


def _probes(app: str, cfg: "Config") -> bool:
    """ECMP's paths are observed when the warm-up leaves room for the probe
    (1 s after the start, ``PROBE_S`` long)."""
    return app == "ecmp" and cfg.omit >= 1.0 + PROBE_S + 0.5


def _probe_flows(view: NetworkView, pairs) -> list:
    """What the probe looks for: pair i's iperf3 connection (its server's
    port is ``IPERF_BASE_PORT + i``: run_long_flows)."""
    return [(s, d, (view.ip(s), view.ip(d), IPERF_BASE_PORT + i)) for i, (s, d) in enumerate(pairs)]


def run(cfg: Config, out_dir: Path) -> dict:
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    out_dir.mkdir(parents=True, exist_ok=True)
    topo = builders.evaluation_fabric(cfg.topology, k=cfg.k, link_mbps=cfg.link_mbps, fabric_mbps=cfg.fabric_mbps,
                                      servers_per_tor=cfg.servers_per_tor, mtu=cfg.mtu,
                                      queue_bytes=cfg.queue_bytes)
    topo_file = out_dir / "topology.json"
    topo.save(topo_file)
    view = NetworkView(topo)
    hosts = view.hosts
    patterns = {p: _pairs(p, hosts, cfg.seed) for p in cfg.patterns}
    ws_flows = []
    if cfg.workload:
        ws_flows = open_loop_flows(hosts, SizeCdf.load(cfg.workload), cfg.load, cfg.link_mbps,
                                   cfg.ws_duration, cfg.seed)
    per_app = (len(patterns) * (cfg.long_duration + cfg.omit + 2)
               + ((cfg.ws_duration + cfg.drain + 1) if cfg.workload else 0))
    report: dict = {"config": asdict(cfg), "topology": topo.name, "apps": {}, "warnings": []}
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TimeRemainingColumn()) as prog, \
            Fabric(topo, of_port=cfg.of_port, ack_first=cfg.ack_first, early_drop=cfg.early_drop,
                   host_tcp={"net.ipv4.tcp_ecn": "1"} if cfg.ecn else None) as fab:
        report["warnings"] += fab.warnings
        task = prog.add_task("starting", total=per_app * len(cfg.apps))
        advance = lambda s: prog.advance(task, s)  # noqa: E731

        def stage(text: str) -> None:
            prog.update(task, description=text)
            if not prog.console.is_terminal:  # logs get one line per stage instead of a bar
                print(text, flush=True)
        for app in cfg.apps:
            fab.clear_forwarding()
            app_rep: dict = {"long": {}, "workload": None}
            conf = configs.write(out_dir / f"bwfabric-{app}.yaml", topo_file, app, cfg.of_port,
                                 state_file=out_dir / f"state-{app}.json" if app in ("lessor", "hedera") else None)
            with ControllerProcess(conf, out_dir / f"controller-{app}.log") as ctl:
                stage(f"{app}: installing routes")
                t_start = time.monotonic()
                fab.wait_routes()
                app_rep["routes_ready_s"] = round(time.monotonic() - t_start, 2)
                sample = [p for pairs in patterns.values() for p in pairs][:8] or [(hosts[0], hosts[-1])]
                app_rep["ping_failures"] = fab.ping_pairs(sample)
                for name, pairs in patterns.items():
                    stage(f"{app}: long flows ({name})")
                    probe: dict = {}
                    wanted = _probe_flows(view, pairs)
                    during = (lambda: probe.update(paths=pathprobe.observe(view, wanted, PROBE_S))) \
                        if _probes(app, cfg) else None
                    flows = run_long_flows(fab, pairs, cfg.long_duration, cfg.omit, progress=advance,
                                           during_warmup=during)
                    observed = probe.get("paths")
                    app_rep["long"][name] = _long_report(view, app, pairs, flows, cfg, report, observed)
                if cfg.workload:
                    stage(f"{app}: {cfg.workload} workload, load {cfg.load}")
                    wr = run_workload(fab, ws_flows, cfg.ws_duration, out_dir / f"workload-{app}",
                                      drain_s=cfg.drain, mptcp=cfg.mptcp, progress=advance)
                    app_rep["workload"] = {"aggregate_mbps": wr.aggregate_mbps, "window_s": wr.window_s,
                                           **R.fct_stats(wr.flows), "flows_detail": wr.flows}
                app_rep["controller_cpu_percent"] = round(ctl.cpu_between(0, ctl.elapsed()), 2)
                app_rep["controller_alive_at_end"] = ctl.alive()
            if ctl.died:
                app_rep["failed"] = ctl.died
                report["warnings"].append(f"{app}: FAILED RUN: {ctl.died}")
            lessor_state = _lessor_state(out_dir / f"state-{app}.json")
            if lessor_state:
                app_rep["lessor"] = lessor_state
            report["apps"][app] = app_rep
    R.write_json(out_dir / "results.json", report)
    plot(report, out_dir / "results.png")
    print_report(report)
    print(f"\nresults: {out_dir / 'results.json'}  plot: {out_dir / 'results.png'}")
    return report


def _lessor_state(path: Path) -> dict | None:
    """Moves per allocation and the like, from a LESSOR/Hedera state file."""
    if not path.exists():
        return None
    try:
        st = json.loads(path.read_text())
    except ValueError:
        return None
    keys = ("allocations", "allocations_skipped", "reroutes", "moves_per_allocation", "pinned_host_limited",
            "untrusted_counters", "uncertified_allocations", "polls")
    return {k: st[k] for k in keys if k in st}


def _long_report(view: NetworkView, app: str, pairs, flows, cfg: Config, report: dict,
                 observed: list[tuple[str, ...] | None] | None = None) -> dict:
    measured = [f.mbps or 0.0 for f in flows]
    nb = R.non_blocking_ideal_mbps(view, pairs)
    paths = _known_paths(view, app, pairs)
    if observed is not None:
        if all(observed):
            paths = observed
        else:
            report["warnings"].append(f"{app}: the path probe missed {sum(p is None for p in observed)} of "
                                      f"{len(observed)} flows: paths not recorded")
    ideal = R.max_min_ideal_mbps(view, paths) if paths else None
    rates_for_envelope = ideal or nb
    envelope_paths = paths or [view.equal_cost_paths(s, d, limit=1)[0] for s, d in pairs]
    pkt_hops = R.envelope_pkt_hops(view, envelope_paths, rates_for_envelope, cfg.mtu)
    if pkt_hops > R.ENVELOPE_PKT_HOPS_PER_S:
        report["warnings"].append(
            f"{app}: the ideal rates need {pkt_hops:.0f} packet-hops/s, beyond the ~"
            f"{R.ENVELOPE_PKT_HOPS_PER_S} userspace OVS carries here: expect low fidelity")
    rep = {
        "aggregate_mbps": sum(measured),
        "ideal_paths_mbps": sum(ideal) if ideal else None,
        "fidelity": sum(measured) / sum(ideal) if ideal else None,
        "non_blocking_mbps": sum(nb),
        "ratio_non_blocking": sum(measured) / sum(nb),
        "failed_flows": [f"{f.src}->{f.dst}: {f.error}" for f in flows if f.mbps is None],
        "pkt_hops_per_s": round(pkt_hops),
        "paths_observed": observed is not None and all(observed),
        "flows": [{"src": f.src, "dst": f.dst, "mbps": f.mbps,
                   "ideal_mbps": ideal[i] if ideal else None, "path": paths[i] if paths else None}
                  for i, f in enumerate(flows)],
    }
    if rep["fidelity"] is not None and rep["fidelity"] < 0.85:
        report["warnings"].append(f"{app}: fidelity {rep['fidelity']:.2f} < 0.85: the emulator, not the "
                                  "routing, may be limiting this run")
    return rep


def print_report(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    cfg = report["config"]
    con = Console(width=max(120, Console().width))
    t = Table(title=f"Long flows on {report['topology']} at {cfg['link_mbps']:g} Mb/s "
                    f"({cfg['long_duration']:g} s each, goodput at the receivers)")
    for col in ("app", "pattern", "aggregate Mb/s", "max-min ideal (paths)", "fidelity",
                "non-blocking ideal", "ratio"):
        t.add_column(col, justify="right" if col not in ("app", "pattern") else "left")
    for app, rep in report["apps"].items():
        for pat, lr in rep["long"].items():
            t.add_row(app, pat, R.fmt(lr["aggregate_mbps"], ".1f"), R.fmt(lr["ideal_paths_mbps"], ".1f",
                      "paths unknown"), R.fmt(lr["fidelity"], ".3f"), R.fmt(lr["non_blocking_mbps"], ".1f"),
                      R.fmt(lr["ratio_non_blocking"], ".3f"))
    con.print(t)
    if cfg.get("workload"):
        w = Table(title=f"{cfg['workload']} workload, load {cfg['load']:g}, {cfg['ws_duration']:g} s "
                        "of arrivals")
        for col in ("app", "throughput Mb/s", "flows done", "mean FCT s", "p95 FCT s", "controller CPU %"):
            w.add_column(col, justify="left" if col == "app" else "right")
        for app, rep in report["apps"].items():
            wl = rep["workload"]
            w.add_row(app, R.fmt(wl["aggregate_mbps"], ".1f"), f"{wl['completed']}/{wl['flows']}",
                      R.fmt(wl["mean_fct_s"], ".3f"), R.fmt(wl["p95_fct_s"], ".3f"),
                      R.fmt(rep["controller_cpu_percent"], ".1f"))
        con.print(w)
    for app, rep in report["apps"].items():
        if rep["ping_failures"]:
            con.print(f"[red]{app}: ping failed for {rep['ping_failures']}")
        ls = rep.get("lessor")
        if ls and ls.get("moves_per_allocation") is not None:
            moves = ls["moves_per_allocation"]
            con.print(f"{app}: {ls.get('allocations', 0)} allocations, {ls.get('reroutes', 0)} moves in all; "
                      f"moves per allocation after the first: "
                      f"{(sum(moves[1:]) / len(moves[1:])) if len(moves) > 1 else 0:.2f} (max "
                      f"{max(moves[1:], default=0)}); {ls.get('pinned_host_limited', 0)} flows pinned as "
                      "host-limited")
        if rep.get("failed"):
            con.print(f"[bold red]{app}: FAILED RUN: {rep['failed']}")
    for warning in report["warnings"]:
        con.print(f"[yellow]warning: {warning}")


def plot(report: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    apps = list(report["apps"])
    has_wl = bool(report["config"].get("workload"))
    fig, axes = plt.subplots(1, 2 if has_wl else 1, figsize=(11 if has_wl else 6, 4.2), squeeze=False)
    ax = axes[0][0]
    patterns = list(next(iter(report["apps"].values()))["long"]) if apps else []
    width = 0.8 / max(1, len(apps))
    for i, app in enumerate(apps):
        vals = [report["apps"][app]["long"][p]["aggregate_mbps"] for p in patterns]
        xs = [j + i * width for j in range(len(patterns))]
        ax.bar(xs, vals, width, label=app)
        for x, p in zip(xs, patterns):
            ideal = report["apps"][app]["long"][p]["ideal_paths_mbps"]
            if ideal:
                ax.plot([x - width / 2, x + width / 2], [ideal, ideal], "k--", lw=1)
    if patterns:
        nb = report["apps"][apps[0]]["long"][patterns[0]]["non_blocking_mbps"]
        ax.axhline(nb, color="grey", lw=1, ls=":", label="non-blocking ideal")
    ax.set_xticks([j + width * (len(apps) - 1) / 2 for j in range(len(patterns))], patterns)
    ax.set_ylabel("aggregate goodput (Mb/s)")
    ax.set_title("long flows (dashes: max-min ideal of the paths)")
    ax.legend(fontsize=8)
    if has_wl:
        ax2 = axes[0][1]
        for app in apps:
            wl = report["apps"][app]["workload"]
            fcts = sorted(r["fct"] for r in wl["flows_detail"] if r.get("complete"))
            if fcts:
                ax2.plot(fcts, [(i + 1) / len(fcts) for i in range(len(fcts))], label=app)
        ax2.set_xscale("log")
        ax2.set_xlabel("flow completion time (s)")
        ax2.set_ylabel("CDF")
        ax2.set_title(f"{report['config']['workload']} FCT, load {report['config']['load']:g}")
        ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
