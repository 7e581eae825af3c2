"""Coupled MPTCP congestion control on emulated paths (issue #23): a
sender namespace A and a receiver B joined by paths, each a veth pair
through a delay line (mininet_topos.delayline) and a token bucket after
it (the path's rate and its drop-tail queue). Subflows are pinned to paths by source address
(policy routing on A): path i's addresses are 10.78.i.1, .11, .21, ...;
B answers on the path it was reached by.

- ``disjoint``: one path per subflow group -- path i carries the subflows
  from its addresses;
- ``shared``: one path whose token bucket every subflow (and a competing
  TCP flow, if asked) shares: a shared bottleneck.

A's congestion control is chosen as the product chooses it: the agent's
map bwf_ccsel (by the subflow's source address), read by bwf_sockops. The
BPF programs record every decision into bwf_cctrace when asked
(``trace=True``), and :func:`hostagent.coupled_models.replay` checks them.

    python -m experiments.coupled check [--seconds 8]       # the three controls against their models
    python -m experiments.coupled lia-shared                 # LIA vs one TCP flow on one bottleneck
    python -m experiments.coupled vm [--slices 30 120 480]   # LIA vs LIA-VM under VM scheduling
    python -m experiments.coupled ese                        # MPTCP-D's elimination, TP / FP
    python -m experiments.coupled cubic | transfer | throughput | lia-shared ...
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from dataclasses import dataclass, field

from benchmarks.delayline import sh
from hostagent import bpfring, cc
from hostagent.coupled_models import replay
from hostagent.plan import MPTCP_CCS
from mininet_topos.delayline import DelayLine, offloads_off

PORT = 5401
SENDER = textwrap.dedent('''
    import socket, sys, time, json
    dst, secs, proto = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    src = sys.argv[4] if len(sys.argv) > 4 else None
    size = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    cc = sys.argv[6] if len(sys.argv) > 6 else ""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, proto)
    if cc: s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())   # root: any registered one
    if src: s.bind((src, 0))
    s.connect((dst, %d)); buf = b"x" * 65536; sent = 0; t0 = time.time()
    while (size and sent < size) or (not size and time.time() - t0 < secs):
        sent += s.send(buf if not size else buf[:min(65536, size - sent)])
    s.shutdown(socket.SHUT_WR); s.recv(1)
    print(json.dumps({"sent": sent, "seconds": time.time() - t0}), flush=True)
''' % PORT)
SINK = textwrap.dedent('''
    import socket, sys, threading, time, json
    n, warm = int(sys.argv[1]), float(sys.argv[2])
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", %d)); srv.listen(16); print("ready", flush=True)
    got = {}
    def rx(c, i):
        t0 = time.time(); b = 0; first = None
        while True:
            d = c.recv(1 << 16)
            if not d: break
            now = time.time() - t0
            if now >= warm:
                b += len(d); first = now if first is None else first
        got[i] = {"bytes": b, "seconds": time.time() - t0, "measured_s": (time.time() - t0) - (first or 0)}
        c.sendall(b"k"); c.close()
    ths = []
    for i in range(n):
        c, peer = srv.accept()
        t = threading.Thread(target=rx, args=(c, i)); t.start(); ths.append(t)
    for t in ths: t.join()
    print(json.dumps(got), flush=True)
''' % PORT)
MAX_ADDRS = 8


@dataclass
class Path:
    delay_us: float = 250.0          # one way
    mbps: float = 100.0
    addrs: int = 1                   # subflow source addresses on this path
    gate: dict | None = None         # DelayLine gating options (VM scheduling)
    queue_bytes: int | None = None   # the token bucket's FIFO; default 2 x the bandwidth-delay product, >= 150 kB


@dataclass
class Bed:
    a: str
    b: str
    paths: list
    lines: list = field(default_factory=list)
    ns: list = field(default_factory=list)

    def addrs(self, i: int) -> list[str]:
        return [f"10.78.{i + 1}.{1 + 10 * j}" for j in range(self.paths[i].addrs)]

    @property
    def dst(self) -> str:
        return "10.78.1.2"

    def receiver_addrs(self) -> list[str]:
        return [f"10.78.{i + 1}.2" for i in range(len(self.paths))]

    def all_addrs(self) -> list[str]:
        return [x for i in range(len(self.paths)) for x in self.addrs(i)]


@contextlib.contextmanager
def testbed(paths: list[Path]):
    """A, B and one delay-line namespace per path; yields a :class:`Bed`.
    Everything it made is removed by name on the way out."""
    tag = uuid.uuid4().hex[:5]
    a, b = f"cpA{tag}", f"cpB{tag}"
    bed = Bed(a, b, paths)
    try:
        for n in (a, b):
            sh("ip", "netns", "add", n)
            bed.ns.append(n)
            sh("ip", "-n", n, "link", "set", "lo", "up")
        for i, p in enumerate(paths):
            m = f"cpM{i}{tag}"
            sh("ip", "netns", "add", m)
            bed.ns.append(m)
            ai, bi = f"a{i}", f"b{i}"
            sh("ip", "link", "add", ai, "netns", a, "type", "veth", "peer", "name", "xa", "netns", m)
            sh("ip", "link", "add", bi, "netns", b, "type", "veth", "peer", "name", "xb", "netns", m)
            for j, addr in enumerate(bed.addrs(i)):
                sh("ip", "-n", a, "addr", "add", f"{addr}/24", "dev", ai)
            sh("ip", "-n", b, "addr", "add", f"10.78.{i + 1}.2/24", "dev", bi)
            for n, dev in ((a, ai), (b, bi), (m, "xa"), (m, "xb")):
                sh("ip", "-n", n, "link", "set", dev, "up")
                offloads_off(dev, n)
            # the path's rate on A's side; a FIFO of ~ 2 x the bandwidth-delay product (>= 100 packets)
            bdp = p.mbps * 1e6 / 8 * 2 * p.delay_us * 1e-6
            limit = p.queue_bytes or int(max(2 * bdp, 150_000))
            # the bottleneck is in the path, not at the sender: a queue at the sender's own interface is
            # held short by TCP small queues (per socket), and two Reno flows through one shared it 1.5-3.5 : 1
            sh("ip", "netns", "exec", m, "tc", "qdisc", "replace", "dev", "xb", "root", "tbf", "rate", f"{p.mbps}mbit",
               "burst", "32kb", "limit", str(limit))
            # subflows from path i's addresses leave by path i
            sh("ip", "netns", "exec", a, "ip", "route", "add", "default", "dev", ai, "table", str(100 + i))
            for addr in bed.addrs(i):
                sh("ip", "netns", "exec", a, "ip", "rule", "add", "from", addr, "table", str(100 + i))
            bed.lines.append(DelayLine("xa", "xb", p.delay_us, netns=m, **(p.gate or {})).start())
        for n in (a, b):
            sh("ip", "netns", "exec", n, "sysctl", "-qw", "net.mptcp.enabled=1")
            sh("ip", "netns", "exec", n, "sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0")
            sh("ip", "netns", "exec", n, "sysctl", "-qw", "net.ipv4.tcp_no_metrics_save=1")
            # windows able to cover a descheduled VM's off-periods (100 Mb/s x 1.5 s = 19 MB)
            for k in ("net.ipv4.tcp_wmem", "net.ipv4.tcp_rmem"):
                sh("ip", "netns", "exec", n, "sysctl", "-qw", f"{k}=4096 131072 67108864")
        extra = [x for x in bed.all_addrs() if x != bed.addrs(0)[0]]
        sh("ip", "netns", "exec", a, "ip", "mptcp", "limits", "set", "subflows", str(min(8, len(extra))),
           "add_addr_accepted", "0")
        sh("ip", "netns", "exec", b, "ip", "mptcp", "limits", "set", "subflows", "8", "add_addr_accepted", "0")
        for k, addr in enumerate(extra):
            i = int(addr.split(".")[2]) - 1
            sh("ip", "netns", "exec", a, "ip", "mptcp", "endpoint", "add", addr, "dev", f"a{i}", "id", str(k + 1),
               "subflow")
        # the receiver's subflows: plain Reno, none of BG/WC's settings (bwf_sockops would give its joins bwf_wc)
        select(bed.receiver_addrs(), "uncoupled")
        yield bed
    finally:
        with contextlib.suppress(Exception):
            select(bed.receiver_addrs(), "bgwc")
        for line in bed.lines:
            with contextlib.suppress(Exception):
                line.stop()
        for n in bed.ns:
            sh("ip", "netns", "del", n, check=False)


def select(addrs: list[str], kind: str) -> None:
    """The agent's bwf_ccsel entries: ``kind`` for subflows from these addresses."""
    if kind not in MPTCP_CCS:
        raise ValueError(f"congestion control {kind!r}: one of {', '.join(MPTCP_CCS)}")
    pin = cc.BPFFS / cc.CCSEL_MAP
    for addr in addrs:
        key = [str(x) for x in ipaddress.IPv4Address(addr).packed]
        if kind == "bgwc":
            sh("bpftool", "map", "delete", "pinned", str(pin), "key", *key, check=False)
        else:
            val = [str(x) for x in MPTCP_CCS.index(kind).to_bytes(4, "little")]
            sh("bpftool", "map", "update", "pinned", str(pin), "key", *key, "value", *val)


