"""The two-path testbed every coupled-* experiment runs on (the package's
docstring describes it): namespaces A and B, the paths' delay lines and
token buckets, policy routing per subflow address, the sender and sink
programs, the control selection (bwf_ccsel), the BPF trace reader, the
flows' runner and the CPU accounting (cgroups, /proc/stat)."""

from __future__ import annotations

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

from hostagent import bpfring, cc
from hostagent.plan import MPTCP_CCS
from mininet_topos.delayline import DelayLine, offloads_off
from mininet_topos.delayline.testbed import sh


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


def vm_gate(slice_ms: float | None, off_ms: float | None = None, direction: str = "ba") -> dict | None:
    """The delay line's gate for a descheduled sender VM: on a slice, off
    ``off_ms`` (three slices: three other VMs share its CPU), a trickle
    while off; None without scheduling."""
    if slice_ms is None:
        return None
    return {"on_ms": slice_ms, "off_ms": 3 * slice_ms if off_ms is None else off_ms, "off_gap_us": 5000,
            "gate": direction}


def goodputs(seconds: float, runs: int, gate: dict | None, mbps: float) -> dict:
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


def quantile(xs: list, q: float):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


FREE_TOS = (0x28, 0xfc)
