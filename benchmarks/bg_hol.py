"""A VM's BG at its host (issue #32 §2-3): one FIFO at the guarantee against
bwf_mark, the marker that demotes (TCP) or drops (UDP) what exceeds it, and
best effort (no bwfabric), side by side in one run. Run as root:

    .venv/bin/python -m benchmarks.bg_hol [--guarantee 0.5] [--udp 9] [--nic 10] [--reps 5]

Two namespaces joined by a veth (GSO off: the emulator's hosts send
MTU-sized packets); the sender's interface gets the agent's whole plan
(``hostagent.plan.host_plan``) with ``demote_bg`` off ("fifo": BG's HTB
class at rate = ceil = the guarantee, one byte FIFO of >= 256 KiB) or on
("marker"); "best effort" has only the NIC's rate (HTB over the same
leaf FIFO) and Reno. Printed per scheme:

1. the VM's own UDP at ``--udp`` Mb/s (what the main job's batch tenant
   sends): a TCP connection's handshake and 20 KB, three times (15 s
   each at most);
2. the host queueing delay of a short flow's packets while the same VM's
   three long TCP flows are backlogged (8 short flows of 10 writes of 1448 B): the kernel's own timestamps of each
   write entering the qdisc (SCM_TSTAMP_SCHED) and leaving it for the
   device (SCM_TSTAMP_SND), p50 / p99 / max over every write;
3. on an idle link, the completion time of 10 KB, 100 KB and 1 MB flows
   (MPTCP under bwfabric, both ends with the agent's plan; TCP under best
   effort), median of ``--reps``, and its ratio to best effort's.

Figures move with machine load: compare the columns of one run, and repeat.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
A, B = "10.61.0.1", "10.61.0.2"
SIZES = (10_000, 100_000, 1_000_000)

PEER = textwrap.dedent('''
    import json, socket, sys, threading
    from hostagent import plan as P
    from hostagent.executor import Executor
    mode, dev, nic, g = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    proto = 262 if mode != "none" else 0
    import subprocess
    if mode != "none":
        Executor().apply(P.host_plan(P.HostConfig.from_dict({"host": "b", "interface": dev, "address": "%(B)s",
                         "nic_mbps": nic, "guarantee_mbps": g, "wc_subflows": 1, "demote_bg": mode == "marker"})))
    else:
        subprocess.run(["sysctl", "-qw", "net.ipv4.tcp_congestion_control=reno"], check=True)
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("%(B)s", 7001))
    threading.Thread(target=lambda: [u.recv(65536) for _ in iter(int, 1)], daemon=True).start()

    def serve(port, proto):
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM, proto)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("%(B)s", port)); srv.listen(64)
        while True:
            c, _ = srv.accept()
            threading.Thread(target=handle, args=(c,), daemon=True).start()

    def handle(c):
        # the first 8 bytes: how many to read before answering (0: a sink)
        want = int.from_bytes(c.recv(8, socket.MSG_WAITALL), "big")
        n = 0
        while want == 0 or n < want:
            b = c.recv(1 << 16)
            if not b:
                break
            n += len(b)
        if want:
            c.sendall(b"k")
        c.close()
    threading.Thread(target=serve, args=(7000, 0), daemon=True).start()      # plain TCP: BG only
    threading.Thread(target=serve, args=(7002, proto), daemon=True).start()  # the VM's own kind
    print("ready", flush=True)
    threading.Event().wait()
''' % {"B": B})

VM = textwrap.dedent('''
    import json, socket, struct, subprocess, sys, threading, time
    from hostagent import plan as P
    from hostagent.executor import Executor
    mode, dev, nic, g, udp_mbps, reps = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), \\
        float(sys.argv[5]), int(sys.argv[6])
    proto = 262 if mode != "none" else 0
    if mode != "none":
        Executor().apply(P.host_plan(P.HostConfig.from_dict({"host": "a", "interface": dev, "address": "%(A)s",
                         "nic_mbps": nic, "guarantee_mbps": g, "wc_subflows": 1, "demote_bg": mode == "marker"})))
    else:     # the same NIC: HTB at its rate over the agent's WC leaf FIFO, nothing else
        for c in (["qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "1"],
                  ["class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", f"{nic}mbit"],
                  ["qdisc", "add", "dev", dev, "parent", "1:1", "bfifo", "limit", str(P.LEAF_QUEUE_MIN)]):
            subprocess.run(["tc", *c], check=True)
    if mode == "none":      # what the agent's BG uses; this machine's default may be another
        subprocess.run(["sysctl", "-qw", "net.ipv4.tcp_congestion_control=reno"], check=True)
    out = {}

    def transfer(n, port=7000, proto=0, timeout=30):
        t0 = time.monotonic()
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, proto)
        s.settimeout(timeout)
        try:
            s.connect(("%(B)s", port))
            t1 = time.monotonic()
            s.sendall(n.to_bytes(8, "big") + b"x" * n)
            ok = s.recv(1) == b"k"
            return (t1 - t0, time.monotonic() - t0) if ok else (None, None)
        except OSError:
            return None, None
        finally:
            s.close()
    stop = threading.Event()

    from benchmarks.bg_hol import udp_flood
    th = threading.Thread(target=udp_flood, args=(("%(B)s", 7001), udp_mbps, stop)); th.start()
    time.sleep(3)
    out["flooded"] = [transfer(20000, timeout=15) for _ in range(3)]
    stop.set(); th.join()

    # 2. host queueing of a short flow's writes beside three long flows of the same VM
    bulks = []

    def bulk():
        s = socket.socket()
        bulks.append(s)
        try:
            s.connect(("%(B)s", 7000)); s.sendall(bytes(8))
            while not stop.is_set():
                s.send(b"b" * 65536)
        except OSError:
            pass
    stop = threading.Event()
    longs = [threading.Thread(target=bulk, daemon=True) for _ in range(3)]
    [t.start() for t in longs]
    time.sleep(3)
    SO_TIMESTAMPING, FLAGS = 37, (1 << 8) | (1 << 1) | (1 << 4) | (1 << 7) | (1 << 11)
    delays = []
    for _ in range(8):
        s = socket.socket(); s.settimeout(10)
        try:
            s.connect(("%(B)s", 7000))
            s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, FLAGS)   # OPT_ID needs a connected TCP socket
            s.sendall((10 * 1448).to_bytes(8, "big"))
            for _ in range(10):
                s.sendall(b"s" * 1448)
            s.recv(1)
            s.setblocking(False)      # the error queue read must not wait for data
            sched, snd = {}, {}
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:
                try:
                    _, anc, _, _ = s.recvmsg(1, 1024, socket.MSG_ERRQUEUE | socket.MSG_DONTWAIT)
                except BlockingIOError:
                    if len(snd) >= 11 and len(sched) >= 11:
                        break
                    time.sleep(0.01); continue
                ts = info = key = None
                for level, typ, data in anc:
                    if level == socket.SOL_SOCKET and typ == SO_TIMESTAMPING:
                        sec, nsec = struct.unpack_from("qq", data, 0); ts = sec + nsec / 1e9
                    elif level == socket.IPPROTO_IP:
                        # sock_extended_err: errno, origin, type, code, pad, info, data
                        _, origin, _, _, _, info, key = struct.unpack_from("IBBBBII", data, 0)
                if ts is not None and info is not None:
                    (sched if info == 1 else snd if info == 0 else {})[key] = ts
            delays += [snd[k] - sched[k] for k in snd if k in sched and k > 0]
        except OSError:
            pass
        finally:
            s.close()
    stop.set()
    for s in bulks:             # a send blocked on a full buffer returns at once
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    [t.join(10) for t in longs]
    [s.close() for s in bulks]
    out["host_delay_s"] = delays

    # 3. idle: flow completion times by size
    time.sleep(2)
    out["fct"] = {str(n): [transfer(n, 7002, proto)[1] for _ in range(reps)] for n in %(SIZES)r}
    print(json.dumps(out))
''' % {"A": A, "B": B, "SIZES": SIZES})


def udp_flood(dst: tuple[str, int], mbps: float, stop, size: int = 1400) -> None:
    """Send ``size``-byte UDP datagrams to ``dst`` at ``mbps`` until ``stop``
    (a threading.Event) is set: a VM's own UDP, paced by the clock."""
    import socket
    import time
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    gap, nxt = size * 8 / (mbps * 1e6), time.monotonic()
    while not stop.is_set():
        try:
            u.sendto(b"u" * size, dst)
        except OSError:
            pass
        nxt += gap
        time.sleep(max(0.0, nxt - time.monotonic()))


