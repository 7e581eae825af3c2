"""The flow-level simulator against a packet-level one (issue #34 §1 (b)):
``bwfabric simulate fabric-validate-ns3 [--set KEY=VALUE ...]``.

Where the emulator cannot go (a FatTree k = 8 at 1 Gb/s: 128 hosts, 80
switches), ns-3 is the independent reference. Both simulators get the same
input:

- the fabric: ``mininet_topos.builders.fattree(k, link_mbps)``;
- the placements: the product's ``single_path`` routing -- for every switch
  and destination host, ``DestinationRouting.single_next_hop`` (what the
  app installs) becomes an ns-3 static host route; the flow-level simulator
  routes with ``DestinationRouting.single_path``, the same next hops;
- the connections: ``experiments.flowsim.workload.open_loop`` at each load
  (web search sizes, Poisson arrivals, uniformly random destinations), one
  seed -- the flow-level simulator's own generator, written into the spec.

ns-3 runs single-path TCP -- by default DCTCP over ports of 200 packets
that mark ECN above K = 20 (the DCTCP paper's 1 Gb/s setting), with
Linux's MSS, initial window, minimum RTO, delayed-ACK timer and SYN
timeout; ``tcp=TcpCubic ecn_k=0`` gives CUBIC over drop-tail ports -- in
its own venv (``experiments/flowsim/ns3_packet.py``, a
subprocess: ``ns3`` is not in the roles' venvs -- docs/platform.md). The
flow-level simulator shares links max-min (``fair``), exactly (no
allocation windows).

Printed per load: the aggregate throughput over ``[warmup, seconds)`` in
both and their ratio (bound: within 10 %), the mean FCT over the
connections started in that window that both finished (bound: within
25 %), the p99 FCT of each, and the mean FCT by size bucket. JSON in
``OUT/validate_ns3.json``, a plot in ``OUT/validate_ns3.png``.

ns-3's Python: ``--set ns3_python=PATH``, else ``$BWFABRIC_NS3_PYTHON``,
else ``.venv-ns3/bin/python`` in the checkout (``bwfabric.sh simulate
fabric-validate-ns3`` creates it).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from experiments.flowsim.command import fmt_ms, load_panels, parse_sets, save
from experiments.flowsim.engine import Engine, Flows
from experiments.flowsim.net import SimError, SimNet
from experiments.flowsim.routing import make_router
from experiments.flowsim.workload import SIZE_BUCKETS, open_loop, stats
from experiments.workloads import WORKLOADS, SizeCdf

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("ns3_packet.py")
AGG_BOUND, FCT_BOUND = 0.10, 0.25
SLOT_S = 0.001                    # the flow-level receive counters: the window's edges to 1 ms
TCPS = ("TcpCubic", "TcpNewReno", "TcpDctcp", "TcpBic", "TcpHighSpeed", "TcpVegas")


@dataclass
class Ns3Config:
    k: int = 8
    link_mbps: float = 1000.0
    loads: tuple[float, ...] = (0.3, 0.5, 0.7)
    seconds: float = 1.0              # of arrivals
    warmup: float = 0.2               # the throughput window and the FCT sample start here
    drain: float = 2.5                # after the arrivals, for connections to finish
    seed: int = 1
    workload: str = "websearch"
    link_delay_us: float = 1.0        # ns-3: each link's propagation delay
    queue_packets: int = 200          # ns-3: each port's buffer (300 KB: a shallow-buffered 1 Gb/s switch)
    ecn_k: int = 20                   # ns-3: ECN marks above K packets (DCTCP's switch at 1 Gb/s); 0: drop-tail
    mss: int = 1448
    tcp: str = "TcpDctcp"
    min_rto_ms: float = 200.0         # Linux's
    delack_ms: float = 40.0           # Linux's minimum delayed-ACK timer
    init_cwnd: int = 10
    buf_bytes: int = 4 << 20
    ns3_python: str = ""

    def check(self) -> None:
        if not isinstance(self.k, int) or self.k < 2 or self.k % 2 or self.k > 16:
            raise SimError(f"k {self.k!r}: an even integer in 2..16 (ns-3 at k = 16 takes hours)")
        for name in ("link_mbps", "seconds", "link_delay_us", "min_rto_ms", "delack_ms"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise SimError(f"{name} {v!r}: a finite number > 0")
        for name in ("drain", "warmup"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise SimError(f"{name} {v!r}: a finite number >= 0")
        if self.warmup >= self.seconds:
            raise SimError(f"warmup {self.warmup} must be below seconds {self.seconds}")
        if not self.loads or any(not (math.isfinite(x) and 0 < x <= 1) for x in self.loads):
            raise SimError(f"loads {self.loads}: each in (0, 1]")
        if self.workload not in WORKLOADS:
            raise SimError(f"workload {self.workload!r}: one of {', '.join(WORKLOADS)}")
        if self.tcp not in TCPS:
            raise SimError(f"tcp {self.tcp!r}: one of {', '.join(TCPS)}")
        if not (isinstance(self.ecn_k, int) and 0 <= self.ecn_k < self.queue_packets):
            raise SimError(f"ecn_k {self.ecn_k!r}: 0 (drop-tail) or a marking threshold below queue_packets")
        for name, lo, hi in (("queue_packets", 2, 100_000), ("mss", 536, 8960), ("init_cwnd", 1, 1000),
                             ("buf_bytes", 65536, 1 << 30)):
            v = getattr(self, name)
            if not (isinstance(v, int) and lo <= v <= hi):
                raise SimError(f"{name} {v!r}: an integer in {lo}..{hi}")

    def python(self) -> str:
        return self.ns3_python or os.environ.get("BWFABRIC_NS3_PYTHON") or str(ROOT / ".venv-ns3/bin/python")


def routes(net: SimNet) -> dict[str, dict[str, str]]:
    """What the single_path app installs: each switch's next hop towards
    each host (``DestinationRouting.single_next_hop``)."""
    from apps.routing.logic import DestinationRouting

    routing = DestinationRouting(net.view, multipath=False)
    out: dict[str, dict[str, str]] = {}
    for sw in net.view.switches:
        table = {h: hop for h in net.view.hosts if (hop := routing.single_next_hop(sw, h)) is not None}
        if table:
            out[sw] = table
    return out


def spec(cfg: Ns3Config, net: SimNet, table: dict, flows: Flows) -> dict:
    names = [e.name for e in net.endpoints]
    links = sorted({tuple(sorted(e)) for e in net.links})
    return {"hosts": list(net.view.hosts), "switches": list(net.view.switches),
            "links": [[u, v, net.view.capacity(u, v)] for u, v in links], "routes": table,
            "flows": [[names[s], names[d], float(t), int(b)]
                      for s, d, t, b in zip(flows.src, flows.dst, flows.start_s, flows.size_bytes)],
            "marks": [cfg.warmup, cfg.seconds], "end_s": cfg.seconds + cfg.drain,
            **{k: getattr(cfg, k) for k in ("link_delay_us", "queue_packets", "ecn_k", "mss", "tcp", "min_rto_ms",
                                             "delack_ms", "init_cwnd", "buf_bytes")}}


def run_ns3(python: str, doc: dict, workdir: Path, label: str, quiet: bool) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path, out_path = workdir / f"ns3_spec_{label}.json", workdir / f"ns3_out_{label}.json"
    spec_path.write_text(json.dumps(doc))
    if not Path(python).exists():
        raise SimError(f"ns-3's Python {python} does not exist: bwfabric.sh simulate fabric-validate-ns3 sets it up "
                       "(or --set ns3_python=PATH, a venv with PyPI ns3)")
    proc = subprocess.Popen([python, str(DRIVER), str(spec_path), str(out_path)], stderr=subprocess.PIPE, text=True)
    last = ""
    for line in proc.stderr:
        if line.startswith("ns-3:"):
            last = line.strip()
            if not quiet:
                print(f"\r{label}: {last}   ", end="", file=sys.stderr, flush=True)
        elif "materialize symbols" not in line:                 # cling's harmless warnings (docs/platform.md)
            print(line, end="", file=sys.stderr)
    if not quiet and last:
        print(file=sys.stderr)
    if proc.wait() != 0:
        raise SimError(f"ns-3 run {label} failed (exit {proc.returncode})")
    return json.loads(out_path.read_text())


def compare(cfg: Ns3Config, flows: Flows, fct_ns3: np.ndarray, fct_sim: np.ndarray,
            agg_ns3_bps: float, agg_sim_bps: float) -> dict:
    """One load's row: aggregates, mean and p99 FCT over the connections
    started in the window both finished, by size bucket too."""
    inside = (flows.start_s >= cfg.warmup) & (flows.start_s < cfg.seconds)
    both = inside & np.isfinite(fct_ns3) & np.isfinite(fct_sim)
    s_ns3, s_sim = stats(fct_ns3[both]), stats(fct_sim[both])
    agg_ratio = agg_sim_bps / agg_ns3_bps if agg_ns3_bps > 0 else None
    fct_ratio = s_sim["mean_s"] / s_ns3["mean_s"] if s_ns3["mean_s"] else None
    p99_ratio = s_sim["p99_s"] / s_ns3["p99_s"] if s_ns3["p99_s"] else None
    by_size = {}
    for lo, hi, name in SIZE_BUCKETS:
        sel = both & (flows.size_bytes >= lo) & (flows.size_bytes < hi)
        by_size[name] = {"ns3": stats(fct_ns3[sel]), "flowsim": stats(fct_sim[sel])}
    return {"connections": int(inside.sum()), "both_finished": int(both.sum()),
            "ns3_unfinished": int((inside & ~np.isfinite(fct_ns3)).sum()),
            "flowsim_unfinished": int((inside & ~np.isfinite(fct_sim)).sum()),
            "ns3_aggregate_mbps": agg_ns3_bps / 1e6, "flowsim_aggregate_mbps": agg_sim_bps / 1e6,
            "aggregate_ratio": agg_ratio, "ns3_fct": s_ns3, "flowsim_fct": s_sim, "mean_fct_ratio": fct_ratio,
            "p99_fct_ratio": p99_ratio, "by_size": by_size,
            "within": bool(agg_ratio is not None and abs(agg_ratio - 1) <= AGG_BOUND
                           and fct_ratio is not None and abs(fct_ratio - 1) <= FCT_BOUND)}


def run(cfg: Ns3Config, out: Path, quiet: bool = False) -> dict:
    from mininet_topos.builders import fattree

    cfg.check()
    net = SimNet(fattree(cfg.k, link_mbps=cfg.link_mbps))
    table = routes(net)
    cdf = SizeCdf.load(cfg.workload)
    doc = {"config": asdict(cfg), "hosts": len(net.view.hosts), "switches": len(net.view.switches), "rows": {}}
    end = cfg.seconds + cfg.drain
    window = cfg.seconds - cfg.warmup
    for load in cfg.loads:
        flows = open_loop(net, cdf, load, cfg.seconds, cfg.seed)
        t0 = time.perf_counter()
        res = Engine(net, make_router(net, "single_path"), "fair", 0.0, slot_s=SLOT_S).run(flows, end)
        sim_wall = time.perf_counter() - t0
        got = run_ns3(cfg.python(), spec(cfg, net, table, flows), Path(out), f"load{load:g}", quiet)
        fct_ns3 = np.array([math.nan if f is None else f for f in got["fct_s"]], dtype=float)
        if fct_ns3.size != flows.src.size:
            raise SimError(f"ns-3 returned {fct_ns3.size} connections of {flows.src.size}")
        row = compare(cfg, flows, fct_ns3, res.fct_s, got["window_bytes"] * 8 / window,
                      res.aggregate_bps((cfg.warmup, cfg.seconds)))
        row["wall_s"] = {"ns3": got["wall_s"], "flowsim": sim_wall}
        doc["rows"][f"{load:g}"] = row
        if not quiet:
            print_row(f"{load:g}", row)
        save(doc, out, "validate_ns3", _plot)           # after each load: a long run's rows are kept as they come
    return doc


HEADER = (f"{'load':>4} {'conns':>6} {'agg ns-3':>9} {'agg flow':>9} {'ratio':>6} {'mean ns-3':>9} {'mean flow':>9} "
          f"{'ratio':>6} {'p99 ns-3':>9} {'p99 flow':>9} {'ratio':>6}  within   (Mb/s, ms)")


def print_row(load: str, r: dict) -> None:
    def ratio(x):
        return "-" if x is None else f"{x:.2f}"
    print(f"{load:>4} {r['both_finished']:>6} {r['ns3_aggregate_mbps']:>9.0f} {r['flowsim_aggregate_mbps']:>9.0f} "
          f"{ratio(r['aggregate_ratio']):>6} {fmt_ms(r['ns3_fct']['mean_s']):>9} {fmt_ms(r['flowsim_fct']['mean_s']):>9} "
          f"{ratio(r['mean_fct_ratio']):>6} {fmt_ms(r['ns3_fct']['p99_s']):>9} {fmt_ms(r['flowsim_fct']['p99_s']):>9} "
          f"{ratio(r['p99_fct_ratio']):>6}  {'yes' if r['within'] else 'NO'}", flush=True)
    print("      mean FCT by size (ns-3 / flow-level, ms): " + "; ".join(
        f"{name} {fmt_ms(b['ns3']['mean_s'])} / {fmt_ms(b['flowsim']['mean_s'])} (n {b['ns3']['n']})"
        for name, b in r["by_size"].items()) + f"; unfinished ns-3 {r['ns3_unfinished']}, flow-level "
        f"{r['flowsim_unfinished']}; wall ns-3 {r['wall_s']['ns3']:.0f} s, flow-level {r['wall_s']['flowsim']:.1f} s",
        flush=True)


def _plot(doc: dict, path: Path) -> None:
    loads = [float(x) for x in doc["rows"]]
    rows = list(doc["rows"].values())
    series = {who: (loads, [r[f"{key}_aggregate_mbps"] for r in rows], [r[f"{key}_fct"]["mean_s"] for r in rows],
                    [r[f"{key}_fct"]["p99_s"] for r in rows])
              for who, key in (("ns-3 (packet level)", "ns3"), ("flow level", "flowsim"))}
    c = doc["config"]
    load_panels(series, f"FatTree k={c['k']} ({doc['hosts']} hosts, {c['link_mbps']:g} Mb/s), {c['workload']}, "
                f"single_path placements, {c['seconds']:g} s of arrivals: flow level vs ns-3 {c['tcp']}", path)


def main(sets: list[str], out: Path, as_json: bool) -> int:
    try:
        cfg = parse_sets(Ns3Config, sets)
    except SimError as exc:
        print(f"bwfabric simulate fabric-validate-ns3: {exc}", file=sys.stderr)
        return 2
    if not as_json:
        print(HEADER, flush=True)
    try:
        doc = run(cfg, out, quiet=as_json)
    except SimError as exc:
        print(f"bwfabric simulate fabric-validate-ns3: {exc}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(doc["rows"], indent=1))
    return 0 if all(r["within"] for r in doc["rows"].values()) else 1