def set_conf(index: int, value: int) -> None:
    key = [str(x) for x in index.to_bytes(4, "little")]
    val = [str(x) for x in int(value).to_bytes(8, "little")]
    sh("bpftool", "map", "update", "pinned", str(cc.BPFFS / "bwf_ccconf"), "key", *key, "value", *val)


CONF = {"trace": 0, "ese_alpha": 1, "ese_beta": 2, "ese_n": 3, "theta": 4, "delta_ms": 5, "ese_off": 6,
        "ese_frozen": 7, "ese_confirm": 8}


class Tracer:
    """bwf_cctrace read while it is on (one reader on the machine)."""

    def __init__(self):
        self.records: list = []
        self.stop = threading.Event()

    def __enter__(self):
        self.ring = bpfring.Ring(cc.BPFFS / "bwf_cctrace")
        self.ring.drain()
        set_conf(CONF["trace"], 1)
        self.th = threading.Thread(target=self._run, daemon=True)
        self.th.start()
        return self

    def _run(self):
        while not self.stop.is_set():
            self.records += [bpfring.parse_trace(r) for r in self.ring.poll(100)]

    def __exit__(self, *exc):
        set_conf(CONF["trace"], 0)
        self.stop.set()
        self.th.join(5)
        self.records += [bpfring.parse_trace(r) for r in self.ring.drain()]
        self.ring.close()