def run(mode: str, guarantee: float, udp: float, nic: float, reps: int) -> dict:
    tag = uuid.uuid4().hex[:5]
    a, b = f"hola{tag}", f"holb{tag}"
    da, db = f"hv{tag}", f"hw{tag}"
    sh = lambda *c: subprocess.run(c, check=True, capture_output=True)  # noqa: E731
    try:
        for n in (a, b):
            sh("ip", "netns", "add", n)
            sh("ip", "-n", n, "link", "set", "lo", "up")
        sh("ip", "link", "add", da, "netns", a, "type", "veth", "peer", "name", db, "netns", b)
        sh("ip", "-n", a, "addr", "add", f"{A}/24", "dev", da)
        sh("ip", "-n", b, "addr", "add", f"{B}/24", "dev", db)
        for n, d in ((a, da), (b, db)):
            sh("ip", "-n", n, "link", "set", d, "up")
            sh("ip", "netns", "exec", n, "ethtool", "-K", d, "tso", "off", "gso", "off")
        rx = subprocess.Popen(["ip", "netns", "exec", b, sys.executable, "-c", PEER, mode, db, str(nic),
                               str(guarantee)], stdout=subprocess.PIPE, text=True, cwd=REPO)
        try:
            assert rx.stdout.readline().strip() == "ready"
            res = subprocess.run(["ip", "netns", "exec", a, sys.executable, "-c", VM, mode, da, str(nic),
                                  str(guarantee), str(udp), str(reps)], capture_output=True, text=True,
                                 timeout=900, cwd=REPO)
            if res.returncode != 0:
                raise RuntimeError(res.stderr)
            return json.loads(res.stdout)
        finally:
            rx.kill()
            rx.wait()
    finally:
        for n in (a, b):
            subprocess.run(["ip", "netns", "del", n], check=False)


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--guarantee", type=float, default=0.5)
    ap.add_argument("--udp", type=float, default=9.0)
    ap.add_argument("--nic", type=float, default=10.0)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    from hostagent import cc
    loaded = cc.cc_registered()
    cc.load()
    try:
        res = {}
        for m in ("none", "marker", "fifo"):
            print(f"running {m} ...", file=sys.stderr, flush=True)
            res[m] = run(m, args.guarantee, args.udp, args.nic, args.reps)
    finally:
        if not loaded:
            cc.unload()
    names = {"none": "best effort", "fifo": "BG FIFO", "marker": "bwf_mark"}
    print(f"VM guarantee {args.guarantee} Mb/s, NIC {args.nic} Mb/s")
    print(f"1. its own UDP at {args.udp:g} Mb/s; a TCP connection's handshake / 20 KB done:")
    for m, r in res.items():
        print(f"  {names[m]:12s} " + ", ".join("never" if c is None else f"{c * 1e3:.0f} / {t * 1e3:.0f} ms"
                                                for c, t in r["flooded"]))
    print("2. host queueing of a short flow's writes beside 3 long flows of the VM: p50 / p99 / max (ms, n)")
    for m, r in res.items():
        d = [x * 1e3 for x in r["host_delay_s"]]
        print(f"  {names[m]:12s} {_pct(d, .5):.1f} / {_pct(d, .99):.1f} / {max(d, default=float('nan')):.1f} "
              f"({len(d)})")
    print("3. idle link, flow completion, median of reps (ms; x best effort):")
    for m, r in res.items():
        cells = []
        for n in map(str, SIZES):
            t = [x for x in r["fct"][n] if x is not None]
            base = [x for x in res["none"]["fct"][n] if x is not None]
            med = statistics.median(t) * 1e3 if t else float("nan")
            ratio = med / (statistics.median(base) * 1e3) if t and base else float("nan")
            cells.append(f"{int(n) // 1000} KB {med:.0f} ({ratio:.2f}x, {len(t)}/{len(r['fct'][n])} done)")
        print(f"  {names[m]:12s} " + "; ".join(cells))
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
