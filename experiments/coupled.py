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
(``trace=True``), and :func:`bwtesting.coupled_models.replay` checks them.

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
import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from dataclasses import dataclass, field

from mininet_topos.delayline.testbed import sh
from hostagent import bpfring, cc
from bwtesting.coupled_models import replay
from hostagent.plan import MPTCP_CCS
from mininet_topos.delayline import DelayLine, offloads_off

PORT = 5401
SENDER = textwrap.dedent('''
    import socket, sys, time, json
    dst, secs, proto = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    src = sys.argv[4] if len(sys.argv) > 4 else None
    size = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    cc = sys.argv[6] if len(sys.argv) > 6 else ""
    tos = int(sys.argv[7]) if len(sys.argv) > 7 else 0
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, proto)
    if cc: s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())   # root: any registered one
    if tos: s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
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
    spin_us: float | None = None     # the delay line's spinning margin (None: its default; 0 for CPU measurements)
    free_tos: tuple | None = None    # (value, mask): frames of this TOS take an ungated line of their own
                                     # (another VM's traffic through the same path and bottleneck)


@dataclass
class Bed:
    a: str
    b: str
    paths: list
    lines: list = field(default_factory=list)
    ns: list = field(default_factory=list)
    line_stats: list = field(default_factory=list)   # each delay line's statistics, once stopped

    def path_bytes(self) -> list[int]:
        """Bytes each path's bottleneck (its token bucket) has sent so far."""
        out = []
        for i in range(len(self.paths)):
            m = next(n for n in self.ns if n.startswith(f"cpM{i}"))
            data = json.loads(subprocess.run(["ip", "netns", "exec", m, "tc", "-s", "-j", "qdisc", "show", "dev", "xb"],
                                             capture_output=True, text=True, check=True).stdout)
            out.append(sum(q.get("bytes", 0) for q in data if q.get("kind") == "tbf"))
        return out

    def addrs(self, i: int) -> list[str]:
        return [f"10.78.{i + 1}.{1 + 10 * j}" for j in range(self.paths[i].addrs)]

    @property
    def dst(self) -> str:
        return "10.78.1.2"

    def receiver_addrs(self) -> list[str]:
        return [f"10.78.{i + 1}.2" for i in range(len(self.paths))]

    def all_addrs(self) -> list[str]:
        return [x for i in range(len(self.paths)) for x in self.addrs(i)]

    def extra_addrs(self) -> list[str]:
        """The subflow endpoints: every address but the first."""
        return [x for x in self.all_addrs() if x != self.addrs(0)[0]]

    def subflows(self) -> int:
        return min(8, len(self.extra_addrs()))

    def sender_nics(self) -> list[dict]:
        """What the sender configures per path (:func:`sender_commands`): a
        guest's MAC (the tap's peer), addresses, subflow endpoints and their ids."""
        ids = {addr: k + 1 for k, addr in enumerate(self.extra_addrs())}
        return [{"mac": guest_mac(i), "addrs": self.addrs(i), "peer": f"10.78.{i + 1}.2",
                 "endpoints": [x for x in self.addrs(i) if x in ids],
                 "endpoint_ids": [ids[x] for x in self.addrs(i) if x in ids]} for i in range(len(self.paths))]


def guest_mac(i: int) -> str:
    return f"52:54:00:78:{i + 1:02x}:01"


def sender_commands(nics: list[dict], devs: list[str], subflows: int) -> list[list[str]]:
    """The sender's side of the testbed, wherever it runs (namespace A, or
    a guest kernel): per path its addresses on ``devs[i]``, policy routing
    so that subflows from path i's addresses leave by path i, and the MPTCP
    endpoints and limits."""
    cmds = []
    for i, (nic, dev) in enumerate(zip(nics, devs)):
        cmds += [["ip", "addr", "add", f"{addr}/24", "dev", dev] for addr in nic["addrs"]]
        cmds += [["ip", "link", "set", dev, "up"], ["ip", "route", "add", "default", "dev", dev, "table", str(100 + i)]]
        cmds += [["ip", "rule", "add", "from", addr, "table", str(100 + i)] for addr in nic["addrs"]]
        cmds += [["ip", "mptcp", "endpoint", "add", addr, "dev", dev, "id", str(k), "subflow"]
                 for addr, k in zip(nic["endpoints"], nic["endpoint_ids"])]
    return cmds + [["ip", "mptcp", "limits", "set", "subflows", str(subflows), "add_addr_accepted", "0"]]


# both ends' namespaces (and a guest sender's kernel)
SENDER_SYSCTLS = {
    "net.mptcp.enabled": "1",
    "net.ipv4.conf.all.rp_filter": "0",
    "net.ipv4.tcp_no_metrics_save": "1",
    # a TCP flow's answers carry the TOS its SYN came with (Path.free_tos sorts by it both ways)
    "net.ipv4.tcp_reflect_tos": "1",
    # windows able to cover a descheduled VM's off-periods (100 Mb/s x 1.5 s = 19 MB)
    "net.ipv4.tcp_wmem": "4096 131072 67108864",
    "net.ipv4.tcp_rmem": "4096 131072 67108864",
}


@contextlib.contextmanager
def testbed(paths: list[Path], guest: bool = False):
    """A, B and one delay-line namespace per path; yields a :class:`Bed`.
    Everything it made is removed by name on the way out. ``guest``: A is
    only a switch -- per path a bridge joining the path's veth and a tap
    ``t<i>`` for a guest sender's NIC (experiments.vmguest), which holds
    the addresses, routes and endpoints A would."""
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
            if guest:
                sh("ip", "-n", a, "link", "add", f"br{i}", "type", "bridge", "forward_delay", "0")
                sh("ip", "-n", a, "tuntap", "add", f"t{i}", "mode", "tap")
                for dev in (ai, f"t{i}"):
                    sh("ip", "-n", a, "link", "set", dev, "master", f"br{i}")
                for dev in (f"br{i}", f"t{i}"):
                    sh("ip", "-n", a, "link", "set", dev, "up")
                offloads_off(f"t{i}", a)
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
            if p.free_tos and p.gate:
                bed.lines.append(DelayLine("xa", "xb", p.delay_us, netns=m, spin_us=p.spin_us, not_tos=p.free_tos,
                                           **p.gate).start())
                bed.lines.append(DelayLine("xa", "xb", p.delay_us, netns=m, spin_us=p.spin_us,
                                           tos=p.free_tos).start())
            else:
                bed.lines.append(DelayLine("xa", "xb", p.delay_us, netns=m, spin_us=p.spin_us,
                                           **(p.gate or {})).start())
        for n in (a, b):
            for k, v in SENDER_SYSCTLS.items():
                sh("ip", "netns", "exec", n, "sysctl", "-qw", f"{k}={v}")
        sh("ip", "netns", "exec", b, "ip", "mptcp", "limits", "set", "subflows", "8", "add_addr_accepted", "0")
        if not guest:
            for cmd in sender_commands(bed.sender_nics(), [f"a{i}" for i in range(len(paths))], bed.subflows()):
                sh("ip", "netns", "exec", a, *cmd)
        # the receiver's subflows: plain Reno, none of BG/WC's settings (bwf_sockops would give its joins bwf_wc)
        select(bed.receiver_addrs(), "uncoupled")
        yield bed
    finally:
        with contextlib.suppress(Exception):
            select(bed.receiver_addrs(), "bgwc")
        for line in bed.lines:
            with contextlib.suppress(Exception):
                bed.line_stats.append(line.stop())
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


class Stalled(RuntimeError):
    """A run's connection stopped delivering (upstream MPTCP can leave a
    hole at the connection level when a subflow is destroyed with data
    the others have to resend; see docs/coupled.md)."""


def run_flows(bed: Bed, seconds: float, mptcp: int = 1, tcp: int = 0, warm: float = 2.0,
              size: int = 0, tcp_cc: str = "reno", tcp_tos: int = 0) -> dict:
    """``mptcp`` MPTCP connections from A's first address and ``tcp``
    plain TCP flows (on path 1, congestion control ``tcp_cc``: a new
    namespace's default is the host's, and only the init namespace may
    change it to one not in tcp_allowed_congestion_control); returns each
    one's goodput (Mb/s, after ``warm`` s) and duration, and the CPU time
    the endpoints' processes used (see :func:`_cgroup`)."""
    cg = _cgroup()
    machine0 = machine_cpu_s()
    sink = subprocess.Popen(_in_cgroup(cg, ["ip", "netns", "exec", bed.b, sys.executable, "-c", SINK,
                                            str(mptcp + tcp), str(warm)]), stdout=subprocess.PIPE, text=True)
    assert sink.stdout.readline().strip() == "ready"
    procs = []
    for k in range(mptcp + tcp):
        proto = 262 if k < mptcp else 6
        procs.append(subprocess.Popen(_in_cgroup(cg, ["ip", "netns", "exec", bed.a, sys.executable, "-c", SENDER,
                                                      bed.dst, str(seconds), str(proto), bed.addrs(0)[0], str(size),
                                                      tcp_cc if proto == 6 else "",
                                                      str(tcp_tos if proto == 6 else 0)]),
                                      stdout=subprocess.PIPE, text=True))
        time.sleep(0.05)
    try:
        for p in procs:
            p.communicate(timeout=seconds + 30)
        got = json.loads(sink.communicate(timeout=60)[0])
    except subprocess.TimeoutExpired:
        # what the two ends' sockets hold, MPTCP and subflows, for the record (ss -M: the MPTCP sockets)
        state = {ns: sh("ip", "netns", "exec", ns, "ss", "-tniMH", check=False).stdout +
                 sh("ip", "netns", "exec", ns, "ss", "-tniH", check=False).stdout for ns in (bed.a, bed.b)}
        for p in (*procs, sink):
            p.kill()
            p.wait(5)
        _cgroup_done(cg)
        raise Stalled(f"a connection moved nothing for 30 s past its {seconds:g} s", state) from None
    machine1 = machine_cpu_s()
    cpu_s = _cgroup_done(cg)
    # the sink numbers connections by accept order; senders started 50 ms apart are accepted in that order
    out = []
    for k in range(mptcp + tcp):
        g = got[str(k)]
        out.append({"kind": "mptcp" if k < mptcp else "tcp", "seconds": g["seconds"],
                    "mbps": g["bytes"] * 8 / 1e6 / max(g["measured_s"], 1e-9), "bytes": g["bytes"]})
    return {"flows": out, "endpoint_cpu_s": cpu_s, "machine_cpu_s": machine1 - machine0}


def machine_cpu_s() -> float:
    """The machine's busy CPU time so far, in seconds, to the microsecond:
    wall time x CPUs less /proc/stat's idle and iowait, which NO_HZ
    measures exactly (its busy columns are tick samples, which miss the
    short wake-ups a packet-moving machine is made of: the delay lines'
    own exact run time came out above them)."""
    with open("/proc/stat") as f:
        line = f.readline()
        t = time.monotonic()
    return busy_cpu_s(line, t, os.cpu_count(), os.sysconf("SC_CLK_TCK"))


def busy_cpu_s(stat_cpu_line: str, wall_s: float, cpus: int, ticks_per_s: int) -> float:
    """:func:`machine_cpu_s`'s formula on one ``cpu`` line of /proc/stat
    (user nice system idle iowait ...): wall x CPUs less idle and iowait."""
    vals = [int(x) for x in stat_cpu_line.split()[1:]]
    return wall_s * cpus - (vals[3] + vals[4]) / ticks_per_s


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
             ("lia_vm", [Path(250, 50, gate=vm_gate(30, direction="both")), Path(1000, 50)])]
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
def closer(bed: Bed, by_endpoint: bool = False):
    """hostagent.ese's closer in A (what the agent runs for its VM)."""
    p = subprocess.Popen(["ip", "netns", "exec", bed.a, sys.executable, "-m", "hostagent.ese",
                          *(["--by-endpoint"] if by_endpoint else []), *bed.all_addrs()],
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


BLAST = textwrap.dedent('''
    import socket, sys, time
    dst, n = sys.argv[1], int(sys.argv[2])
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    buf = b"x" * 1400
    for i in range(n):
        s.sendto(buf, (dst, 9))
        if i % 50 == 49:
            time.sleep(0.004)          # ~ 140 Mb/s: below what the line carries, so it drops nothing
''')


def wire_cost(frames: int = 200000) -> dict:
    """What the delay line itself costs per frame it moves (its exact run
    time / frames), with the receiver dropping the frames at its interface
    (an nftables netdev ingress rule, before the IP stack; this kernel has no tc classifiers) so that no receiving stack's work
    runs inside the line's system calls. The energy proxy's ``hosts``
    figure subtracts this times the frames the lines moved."""
    with testbed([Path(2500, 1000, spin_us=0)]) as bed:
        subprocess.run(["ip", "netns", "exec", bed.b, "nft", "-f", "-"], check=True, text=True,
                       input="table netdev wire {\n chain in {\n type filter hook ingress device b0 priority 0;\n"
                             " ip protocol udp drop\n }\n}\n")
        sh("ip", "netns", "exec", bed.a, "ping", "-c", "1", "-W", "1", bed.dst, check=False)   # ARP resolved first
        line = bed.lines[0]
        c0 = line.cpu_seconds()
        sh("ip", "netns", "exec", bed.a, sys.executable, "-c", BLAST, bed.dst, str(frames))
        time.sleep(0.1)                # the last frames' hold
        c1 = line.cpu_seconds()
    st = bed.line_stats[0]
    moved = st["a_to_b"]["frames"] + st["b_to_a"]["frames"]
    return {"frames": moved, "drops": st["a_to_b"]["drops"], "cpu_s": c1 - c0,
            "us_per_frame": (c1 - c0) / max(moved, 1) * 1e6}


def throughput(seconds: float, runs: int, kinds=("lia", "mptcp_d", "uncoupled")) -> dict:
    """Goodput of each control on two disjoint paths of unequal delay (50
    Mb/s each, 0.5 and 2 ms RTT) and on one shared bottleneck (two or four
    subflows, 50 Mb/s, 5 ms RTT); and the energy proxy (no RAPL here): CPU
    time per GB delivered, for these and one TCP flow, three ways --
    ``machine``: the busy time of the whole (otherwise idle) machine
    (:func:`machine_cpu_s`); ``hosts``: that less the wire's share, the
    frames the delay lines moved times their calibrated cost per frame
    (:func:`wire_cost`; the lines' own run time cannot be subtracted as
    it is: the receiving stacks run inside their system calls);
    ``endpoints``: the sending and
    receiving processes' cgroup (their system calls and the protocol work
    done in them). The delay lines do not spin here (``spin_us=0``): a
    spinning line's time tracks idle gaps, not traffic."""
    setups = {"disjoint": lambda: [Path(250, 50, spin_us=0), Path(1000, 50, spin_us=0)],
              "shared_2": lambda: [Path(2500, 50, addrs=2, spin_us=0)],
              "shared_4": lambda: [Path(2500, 50, addrs=4, spin_us=0)]}
    wire = wire_cost()
    out: dict = {"wire": wire}
    for name, paths in setups.items():
        for kind in (*kinds, "tcp"):
            if kind == "tcp" and name == "disjoint":
                continue
            vals: list = []
            cpu: dict = {"machine": [], "hosts": [], "endpoints": []}
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
                gb = f["bytes"] / 1e9
                frames = sum(st[d]["frames"] for st in bed.line_stats for d in ("a_to_b", "b_to_a"))
                if gb:
                    cpu["machine"].append(res["machine_cpu_s"] / gb)
                    cpu["hosts"].append((res["machine_cpu_s"] - frames * wire["us_per_frame"] / 1e6) / gb)
                    if res["endpoint_cpu_s"] is not None:
                        cpu["endpoints"].append(res["endpoint_cpu_s"] / gb)
            out[f"{name}/{kind}"] = {"mbps": vals, "cpu_s_per_gb": cpu}
    return out


def vm_gate(slice_ms: float | None, off_ms: float | None = None, direction: str = "ba") -> dict | None:
    """The delay line's gate for a descheduled sender VM: on a slice, off
    ``off_ms`` (three slices: three other VMs share its CPU), a trickle
    while off; None without scheduling."""
    if slice_ms is None:
        return None
    return {"on_ms": slice_ms, "off_ms": 3 * slice_ms if off_ms is None else off_ms, "off_gap_us": 5000,
            "gate": direction}


def _goodputs(seconds: float, runs: int, gate: dict | None, mbps: float) -> dict:
    """LIA, LIA-VM and uncoupled MPTCP on two gated paths of 0.5 ms RTT:
    each one's goodput per run."""
    row = {}
    for kind in ("lia", "lia_vm", "uncoupled"):
        vals = []
        for _ in range(runs):
            with testbed([Path(250, mbps, gate=gate), Path(250, mbps, gate=gate)]) as bed:
                select(bed.all_addrs(), kind)
                try:
                    vals.append(run_flows(bed, seconds, mptcp=1)["flows"][0]["mbps"])
                finally:
                    select(bed.all_addrs(), "bgwc")
        row[kind] = vals
    return row


def vm(seconds: float, slices: list[float], runs: int, mbps: float = 100.0, gate_dir: str = "ba") -> dict:
    """LIA and LIA-VM on two 100 Mb/s paths of 0.5 ms RTT, the sender a VM
    sharing its CPU with three others (on a slice, off three): by default
    what reaches it (the ACKs) waits for its slices, while what it sent
    drains (``gate_dir`` "ba"; "both" holds both directions, and caps the
    goodput at the duty cycle whatever the control): goodput of each (the
    seed paper's Fig. 7a)."""
    return {"rows": [{"slice_ms": sl, **_goodputs(seconds, runs, vm_gate(sl, direction=gate_dir), mbps)}
                     for sl in [None, *slices]]}


def vm_guest(seconds: float, slices: list[float], runs: int, mbps: float = 100.0,
             kinds=("lia", "lia_vm", "uncoupled"), cpu: int = 0) -> dict:
    """Fig. 7a with a real guest as the sender VM (experiments.vmguest):
    its vCPU runs on host CPU ``cpu`` for a slice and waits three while a
    CPU hog has it (vmguest.cpu_share; alone there for the row without
    scheduling); two
    paths of ``mbps`` and 0.5 ms RTT, ungated delay lines. Everything else
    of the run is kept off ``cpu``. Each run's goodput at the receiver and
    the guest's BPF counters (off-periods LIA-VM detected)."""
    from experiments import vmguest
    if (why := vmguest.missing()) is not None:
        raise RuntimeError(why)
    mine = os.sched_getaffinity(0)
    if not mine - {cpu}:
        raise RuntimeError(f"the run needs a CPU besides {cpu} for everything but the guest's vCPU")
    os.sched_setaffinity(0, mine - {cpu})
    rows = []
    try:
        for sl in [None, *slices]:
            row: dict = {"slice_ms": sl}
            for kind in kinds:
                runs_ = [_guest_run(seconds, sl, kind, mbps, cpu) for _ in range(runs)]
                row[kind] = [r["mbps"] for r in runs_]
                row[f"{kind}_guest"] = [r["guest"] for r in runs_]
                row[f"{kind}_vcpu_share"] = [r["vcpu_share"] for r in runs_]
            rows.append(row)
            print(json.dumps(row, default=str), file=sys.stderr, flush=True)
    finally:
        os.sched_setaffinity(0, mine)
    duty = 1 / 4
    base = rows[0]
    for r in rows[1:]:
        # what the VM's turns allow: its unscheduled goodput while on, nothing while off
        r["of_duty_bound"] = {k: sum(r[k]) / len(r[k]) / (duty * sum(base[k]) / len(base[k])) for k in kinds}
    return {"mbps": mbps, "seconds": seconds, "duty": duty, "rows": rows}


def _guest_run(seconds: float, slice_ms: float | None, kind: str, mbps: float, cpu: int, warm: float = 2.0) -> dict:
    from experiments import vmguest
    with testbed([Path(250, mbps), Path(250, mbps)], guest=True) as bed:
        sink = subprocess.Popen(["ip", "netns", "exec", bed.b, sys.executable, "-c", SINK, "1", str(warm)],
                                stdout=subprocess.PIPE, text=True)
        try:
            assert sink.stdout.readline().strip() == "ready"
            spec = {"nics": bed.sender_nics(), "subflows": bed.subflows(), "kind": kind, "dst": bed.dst,
                    "src": bed.addrs(0)[0], "seconds": seconds}
            with vmguest.Guest(bed.a, [(f"t{i}", guest_mac(i)) for i in range(len(bed.paths))], spec) as g:
                tids = g.vcpu_tids()
                # scheduled from the sender's start: a guest kernel booting on 1/4 of a CPU in 1.4 s gaps
                # panics in its boot-time timer check
                g.wait_marker("ready", 300)
                paths_before = bed.path_bytes()
                with vmguest.cpu_share(tids, cpu, slice_ms) as sched:
                    guest = g.wait(timeout=seconds + 900)
                path_bytes = [x - y for x, y in zip(bed.path_bytes(), paths_before)]
            if "error" in guest or "error" in guest.get("sender", {}):
                raise RuntimeError(f"the guest's job failed: {guest}")
            got = json.loads(sink.communicate(timeout=60)[0])["0"]
        finally:
            if sink.poll() is None:
                sink.kill()
                sink.wait(5)
    # the vCPU's share while the sender ran: samples up to its end, less the guest's power-off
    vcpu = vmguest.share(sched["usage"], until=sched["usage"][-1][0] - 0.6 if sched["usage"] else None)
    return {"mbps": got["bytes"] * 8 / 1e6 / max(got["measured_s"], 1e-9), "guest": guest, "vcpu_share": vcpu,
            "path_bytes": path_bytes}


FREE_TOS = (0x28, 0xfc)


def cubic(seconds: float, runs: int, slice_ms: float | None = None) -> dict:
    """The seed paper's Figs. 9-10: an MPTCP connection (LIA or LIA-VM) on
    two 100 Mb/s paths of 0.5 ms RTT and one CUBIC flow on the first path:
    the CUBIC flow's goodput next to each. ``slice_ms``: the sender VM
    descheduled (on a slice, off three; what reaches it held while off);
    the CUBIC flow is another VM's, on no schedule -- its frames (TOS
    0x28, reflected by the receiver) take an ungated delay line of their
    own into the same token bucket."""
    gate = vm_gate(slice_ms)
    out: dict = {"slice_ms": slice_ms}
    for kind in ("lia", "lia_vm", "uncoupled"):
        rows = []
        for _ in range(runs):
            with testbed([Path(250, 100, gate=gate, free_tos=FREE_TOS), Path(250, 100, gate=gate)]) as bed:
                select(bed.all_addrs(), kind)
                try:
                    f = run_flows(bed, seconds, mptcp=1, tcp=1, tcp_cc="cubic", tcp_tos=FREE_TOS[0])["flows"]
                finally:
                    select(bed.all_addrs(), "bgwc")
            rows.append({"mptcp_mbps": f[0]["mbps"], "cubic_mbps": f[1]["mbps"]})
        out[kind] = rows
    return out


def transfer(runs: int, size_mb: float = 61.0, slice_ms: float = 480.0) -> dict:
    """The seed paper's Fig. 8, scaled: the time to move ``size_mb`` MB
    (the paper: 610 MB) over two 100 Mb/s paths with the sender a
    descheduled VM (on a slice, off three), LIA vs LIA-VM."""
    gate = vm_gate(slice_ms)
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
        frozen: bool = False, confirm: int = 0, by_endpoint: bool = False) -> dict:
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


def weights(seconds: float, runs: int, weights_: list[float], slice_ms: float = 30.0, mbps: float = 100.0) -> dict:
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
                    **_goodputs(seconds, runs, vm_gate(slice_ms, 3 * slice_ms * 256 / w), mbps)})
    return {"slice_ms": slice_ms, "rows": out}


def _quantile(xs: list, q: float):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def gating(seconds: float, slices: list[float], mbps: float = 100.0) -> dict:
    """The seed paper's Figs. 4-6 through the BPF controls: for each slice
    (and none), LIA and LIA-VM traced on the two gated paths of
    :func:`vm`: the RTT samples the programs saw (median, 90th
    percentile), the sRTT they kept, the alpha they used, their windows
    (segments) and the goodput."""
    out = []
    for sl in [None, *slices]:
        gate = vm_gate(sl)
        row: dict = {"slice_ms": sl}
        for kind in ("lia", "lia_vm"):
            with testbed([Path(250, mbps, gate=gate), Path(250, mbps, gate=gate)]) as bed:
                select(bed.all_addrs(), kind)
                try:
                    with Tracer() as tr:
                        mb = run_flows(bed, seconds, mptcp=1)["flows"][0]["mbps"]
                finally:
                    select(bed.all_addrs(), "bgwc")
            recs = [r for r in tr.records if r.kind == MPTCP_CCS.index(kind)]
            samples = [r for r in recs if r.type == bpfring.REC_SAMPLE]
            incs = [r for r in recs if r.type == bpfring.REC_INCREASE and not r.flags & 1]   # congestion avoidance
            row[kind] = {
                "mbps": mb, "records": len(recs),
                "rtt_us": {"median": _quantile([r.rtt for r in samples], 0.5),
                           "p90": _quantile([r.rtt for r in samples], 0.9)},
                "srtt_us": {"median": _quantile([r.srtt8 / 8 for r in samples], 0.5),
                            "p90": _quantile([r.srtt8 / 8 for r in samples], 0.9)},
                "alpha": {"median": _quantile([r.alpha / 65536 for r in incs], 0.5),
                          "mean": sum(r.alpha for r in incs) / 65536 / len(incs) if incs else None},
                "cwnd": {"median": _quantile([r.cwnd_after for r in recs if r.type != bpfring.REC_SAMPLE], 0.5)},
                "off_periods": sum(1 for r in samples if r.flags & 2)}
        out.append(row)
    return {"rows": out}


ECHO = textwrap.dedent('''
    import socket, sys, threading
    srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", int(sys.argv[1]))); srv.listen(64); print("ready", flush=True)
    def serve(c):
        want = int.from_bytes(c.recv(4), "big"); got = 0
        while got < want:
            d = c.recv(65536)
            if not d: break
            got += len(d)
        c.sendall(b"k"); c.close()
    while True:
        c, _ = srv.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
''')
SHORT = textwrap.dedent('''
    import socket, sys, time, json
    dst, port, src, size, every, secs = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), \
        float(sys.argv[5]), float(sys.argv[6])
    out = []; t_end = time.time() + secs
    while time.time() < t_end:
        s = socket.socket(); s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"reno")
        s.bind((src, 0)); t0 = time.perf_counter(); s.connect((dst, port)); t1 = time.perf_counter()
        s.sendall(size.to_bytes(4, "big") + b"x" * size); s.recv(1); t2 = time.perf_counter(); s.close()
        out.append([t1 - t0, t2 - t0])
        time.sleep(max(0.0, every - (t2 - t0)))
    print(json.dumps(out), flush=True)