def stats() -> dict:
    vals = cc._counters("bwf_ccstat", ("increases", "skipped_reads", "ese_closed", "off_periods", "trace_lost"))
    return vals


def run_flows(bed: Bed, seconds: float, mptcp: int = 1, tcp: int = 0, warm: float = 2.0,
              size: int = 0, tcp_cc: str = "reno") -> dict:
    """``mptcp`` MPTCP connections from A's first address and ``tcp``
    plain TCP flows (on path 1, congestion control ``tcp_cc``: a new
    namespace's default is the host's, and only the init namespace may
    change it to one not in tcp_allowed_congestion_control); returns each
    one's goodput (Mb/s, after ``warm`` s) and duration, and the CPU time
    the endpoints' processes used (see :func:`_cgroup`)."""
    cg = _cgroup()
    sink = subprocess.Popen(_in_cgroup(cg, ["ip", "netns", "exec", bed.b, sys.executable, "-c", SINK,
                                            str(mptcp + tcp), str(warm)]), stdout=subprocess.PIPE, text=True)
    assert sink.stdout.readline().strip() == "ready"
    procs = []
    for k in range(mptcp + tcp):
        proto = 262 if k < mptcp else 6
        procs.append(subprocess.Popen(_in_cgroup(cg, ["ip", "netns", "exec", bed.a, sys.executable, "-c", SENDER,
                                                      bed.dst, str(seconds), str(proto), bed.addrs(0)[0], str(size),
                                                      tcp_cc if proto == 6 else ""]),
                                      stdout=subprocess.PIPE, text=True))
        time.sleep(0.05)
    for p in procs:
        p.communicate(timeout=seconds + 30)
    got = json.loads(sink.communicate(timeout=60)[0])
    cpu_s = _cgroup_done(cg)
    # the sink numbers connections by accept order; senders started 50 ms apart are accepted in that order
    out = []
    for k in range(mptcp + tcp):
        g = got[str(k)]
        out.append({"kind": "mptcp" if k < mptcp else "tcp", "seconds": g["seconds"],
                    "mbps": g["bytes"] * 8 / 1e6 / max(g["measured_s"], 1e-9), "bytes": g["bytes"]})
    return {"flows": out, "endpoint_cpu_s": cpu_s}


