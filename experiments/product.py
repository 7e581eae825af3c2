"""The main job: why bwfabric exists, on one screen.

An over-subscribed FatTree (k=4; 10 Mb/s host links, 5 Mb/s fabric links,
so each ToR's two uplinks carry 10 Mb/s for two 10 Mb/s hosts) shared by
three tenants, declared in one configuration with hose guarantees:

- ``analytics`` (4 Mb/s per VM): one long transfer per VM to another pod;
- ``batch`` (1 Mb/s per VM): aggressive -- UDP at 9 Mb/s plus four TCP
  connections per VM, to another pod; each batch VM shares its ToR's
  uplinks with an analytics VM;
- ``web`` (1.5 Mb/s per VM): web-search flows (the DCTCP distribution)
  among its eight VMs on the other ToRs.

The same load runs twice: under **bwfabric** (LESSOR, BG/WC queues, ToR
meters, host agents configured by the controller from the declared
tenants) and under **ECMP without guarantees** (plain FIFOs, no agents).
Printed per tenant: its guarantee against what it achieved -- the lowest
rate of any of its VMs over any 1 s window while it was backlogged, and
the mean -- the web tenant's flow completion times, and the backlogged
tenants' aggregate against what the fabric can carry for them.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from experiments import configs
from experiments import results as R
from experiments.agents import Agents, BpfLoaded, wait_in_force
from experiments.controller_proc import ControllerProcess
from experiments.fabric import Fabric
from experiments.meter import Meter
from experiments.options import OptionError
from experiments.traffic import run_workload
from experiments.workloads import SizeCdf, open_loop_flows
from mininet_topos import builders

# the layout: each "mixed" ToR (e<pod>_0) has an analytics VM and a batch VM;
# the web tenant has both hosts of every other ToR (e<pod>_1)
ANALYTICS = {"a1": "h1", "a2": "h5", "a3": "h9", "a4": "h13"}
BATCH = {"b1": "h2", "b2": "h6", "b3": "h10", "b4": "h14"}
WEB = {f"w{i + 1}": h for i, h in enumerate(("h3", "h4", "h7", "h8", "h11", "h12", "h15", "h16"))}
# every transfer crosses pods: pod p -> pod p+2
PEER = {"h1": "h9", "h9": "h1", "h5": "h13", "h13": "h5", "h2": "h10", "h10": "h2", "h6": "h14", "h14": "h6"}
GUARANTEES = {"analytics": 3.0, "batch": 0.5, "web": 1.0}
DATA_PORT, UDP_PORT = 7100, 7200
SCHEMES = ("bwfabric", "ecmp")


@dataclass
class Config:
    duration: float = 25.0
    link_mbps: float = 10.0
    fabric_mbps: float = 5.0
    udp_mbps: float = 9.0          # each batch VM's UDP
    batch_conns: int = 4           # ... and its TCP connections
    web_load: float = 0.3          # web-search load on the web VMs' links
    sample_s: float = 0.5
    skip_s: float = 5.0            # start-up left out of the per-window minimum
    schemes: tuple[str, ...] = SCHEMES
    seed: int = 1
    of_port: int = 6653

    def check(self) -> None:
        if self.duration < self.skip_s + 5:
            raise OptionError(f"option duration={self.duration:g}: at least skip_s + 5 s")
        if set(self.schemes) - set(SCHEMES) or not self.schemes:
            raise OptionError(f"option schemes: some of {', '.join(SCHEMES)}")
        if not 0 < self.fabric_mbps <= self.link_mbps or not 0 < self.web_load <= 1:
            raise OptionError("options fabric_mbps (0 < fabric <= link) and web_load (0, 1]")


def tenants() -> dict:
    def vms(table, g):
        return {vm: {"host": h, "guarantee_mbps": g} for vm, h in table.items()}
    return {"analytics": {"wc_subflows": 2, "vms": vms(ANALYTICS, GUARANTEES["analytics"])},
            "batch": {"policy": "equal", "vms": vms(BATCH, GUARANTEES["batch"])},
            "web": {"vms": vms(WEB, GUARANTEES["web"])}}


def write_config(cfg: Config, workdir: Path, scheme: str) -> Path:
    topo_file = workdir.parent / "topology.json"
    if scheme == "ecmp":
        return configs.write(workdir / "bwfabric.yaml", topo_file, "ecmp", cfg.of_port)
    return configs.write(workdir / "bwfabric.yaml", topo_file, "lessor", cfg.of_port, prio_queues=True,
                         tenants=tenants(), agents_dir=workdir / "agents", api_port=cfg.of_port + 1000,
                         agent_defaults={"unit_mbps": 75.0 * cfg.link_mbps / 1000, "beta": 10},
                         lessor={"polling": {"initial_s": 1.0, "min_s": 0.5}})


def _load(fab: Fabric, cfg: Config, workdir: Path) -> dict:
    """Start every tenant's traffic, measure, stop. Returns per-sender rates
    (Mb/s per sample) and the web flows."""
    py = [sys.executable, "-m", "experiments.flowgen"]
    senders = [*ANALYTICS.values(), *BATCH.values()]
    sinks = [fab.host(PEER[s]).popen(py + ["server", "--port", str(DATA_PORT), "--out", "/dev/null", "--mptcp"])
             for s in senders]
    sinks += [fab.host(PEER[s]).popen(["iperf3", "-s", "-p", str(UDP_PORT)], stdout=subprocess.DEVNULL)
              for s in BATCH.values()]
    time.sleep(1.0)
    meter = Meter(fab, [PEER[s] for s in senders], cfg.sample_s, senders=senders).start()
    web_flows = open_loop_flows(list(WEB.values()), SizeCdf.load("websearch"), cfg.web_load, cfg.link_mbps,
                                cfg.duration - 5, cfg.seed)
    web: dict = {}
    web_thread = threading.Thread(target=lambda: web.update(r=run_workload(
        fab, web_flows, cfg.duration - 5, workdir / "web", drain_s=5, mptcp=True)), daemon=True)
    procs = []
    try:
        for s in ANALYTICS.values():
            procs.append(fab.host(s).popen(py + ["bulk", "--dst", fab.topo.host(PEER[s]).ip, "--port",
                                                 str(DATA_PORT), "--duration", str(cfg.duration), "--mptcp"]))
        for s in BATCH.values():
            dst = fab.topo.host(PEER[s]).ip
            procs.append(fab.host(s).popen(py + ["bulk", "--dst", dst, "--port", str(DATA_PORT), "--duration",
                                                 str(cfg.duration), "--conns", str(cfg.batch_conns), "--mptcp"]))
            procs.append(fab.host(s).popen(["iperf3", "-c", dst, "-p", str(UDP_PORT), "-u", "-b",
                                            f"{cfg.udp_mbps}M", "-t", str(int(cfg.duration)), "-l", "1400"],
                                           stdout=subprocess.DEVNULL))
        web_thread.start()
        time.sleep(cfg.duration + 0.5)
    finally:
        meter.stop()
        for p in procs + sinks:
            if p.poll() is None:
                p.terminate()
        for p in procs + sinks:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        web_thread.join(cfg.duration + 60)
    return {"rates": meter.rates(), "web": web.get("r")}


def vm_rates(rates: list[dict], host: str, window_s: float, t_from: float, t_to: float) -> tuple[float, float]:
    """(lowest rate over any ``window_s`` window, mean) of everything ``host`` sent, Mb/s."""
    series = [(r["t"], sum(v for k, v in r.items() if k != "t" and k.endswith(f"-{host}"))) for r in rates
              if t_from < r["t"] <= t_to]
    if not series:
        return 0.0, 0.0
    step = series[1][0] - series[0][0] if len(series) > 1 else window_s
    n = max(1, round(window_s / step))
    windows = [sum(v for _, v in series[i:i + n]) / n for i in range(0, len(series) - n + 1)]
    return min(windows), sum(v for _, v in series) / len(series)


def summarise(run: dict, cfg: Config) -> dict:
    rates, t_to = run["rates"], cfg.duration - 0.5
    out = {}
    for name, table in (("analytics", ANALYTICS), ("batch", BATCH)):
        per_vm = {vm: vm_rates(rates, h, 1.0, cfg.skip_s, t_to) for vm, h in table.items()}
        out[name] = {"guarantee_mbps": GUARANTEES[name], "min_1s_mbps": min(m for m, _ in per_vm.values()),
                     "mean_mbps": sum(a for _, a in per_vm.values()) / len(per_vm),
                     "per_vm": {vm: {"min_1s": m, "mean": a} for vm, (m, a) in per_vm.items()}}
    web = run.get("web")
    flows = web.flows if web is not None else []
    small = [f["fct"] for f in flows if f.get("complete") and f["size"] < 100_000]
    out["web"] = {"guarantee_mbps": GUARANTEES["web"], "flows": len(flows),
                  "completed": sum(1 for f in flows if f.get("complete")),
                  "small_fct_p50_ms": _ms(R.percentile(small, 50)), "small_fct_p99_ms": _ms(R.percentile(small, 99)),
                  "fct_mean_ms": _ms(R.mean([f["fct"] for f in flows if f.get("complete")]))}
    carried = sum(out[t]["mean_mbps"] * 4 for t in ("analytics", "batch"))
    # each mixed ToR's uplinks (2 x fabric) bound what its two VMs can send; 4 such ToRs
    ideal = 4 * min(2 * cfg.fabric_mbps, 2 * cfg.link_mbps)
    out["aggregate"] = {"carried_mbps": carried, "ideal_mbps": ideal, "of_ideal": carried / ideal}
    return out


def _ms(s: float | None) -> float | None:
    return None if s is None else s * 1000


def run_scheme(cfg: Config, scheme: str, topo, out_dir: Path) -> dict:
    workdir = out_dir / scheme
    workdir.mkdir(parents=True, exist_ok=True)
    conf = write_config(cfg, workdir, scheme)
    print(f"{scheme}: starting the fabric and the controller", flush=True)
    if scheme == "ecmp":
        with Fabric(topo, of_port=cfg.of_port) as fab, ControllerProcess(conf, workdir / "controller.log"):
            fab.wait_routes(90)
            print(f"{scheme}: {cfg.duration:g} s of traffic", flush=True)
            return _load(fab, cfg, workdir)
    hosts = [*ANALYTICS.values(), *BATCH.values(), *WEB.values()]
    with BpfLoaded(), Fabric(topo, of_port=cfg.of_port, queues="tc", wc_aqm=True) as fab, \
            Agents(fab, workdir / "agents", hosts), ControllerProcess(conf, workdir / "controller.log"):
        fab.wait_routes(90)
        api = configs.ApiClient.from_config(conf)
        took = wait_in_force(api, hosts, timeout_s=60)
        print(f"{scheme}: every agent configured by the controller ({took:.1f} s); {cfg.duration:g} s of traffic",
              flush=True)
        got = _load(fab, cfg, workdir)
        got["metrics"] = api.metrics()
        return got


def table_lines(report: dict) -> list[str]:
    s = report["summary"]
    schemes = [k for k in SCHEMES if k in s]
    label = {"bwfabric": "bwfabric", "ecmp": "ECMP, no guarantees"}
    lines = [f"{'tenant':<11}{'guarantee':>10}  " + "".join(f"{label[k]:>38}" for k in schemes),
             f"{'':<11}{'per VM':>10}  " + "".join(f"{'lowest 1 s / mean Mb/s (lowest/g)':>38}" for _ in schemes)]
    for t in ("analytics", "batch"):
        cells = []
        for k in schemes:
            r = s[k][t]
            cells.append(f"{r['min_1s_mbps']:.2f} / {r['mean_mbps']:.2f} "
                         f"({r['min_1s_mbps'] / r['guarantee_mbps']:.2f}x)")
        lines.append(f"{t:<11}{s[schemes[0]][t]['guarantee_mbps']:>10.1f}  " + "".join(f"{c:>38}" for c in cells))
    cells = [f"p50 {R.fmt(s[k]['web']['small_fct_p50_ms'], '.0f')} p99 {R.fmt(s[k]['web']['small_fct_p99_ms'], '.0f')} ms"
             for k in schemes]
    lines.append(f"{'web':<11}{s[schemes[0]]['web']['guarantee_mbps']:>10.1f}  " + "".join(f"{c:>38}" for c in cells)
                 + "   (flows < 100 KB: completion time)")
    cells = [f"{s[k]['aggregate']['carried_mbps']:.1f} of {s[k]['aggregate']['ideal_mbps']:.0f} "
             f"({s[k]['aggregate']['of_ideal']:.0%})" for k in schemes]
    lines.append(f"{'aggregate':<11}{'':>10}  " + "".join(f"{c:>38}" for c in cells)
                 + "   (analytics + batch, Mb/s)")
    return lines


def plot(report: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = report["summary"]
    schemes = [k for k in SCHEMES if k in s]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [2, 1]})
    tenants_ = ("analytics", "batch")
    for i, k in enumerate(schemes):
        xs = [j + i * 0.35 for j in range(len(tenants_))]
        ax.bar(xs, [s[k][t]["min_1s_mbps"] for t in tenants_], 0.35, label=f"{k}: lowest 1 s (any VM)")
        ax.scatter(xs, [s[k][t]["mean_mbps"] for t in tenants_], color="k", marker="_", s=300, zorder=3,
                   label="mean" if i == 0 else None)
    for j, t in enumerate(tenants_):
        ax.hlines(GUARANTEES[t], j - 0.2, j + 0.55, colors="r", linestyles=":", label="guarantee" if j == 0 else None)
    ax.set_xticks([j + 0.175 for j in range(len(tenants_))], tenants_)
    ax.set_ylabel("Mb/s per VM")
    ax.legend(fontsize=7, loc="upper center")
    ax2.bar(schemes, [s[k]["web"]["small_fct_p99_ms"] or 0 for k in schemes])
    ax2.set_ylabel("web: p99 completion of flows < 100 KB (ms)")
    fig.suptitle("Same load, same fabric: bwfabric vs ECMP without guarantees")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(cfg: Config, out_dir: Path) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    topo = builders.fattree(4, link_mbps=cfg.link_mbps, fabric_mbps=cfg.fabric_mbps, mtu=1500,
                            queue_bytes=150_000)
    topo.save(out_dir / "topology.json")
    report: dict = {"config": asdict(cfg), "tenants": tenants(), "summary": {}}
    for scheme in cfg.schemes:
        got = run_scheme(cfg, scheme, topo, out_dir)
        report["summary"][scheme] = summarise(got, cfg)
        report[f"rates_{scheme}"] = got["rates"]
        if "metrics" in got:
            (out_dir / f"metrics-{scheme}.txt").write_text(got["metrics"])
    R.write_json(out_dir / "results.json", report)
    plot(report, out_dir / "results.png")
    print()
    for line in table_lines(report):
        print(line)
    print(f"\nresults: {out_dir / 'results.json'}  plot: {out_dir / 'results.png'}  "
          f"(bwfabric's /metrics at the end: {out_dir / 'metrics-bwfabric.txt'})")
    return report
