"""Head-of-line blocking in a VM's BG class (issue #32 §2-3), measured on
the agent's own tc plan. Run as root:

    .venv/bin/python -m benchmarks.bg_hol [--guarantee 0.5] [--udp 9] [--nic 10]

Two namespaces joined by a veth; the sender's interface gets the agent's
HTB plan (``hostagent.plan.tc_plan``): BG (ToS 0x00) at the guarantee in
one byte FIFO of at least 256 KiB, WC up to the NIC rate. The VM's own
UDP (BG, as bwfabric classifies it) is sent at ``--udp`` Mb/s, as the main
job's batch tenant does. Printed, without and with that UDP: a TCP
connection's handshake time and the time to move 20 KB over it (TCP's
first subflow is BG too), and the BG queue's depth in bytes and in
seconds at the guarantee.

What it shows (2026-11-26): with its own UDP filling the FIFO, a new
connection's SYN waits behind seconds of the VM's UDP or is dropped, so the
connection -- and with MPTCP its WC joins, which only follow an
established first subflow -- barely opens: why the main job's batch VMs
carried 0.00 Mb/s of TCP, BG and WC alike.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
import uuid

RECEIVER = textwrap.dedent('''
    import socket, sys
    srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("10.61.0.2", 7000)); srv.listen(64)
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("10.61.0.2", 7001))
    print("ready", flush=True)
    while True:
        c, _ = srv.accept()
        n = 0
        while n < 20000:
            b = c.recv(65536)
            if not b:
                break
            n += len(b)
        c.sendall(b"k")
        c.close()
''')

SENDER = textwrap.dedent('''
    import json, socket, subprocess, sys, threading, time
    from hostagent import plan as P
    from hostagent.executor import Executor
    g, udp_mbps, nic = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    cfg = P.HostConfig.from_dict({"host": "s", "interface": "hv0", "address": "10.61.0.1", "nic_mbps": nic,
                                  "guarantee_mbps": g, "wc_subflows": 1})
    Executor().apply(P.Plan(tuple(P.tc_plan(cfg))))
    subprocess.run(["ethtool", "-K", "hv0", "tso", "off", "gso", "off"], capture_output=True)

    def bg_backlog():
        out = subprocess.run(["tc", "-s", "-j", "qdisc", "show", "dev", "hv0"], capture_output=True, text=True).stdout
        return max((q.get("backlog", 0) for q in json.loads(out) if q.get("parent") == P.CLASS_BG), default=0)

    def transfer():
        t0 = time.monotonic()
        s = socket.socket()
        s.settimeout(30)
        try:
            s.connect(("10.61.0.2", 7000))
            t1 = time.monotonic()
            s.sendall(b"x" * 20000)
            s.recv(1)
            return t1 - t0, time.monotonic() - t0
        except OSError:
            return None, None
        finally:
            s.close()
    out = {"idle": [transfer() for _ in range(3)]}
    stop = threading.Event()

    def flood():
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        gap = 1400 * 8 / (udp_mbps * 1e6)
        nxt = time.monotonic()
        while not stop.is_set():
            try:
                u.sendto(b"u" * 1400, ("10.61.0.2", 7001))
            except OSError:
                pass
            nxt += gap
            time.sleep(max(0.0, nxt - time.monotonic()))
    th = threading.Thread(target=flood, daemon=True)
    th.start()
    time.sleep(3)
    out["backlog_bytes"] = bg_backlog()
    out["flooded"] = [transfer() for _ in range(3)]
    stop.set()
    print(json.dumps(out))
''')


def run(guarantee: float, udp: float, nic: float) -> dict:
    tag = uuid.uuid4().hex[:5]
    a, b = f"hola{tag}", f"holb{tag}"
    sh = lambda *c: subprocess.run(c, check=True, capture_output=True)  # noqa: E731
    try:
        for n in (a, b):
            sh("ip", "netns", "add", n)
            sh("ip", "-n", n, "link", "set", "lo", "up")
        sh("ip", "link", "add", "hv0", "netns", a, "type", "veth", "peer", "name", "hv1", "netns", b)
        sh("ip", "-n", a, "addr", "add", "10.61.0.1/24", "dev", "hv0")
        sh("ip", "-n", b, "addr", "add", "10.61.0.2/24", "dev", "hv1")
        for n, d in ((a, "hv0"), (b, "hv1")):
            sh("ip", "-n", n, "link", "set", d, "up")
        rx = subprocess.Popen(["ip", "netns", "exec", b, sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE,
                              text=True)
        try:
            assert rx.stdout.readline().strip() == "ready"
            res = subprocess.run(["ip", "netns", "exec", a, sys.executable, "-c", SENDER, str(guarantee), str(udp),
                                  str(nic)], capture_output=True, text=True, timeout=300)
            if res.returncode != 0:
                raise RuntimeError(res.stderr)
            return json.loads(res.stdout)
        finally:
            rx.kill()
            rx.wait()
    finally:
        for n in (a, b):
            subprocess.run(["ip", "netns", "del", n], check=False)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--guarantee", type=float, default=0.5)
    ap.add_argument("--udp", type=float, default=9.0)
    ap.add_argument("--nic", type=float, default=10.0)
    args = ap.parse_args(argv)
    r = run(args.guarantee, args.udp, args.nic)

    def fmt(pairs):
        return ", ".join("failed" if c is None else f"{c * 1000:.0f} / {t * 1000:.0f} ms" for c, t in pairs)
    print(f"BG class at {args.guarantee} Mb/s, NIC {args.nic} Mb/s; handshake / 20 KB done:")
    print(f"  no UDP:               {fmt(r['idle'])}")
    print(f"  VM's UDP at {args.udp:g} Mb/s: {fmt(r['flooded'])}; BG FIFO backlog {r['backlog_bytes']} B "
          f"= {r['backlog_bytes'] * 8 / (args.guarantee * 1e6):.1f} s at the guarantee")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