''')


def short_rtt(seconds: float, runs: int, kinds=("lia", "mptcp_d", "uncoupled"), size: int = 10_000) -> dict:
    """Short flows next to a long MPTCP connection (seed paper 002's short-
    flow RTT): one bottleneck (50 Mb/s, 5 ms base RTT, a FIFO of 2
    bandwidth-delay products), the connection with 4 subflows through it,
    and a short TCP flow (``size`` bytes and a 1-byte answer) every 100 ms
    through the same queue: its handshake time (one RTT) and completion
    time, after a 2 s warm-up; the agent's ESE closer runs (MPTCP-D)."""
    bdp = 50e6 / 8 * 2 * 2500e-6
    out: dict = {"size": size}
    for kind in kinds:
        rows = []
        for _ in range(runs):
            with testbed([Path(2500, 50, addrs=4, queue_bytes=int(2 * bdp))]) as bed:
                select(bed.all_addrs(), kind)
                echo = subprocess.Popen(["ip", "netns", "exec", bed.b, sys.executable, "-c", ECHO, str(PORT + 1)],
                                        stdout=subprocess.PIPE, text=True)
                try:
                    assert echo.stdout.readline().strip() == "ready"
                    with closer(bed) as closed:
                        shorts = subprocess.Popen(["ip", "netns", "exec", bed.a, "sh", "-c",
                                                f"sleep 2; exec {sys.executable} -c \"$0\" \"$@\"", SHORT,
                                                bed.dst, str(PORT + 1), bed.addrs(0)[0], str(size), "0.1",
                                                str(seconds - 3)], stdout=subprocess.PIPE, text=True)
                        res = run_flows(bed, seconds, mptcp=1, warm=2.0)
                        times = json.loads(shorts.communicate(timeout=seconds + 30)[0])
                finally:
                    echo.kill()
                    echo.wait(5)
                    select(bed.all_addrs(), "bgwc")
            rows.append({"mbps": res["flows"][0]["mbps"], "closed": len(closed), "flows": len(times),
                         "handshake_ms": {"median": 1e3 * _quantile([t[0] for t in times], 0.5),
                                          "p90": 1e3 * _quantile([t[0] for t in times], 0.9)},
                         "fct_ms": {"median": 1e3 * _quantile([t[1] for t in times], 0.5),
                                    "p90": 1e3 * _quantile([t[1] for t in times], 0.9)}})
        out[kind] = rows
    return out


def plot(cmd: str, out, path: str) -> None:
    """One figure per command (PNG)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.6))
    mean = lambda v: sum(v) / len(v)    # noqa: E731
    if cmd in ("vm", "vm-guest"):
        rows = out["rows"]
        xs = ["none" if r["slice_ms"] is None else f"{r['slice_ms']:g}" for r in rows]
        for k, kind in enumerate(("lia", "lia_vm", "uncoupled")):
            ax.bar([i + 0.27 * (k - 1) for i in range(len(rows))], [mean(r[kind]) for r in rows], 0.27, label=kind)
        if cmd == "vm-guest" and rows[0]["slice_ms"] is None:
            bound = out["duty"] * mean(rows[0]["lia"])
            ax.hlines([bound] * (len(rows) - 1), [i - 0.45 for i in range(1, len(rows))],
                      [i + 0.45 for i in range(1, len(rows))], colors="k", linestyles="dashed",
                      label="duty x unscheduled LIA")
        ax.set_xticks(range(len(rows)), xs)
        ax.set_xlabel("VM slice (ms; off 3 slices)")
        ax.set_ylabel("goodput (Mb/s)")
    elif cmd == "weights":
        rows = out["rows"]
        for k, kind in enumerate(("lia", "lia_vm", "uncoupled")):
            ax.bar([i + 0.27 * (k - 1) for i in range(len(rows))], [mean(r[kind]) for r in rows], 0.27, label=kind)
        ax.set_xticks(range(len(rows)), [f"{r['weight']:g}" for r in rows])
        ax.set_xlabel(f"sender VM's weight (3 others at 256; slice {out['slice_ms']:g} ms)")
        ax.set_ylabel("goodput (Mb/s)")
    elif cmd == "gating":
        rows = out["rows"]
        xs = ["none" if r["slice_ms"] is None else f"{r['slice_ms']:g}" for r in rows]
        ax2 = ax.twinx()
        for kind, style in (("lia", "o-"), ("lia_vm", "s--")):
            ax.plot(xs, [r[kind]["srtt_us"]["p90"] / 1e3 for r in rows], style, label=f"{kind} sRTT p90 (ms)")
            ax2.plot(xs, [r[kind]["alpha"]["median"] for r in rows], style, color="grey", label=f"{kind} alpha")
        ax.set_yscale("log")
        ax.set_xlabel("VM slice (ms; off 3 slices)")
        ax.set_ylabel("sRTT the control kept, 90th pct (ms)")
        ax2.set_ylabel("median alpha (grey)")
    elif cmd == "short-rtt":
        kinds = [k for k in ("lia", "mptcp_d", "uncoupled") if k in out]
        ax.bar([i - 0.2 for i in range(len(kinds))], [mean([r["handshake_ms"]["median"] for r in out[k]])
                                                      for k in kinds], 0.4, label="handshake (median)")
        ax.bar([i + 0.2 for i in range(len(kinds))], [mean([r["fct_ms"]["median"] for r in out[k]])
                                                      for k in kinds], 0.4, label=f"{out['size']} B flow (median)")
        ax.set_xticks(range(len(kinds)), kinds)
        ax.set_ylabel("ms")
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
        keys = [k for k in out if "/" in k]
        ax.barh(range(len(keys)), [mean(out[k]["mbps"]) for k in keys])
        for i, k in enumerate(keys):
            hosts = out[k].get("cpu_s_per_gb", {}).get("hosts")
            if hosts:
                ax.text(1, i, f"hosts {mean(hosts):.1f} CPU s/GB", va="center", fontsize=7, color="white")
        ax.set_yticks(range(len(keys)), keys, fontsize=7)
        ax.set_xlabel("goodput (Mb/s); the energy proxy written on each bar")
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
    "weights": "LIA vs LIA-VM vs uncoupled as the sender VM's scheduler weight changes (seed paper Fig. 7b)",
    "gating": "RTT samples, sRTT, alpha, windows and goodput of LIA / LIA-VM per VM slice (Figs. 4-6, traced)",
    "short-rtt": "handshake and completion times of short flows next to LIA / MPTCP-D / uncoupled MPTCP",
    "vm-guest": "LIA vs LIA-VM with a real guest kernel as the sender VM, its vCPU round-robin with three "
                "CPU hogs at each slice (Fig. 7a; needs `python -m experiments.vmguest setup`)",
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
    by_endpoint: bool = False
    slice_ms: float = 0.0            # cubic: 0 = no VM scheduling
    size_mb: float = 61.0
    slice_transfer_ms: float = 480.0
    weights: tuple[float, ...] = (128.0, 256.0, 512.0, 1024.0)
    slice_weights_ms: float = 30.0
    size: int = 10_000
    mbps: float = 100.0              # vm-guest: each path's rate


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
    if cfg.kind == "vm-guest":
        return vm_guest(cfg.seconds, list(cfg.slices), cfg.runs, mbps=cfg.mbps)
    if cfg.kind == "cubic":
        return cubic(cfg.seconds, cfg.runs, cfg.slice_ms or None)
    if cfg.kind == "transfer":
        return transfer(cfg.runs, cfg.size_mb, cfg.slice_transfer_ms)
    if cfg.kind == "weights":
        return weights(cfg.seconds, cfg.runs, list(cfg.weights), cfg.slice_weights_ms)
    if cfg.kind == "gating":
        return gating(cfg.seconds, list(cfg.slices))
    if cfg.kind == "short-rtt":
        return short_rtt(cfg.seconds, cfg.runs, size=cfg.size)
    return [ese(cfg.runs, alpha=a, per_path=cfg.per_path, delay_us=cfg.delay_us, frozen=cfg.frozen,
                confirm=cfg.confirm, by_endpoint=cfg.by_endpoint) for a in cfg.alpha]


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
    c = sub.add_parser("vm-guest")
    c.add_argument("--seconds", type=float, default=20.0)
    c.add_argument("--slices", type=float, nargs="+", default=[30, 120, 480])
    c.add_argument("--runs", type=int, default=1)
    c.add_argument("--mbps", type=float, default=100.0)
    c = sub.add_parser("cubic")
    c.add_argument("--seconds", type=float, default=15.0)
    c.add_argument("--runs", type=int, default=2)
    c.add_argument("--slice-ms", type=float, default=None)
    c = sub.add_parser("transfer")
    c.add_argument("--runs", type=int, default=2)
    c.add_argument("--size-mb", type=float, default=61.0)
    c.add_argument("--slice-ms", type=float, default=480.0)
    c = sub.add_parser("weights")
    c.add_argument("--seconds", type=float, default=10.0)
    c.add_argument("--runs", type=int, default=1)
    c.add_argument("--weights", type=float, nargs="+", default=[128, 256, 512, 1024])
    c.add_argument("--slice-ms", type=float, default=30.0)
    c = sub.add_parser("gating")
    c.add_argument("--seconds", type=float, default=10.0)
    c.add_argument("--slices", type=float, nargs="+", default=[30, 120, 480])
    c = sub.add_parser("short-rtt")
    c.add_argument("--seconds", type=float, default=12.0)
    c.add_argument("--runs", type=int, default=2)
    c.add_argument("--size", type=int, default=10_000)
    c = sub.add_parser("ese")
    c.add_argument("--runs", type=int, default=10)
    c.add_argument("--alpha", type=float, nargs="+", default=[1.3])
    c.add_argument("--per-path", type=int, default=1)
    c.add_argument("--delay-us", type=float, default=2500)
    c.add_argument("--frozen", action="store_true", help="the paper's reference: the sample that set TRIG "
                   "(default: the reference subflow's latest sample)")
    c.add_argument("--confirm", type=int, default=0, help="consecutive matching samples before a closing "
                   "(0: the program's default)")
    c.add_argument("--by-endpoint", action="store_true", help="close by deleting the subflow's path-manager "
                   "endpoint (graceful, but address-wide) instead of destroying the socket")
    for name, c in sub.choices.items():
        c.add_argument("--plot", metavar="PNG", help="write the figure here")
    c = sub.add_parser("plot", help="the figure of a saved result: plot CMD RESULT.json PNG")
    c.add_argument("what", choices=tuple(k for k in KINDS if k != "check"))
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
    if args.cmd == "weights" and "slice_ms" in given:
        given["slice_weights_ms"] = given.pop("slice_ms")
    for k in ("slices", "alpha", "weights"):
        if k in given:
            given[k] = tuple(given[k])
    out = measure(Config(kind=args.cmd, **given))
    print(json.dumps(out, indent=1, default=str))
    if args.plot:
        plot(args.cmd, out, args.plot)


if __name__ == "__main__":
    main()