def _cgroup():
    """A cgroup v2 directory of its own for the run's senders and receiver:
    their CPU time (cpu.stat usage_usec) counts their system calls and the
    protocol work done in them -- the hosts' share, without the delay
    lines'. None where cgroup v2 is not mounted."""
    try:
        root = cc.cgroup2_root()
    except cc.CcError:
        return None
    d = root / f"bwf-coupled-{uuid.uuid4().hex[:8]}"
    d.mkdir()
    return d


def _in_cgroup(cg, cmd: list[str]) -> list[str]:
    if cg is None:
        return cmd
    return ["sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$@"', "sh", *cmd]


def _cgroup_done(cg) -> float | None:
    if cg is None:
        return None
    try:
        stat = dict(line.split() for line in (cg / "cpu.stat").read_text().splitlines())
        return int(stat["usage_usec"]) / 1e6
    finally:
        for _ in range(50):
            try:
                cg.rmdir()
                break
            except OSError:          # its processes not reaped yet
                time.sleep(0.1)


def check(seconds: float = 8.0) -> dict:
    """Each coupled control on two disjoint paths of unequal delay (and
    LIA-VM also under VM scheduling), traced and replayed."""
    cases = [("lia", [Path(250, 50), Path(1000, 50)]), ("mptcp_d", [Path(250, 50), Path(1000, 50)]),
             ("lia_vm", [Path(250, 50, gate={"on_ms": 30, "off_ms": 90, "off_gap_us": 5000}), Path(1000, 50)])]
    out = {}
    for kind, paths in cases:
        with testbed(paths) as bed:
            select(bed.all_addrs(), kind)
            before = stats()
            with Tracer() as tr:
                flows = run_flows(bed, seconds)
            after = stats()
            select(bed.all_addrs(), "bgwc")
        recs = [r for r in tr.records if r.kind == MPTCP_CCS.index(kind)]
        rep = replay(recs)
        out[kind] = {"records": len(recs), "increases": rep.increases, "worst_rel": rep.worst_rel,
                     "worst_abs_segments": rep.worst_abs, "samples": rep.samples,
                     "worst_srtt_us": rep.worst_srtt_us, "off_periods": rep.off_periods,
                     "off_mismatch": rep.off_mismatch, "uncounted": rep.uncounted,
                     "ese_expected": len(rep.ese_expected), "ese_seen": len(rep.ese_seen),
                     "agrees": rep.agrees(), "flows": flows["flows"],
                     "stats": {k: after[k] - before[k] for k in after},
                     "subflows_seen": len({(r.conn, r.sub) for r in recs})}
    return out


@contextlib.contextmanager
def closer(bed: Bed):
    """hostagent.ese's closer in A (what the agent runs for its VM)."""
    p = subprocess.Popen(["ip", "netns", "exec", bed.a, sys.executable, "-m", "hostagent.ese", *bed.all_addrs()],
                         stdout=subprocess.PIPE, text=True)
    got: list = []
    th = threading.Thread(target=lambda: got.extend(json.loads(x) for x in p.stdout), daemon=True)
    th.start()
    try:
        yield got
    finally:
        time.sleep(0.2)
        p.terminate()
        p.wait(5)
        th.join(2)


def lia_shared(seconds: float, runs: int, delay_us: float = 2500, mbps: float = 50) -> dict:
    """RFC 6356's goal on a shared bottleneck: one MPTCP connection of two
    subflows and one Reno TCP flow through the same token bucket (50 Mb/s,
    5 ms base RTT, a FIFO of 2 bandwidth-delay products): goodput ratio
    MPTCP / TCP for LIA and for uncoupled Reno subflows, next to two TCP
    flows (the ratio's noise floor); and LIA alone on two disjoint paths
    (it should use both)."""
    out: dict = {}
    bdp = mbps * 1e6 / 8 * 2 * delay_us * 1e-6
    for kind in ("lia", "uncoupled", "tcp"):
        ratios = []
        for _ in range(runs):
            with testbed([Path(delay_us, mbps, addrs=2, queue_bytes=int(2 * bdp))]) as bed:
                if kind != "tcp":
                    select(bed.all_addrs(), kind)
                try:
                    flows = run_flows(bed, seconds, mptcp=0 if kind == "tcp" else 1, tcp=2 if kind == "tcp" else 1)
                finally:
                    select(bed.all_addrs(), "bgwc")
            f = flows["flows"]
            ratios.append(f[0]["mbps"] / f[1]["mbps"])
        out[f"{kind}_ratio"] = ratios
    with testbed([Path(delay_us, mbps), Path(delay_us, mbps)]) as bed:
        select(bed.all_addrs(), "lia")
        try:
            out["lia_disjoint_mbps"] = run_flows(bed, seconds, mptcp=1)["flows"][0]["mbps"]
        finally:
            select(bed.all_addrs(), "bgwc")
    out["disjoint_capacity_mbps"] = 2 * mbps
    return out


def throughput(seconds: float, runs: int, kinds=("lia", "mptcp_d", "uncoupled")) -> dict:
    """Goodput of each control on two disjoint paths of unequal delay (50
    Mb/s each, 0.5 and 2 ms RTT) and on one shared bottleneck (two
    subflows, 50 Mb/s, 5 ms RTT); and the energy proxy (no RAPL here): the
    CPU time of the sending and receiving processes -- their system calls
    and the protocol work done in them, not the delay lines' -- per GB
    delivered, for these and one TCP flow."""
    setups = {"disjoint": lambda: [Path(250, 50), Path(1000, 50)],
              "shared_2": lambda: [Path(2500, 50, addrs=2)],
              "shared_4": lambda: [Path(2500, 50, addrs=4)]}
    out: dict = {}
    for name, paths in setups.items():
        for kind in (*kinds, "tcp"):
            if kind == "tcp" and name == "disjoint":
                continue
            vals, cpu = [], []
            for _ in range(runs):
                with testbed(paths()) as bed:
                    if kind != "tcp":
                        select(bed.all_addrs(), kind)
                    try:
                        with closer(bed):
                            res = run_flows(bed, seconds, mptcp=int(kind != "tcp"), tcp=int(kind == "tcp"),
                                            warm=0.0)
                    finally:
                        select(bed.all_addrs(), "bgwc")
                f = res["flows"][0]
                vals.append(f["mbps"])
                if res["endpoint_cpu_s"] is not None and f["bytes"]:
                    cpu.append(res["endpoint_cpu_s"] / (f["bytes"] / 1e9))     # CPU seconds per GB
            out[f"{name}/{kind}"] = {"mbps": vals, "cpu_s_per_gb": cpu}
    return out


def vm(seconds: float, slices: list[float], runs: int, mbps: float = 100.0, gate_dir: str = "ba") -> dict:
    """LIA and LIA-VM on two 100 Mb/s paths of 0.5 ms RTT, the sender a VM
    sharing its CPU with three others (on a slice, off three): by default
    what reaches it (the ACKs) waits for its slices, while what it sent
    drains (``gate_dir`` "ba"; "both" holds both directions, and caps the
    goodput at the duty cycle whatever the control): goodput of each (the
    seed paper's Fig. 7a)."""
    out = []
    for sl in [None, *slices]:
        gate = None if sl is None else {"on_ms": sl, "off_ms": 3 * sl, "off_gap_us": 5000, "gate": gate_dir}
        row = {"slice_ms": sl}
        for kind in ("lia", "lia_vm", "uncoupled"):
            vals = []
            for _ in range(runs):
                with testbed([Path(250, mbps, gate=gate), Path(250, mbps, gate=gate)]) as bed:
                    select(bed.all_addrs(), kind)
                    vals.append(run_flows(bed, seconds, mptcp=1)["flows"][0]["mbps"])
                    select(bed.all_addrs(), "bgwc")
            row[kind] = vals
        out.append(row)
    return {"rows": out}


def cubic(seconds: float, runs: int, slice_ms: float | None = None) -> dict:
    """The seed paper's Figs. 9-10: an MPTCP connection (LIA or LIA-VM) on
    two 100 Mb/s paths of 0.5 ms RTT and one CUBIC flow on the first path:
    the CUBIC flow's goodput next to each. ``slice_ms``: the paths gated
    as a VM's (the CUBIC flow then shares the gate: it leaves the same
    namespace, unlike the paper's other VM)."""
    gate = None if slice_ms is None else {"on_ms": slice_ms, "off_ms": 3 * slice_ms, "off_gap_us": 5000, "gate": "ba"}
    out: dict = {"slice_ms": slice_ms}
    for kind in ("lia", "lia_vm", "uncoupled"):
        rows = []
        for _ in range(runs):
            with testbed([Path(250, 100, gate=gate), Path(250, 100, gate=gate)]) as bed:
                select(bed.all_addrs(), kind)
                try:
                    f = run_flows(bed, seconds, mptcp=1, tcp=1, tcp_cc="cubic")["flows"]
                finally:
                    select(bed.all_addrs(), "bgwc")
            rows.append({"mptcp_mbps": f[0]["mbps"], "cubic_mbps": f[1]["mbps"]})
        out[kind] = rows
    return out


def transfer(runs: int, size_mb: float = 61.0, slice_ms: float = 480.0) -> dict:
    """The seed paper's Fig. 8, scaled: the time to move ``size_mb`` MB
    (the paper: 610 MB) over two 100 Mb/s paths with the sender a
    descheduled VM (on a slice, off three), LIA vs LIA-VM."""
    gate = {"on_ms": slice_ms, "off_ms": 3 * slice_ms, "off_gap_us": 5000, "gate": "ba"}
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


def ese(runs: int, seconds: float = 3.0, alpha: float = 1.3, per_path: int = 1, delay_us: float = 2500,
        frozen: bool = False, confirm: int = 0) -> dict:
    """MPTCP-D's extra-subflow elimination: ``per_path`` + 1 subflows on one
    bottleneck (a closing there is right: TP) and ``per_path`` subflows on
    each of two disjoint paths of the same rate and delay (a closing of
    the only subflow of a path is wrong: FP)."""
    set_conf(CONF["ese_alpha"], round(alpha * 1000))
    set_conf(CONF["ese_frozen"], int(frozen))
    set_conf(CONF["ese_confirm"], confirm)
    res = {"alpha": alpha, "delay_us": delay_us, "frozen_reference": frozen, "confirm": confirm, "per_path": per_path,
           "shared": [], "disjoint": []}
    try:
        for setup in ("shared", "disjoint"):
            for _ in range(runs):
                paths = [Path(delay_us, 50, addrs=2 * per_path)] if setup == "shared" else \
                    [Path(delay_us, 50, addrs=per_path), Path(delay_us, 50, addrs=per_path)]
                with testbed(paths) as bed:
                    select(bed.all_addrs(), "mptcp_d")
                    with closer(bed) as closed:
                        flows = run_flows(bed, seconds, mptcp=1, warm=0.5)["flows"]
                    select(bed.all_addrs(), "bgwc")
                by_path: dict = {}
                for c in closed:
                    p = c["src"].split(".")[2]
                    by_path[p] = by_path.get(p, 0) + 1
                res[setup].append({"closed": len(closed), "destroyed": sum(c["destroyed"] for c in closed),
                                   "by_path": by_path, "mbps": flows[0]["mbps"]})
    finally:
        set_conf(CONF["ese_alpha"], 0)
        set_conf(CONF["ese_frozen"], 0)
        set_conf(CONF["ese_confirm"], 0)
    n = max(1, len(res["shared"]))
    res["tp"] = sum(1 for r in res["shared"] if r["closed"]) / n
    # wrong: a disjoint path left with none of its subflows
    res["fp"] = sum(1 for r in res["disjoint"] if any(v >= per_path for v in r["by_path"].values())) / n
    return res


def plot(cmd: str, out, path: str) -> None:
    """One figure per command (PNG)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.6))
    mean = lambda v: sum(v) / len(v)    # noqa: E731
    if cmd == "vm":
        rows = out["rows"]
        xs = ["none" if r["slice_ms"] is None else f"{r['slice_ms']:g}" for r in rows]
        for k, kind in enumerate(("lia", "lia_vm", "uncoupled")):
            ax.bar([i + 0.27 * (k - 1) for i in range(len(rows))], [mean(r[kind]) for r in rows], 0.27, label=kind)
        ax.set_xticks(range(len(rows)), xs)
        ax.set_xlabel("VM slice (ms; off 3 slices)")
        ax.set_ylabel("goodput (Mb/s)")
    elif cmd == "ese":
        xs = [r["alpha"] for r in out]
        ax.plot(xs, [r["tp"] for r in out], "o-", label="TP (shared bottleneck)")
        ax.plot(xs, [r["fp"] for r in out], "s-", label="FP (disjoint paths)")
        ax.set_xlabel("ESE alpha")
        ax.set_ylabel("rate")
        ax.set_ylim(-0.05, 1.05)
    elif cmd == "lia-shared":
        keys = [k for k in out if k.endswith("_ratio")]
        ax.bar(range(len(keys)), [mean(out[k]) for k in keys])
        for i, k in enumerate(keys):
            ax.plot([i] * len(out[k]), out[k], "k.")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xticks(range(len(keys)), [k.replace("_ratio", "") for k in keys])
        ax.set_ylabel("goodput / competing TCP flow")
    elif cmd == "cubic":
        kinds = [k for k in ("lia", "lia_vm", "uncoupled") if k in out]
        ax.bar([i - 0.2 for i in range(len(kinds))], [mean([r["mptcp_mbps"] for r in out[k]]) for k in kinds], 0.4,
               label="MPTCP")
        ax.bar([i + 0.2 for i in range(len(kinds))], [mean([r["cubic_mbps"] for r in out[k]]) for k in kinds], 0.4,
               label="CUBIC flow")
        ax.set_xticks(range(len(kinds)), kinds)
        ax.set_ylabel("goodput (Mb/s)")
    elif cmd == "transfer":
        kinds = [k for k in ("lia", "lia_vm", "uncoupled") if k in out]
        ax.bar(range(len(kinds)), [mean(out[k]) for k in kinds])
        ax.set_xticks(range(len(kinds)), kinds)
        ax.set_ylabel(f"seconds to move {out['size_mb']:g} MB")
    elif cmd == "throughput":
        keys = list(out)
        ax.barh(range(len(keys)), [mean(out[k]["mbps"]) for k in keys])
        ax.set_yticks(range(len(keys)), keys, fontsize=7)
        ax.set_xlabel("goodput (Mb/s)")
    else:
        plt.close(fig)
        return
    ax.set_title(f"experiments.coupled {cmd}")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


KINDS = {
    "check": "LIA, MPTCP-D and LIA-VM traced on two paths and replayed through their reference models",
    "lia-shared": "LIA vs one TCP flow on one bottleneck (ratio), uncoupled and TCP/TCP beside it",
    "throughput": "goodput and CPU per byte of LIA, MPTCP-D, uncoupled (and TCP) on disjoint/shared paths",
    "vm": "LIA vs LIA-VM vs uncoupled under VM scheduling, slices 30/120/480 ms (seed paper Fig. 7a)",
    "ese": "MPTCP-D's extra-subflow elimination: TP on a shared bottleneck, FP on disjoint paths, per alpha",
    "cubic": "a CUBIC flow's goodput next to LIA / LIA-VM / uncoupled MPTCP (seed paper Figs. 9-10)",
    "transfer": "time to move 61 MB (the paper's 610 MB / 10) at a 480 ms slice, LIA vs LIA-VM (Fig. 8)",
}


@dataclass
class Config:
    """``bwfabric experiment coupled-KIND key=value ...``"""
    kind: str = "check"
    seconds: float = 10.0
    runs: int = 2
    slices: tuple[float, ...] = (30.0, 120.0, 480.0)
    gate: str = "ba"
    alpha: tuple[float, ...] = (1.3,)
    per_path: int = 1
    delay_us: float = 2500.0
    frozen: bool = False
    confirm: int = 0
    slice_ms: float = 0.0            # cubic: 0 = no VM scheduling
    size_mb: float = 61.0
    slice_transfer_ms: float = 480.0


def measure(cfg: Config) -> dict | list:
    """The kind's measurement (the BPF side loaded first)."""
    if cfg.kind not in KINDS:
        raise ValueError(f"kind {cfg.kind!r}: one of {', '.join(KINDS)}")
    cc.load()
    if cfg.kind == "check":
        return check(cfg.seconds)
    if cfg.kind == "lia-shared":
        return lia_shared(cfg.seconds, cfg.runs)
    if cfg.kind == "throughput":
        return throughput(cfg.seconds, cfg.runs)
    if cfg.kind == "vm":
        return vm(cfg.seconds, list(cfg.slices), cfg.runs, gate_dir=cfg.gate)
    if cfg.kind == "cubic":
        return cubic(cfg.seconds, cfg.runs, cfg.slice_ms or None)
    if cfg.kind == "transfer":
        return transfer(cfg.runs, cfg.size_mb, cfg.slice_transfer_ms)
    return [ese(cfg.runs, alpha=a, per_path=cfg.per_path, delay_us=cfg.delay_us, frozen=cfg.frozen,
                confirm=cfg.confirm) for a in cfg.alpha]


def run(cfg: Config, out_dir) -> dict | list:
    """The registry's entry: the kind's result (result.json) and figure (figure.png) in ``out_dir``."""
    from pathlib import Path as FsPath
    out_dir = FsPath(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = measure(cfg)
    (out_dir / "result.json").write_text(json.dumps(out, indent=1, default=str))
    plot(cfg.kind, out, str(out_dir / "figure.png"))
    print(json.dumps(out, indent=1, default=str))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m experiments.coupled")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("--seconds", type=float, default=8.0)
    c = sub.add_parser("lia-shared")
    c.add_argument("--seconds", type=float, default=10.0)
    c.add_argument("--runs", type=int, default=2)
    c = sub.add_parser("throughput")
    c.add_argument("--seconds", type=float, default=10.0)
    c.add_argument("--runs", type=int, default=2)
    c = sub.add_parser("vm")
    c.add_argument("--seconds", type=float, default=10.0)
    c.add_argument("--slices", type=float, nargs="+", default=[30, 120, 480])
    c.add_argument("--runs", type=int, default=1)
    c.add_argument("--gate", default="ba", choices=("ba", "ab", "both"))
    c = sub.add_parser("cubic")
    c.add_argument("--seconds", type=float, default=15.0)
    c.add_argument("--runs", type=int, default=2)
    c.add_argument("--slice-ms", type=float, default=None)
    c = sub.add_parser("transfer")
    c.add_argument("--runs", type=int, default=2)
    c.add_argument("--size-mb", type=float, default=61.0)
    c.add_argument("--slice-ms", type=float, default=480.0)
    c = sub.add_parser("ese")
    c.add_argument("--runs", type=int, default=10)
    c.add_argument("--alpha", type=float, nargs="+", default=[1.3])
    c.add_argument("--per-path", type=int, default=1)
    c.add_argument("--delay-us", type=float, default=2500)
    c.add_argument("--frozen", action="store_true", help="the paper's reference: the sample that set TRIG "
                   "(default: the reference subflow's latest sample)")
    c.add_argument("--confirm", type=int, default=0, help="consecutive matching samples before a closing "
                   "(0: the program's default)")
    for name, c in sub.choices.items():
        c.add_argument("--plot", metavar="PNG", help="write the figure here")
    c = sub.add_parser("plot", help="the figure of a saved result: plot CMD RESULT.json PNG")
    c.add_argument("what", choices=("vm", "ese", "lia-shared", "throughput", "cubic", "transfer"))
    c.add_argument("result")
    c.add_argument("png")
    args = ap.parse_args(argv)
    if args.cmd == "plot":
        with open(args.result) as f:
            plot(args.what, json.load(f), args.png)
        return
    given = {k: v for k, v in vars(args).items() if v is not None and k not in ("cmd", "plot")}
    if args.cmd == "transfer" and "slice_ms" in given:
        given["slice_transfer_ms"] = given.pop("slice_ms")
    for k in ("slices", "alpha"):
        if k in given:
            given[k] = tuple(given[k])
    out = measure(Config(kind=args.cmd, **given))
    print(json.dumps(out, indent=1, default=str))
    if args.plot:
        plot(args.cmd, out, args.plot)


if __name__ == "__main__":
    main()
