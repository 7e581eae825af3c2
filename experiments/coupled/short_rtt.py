"""coupled-short-rtt: handshake and completion times of short flows next to LIA / MPTCP-D / uncoupled MPTCP.

    bwfabric experiment coupled-short-rtt [key=value ...]      (the options: :class:`Config`)
    python -m experiments.coupled short-rtt [--key value ...]
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass

from experiments.coupled import report
from experiments.coupled.report import mean
from experiments.coupled.testbed import PORT, Path, testbed, select, run_flows, closer, quantile

KIND = 'short-rtt'
HELP = 'handshake and completion times of short flows next to LIA / MPTCP-D / uncoupled MPTCP'


@dataclass
class Config:
    """The options of coupled-short-rtt and their defaults (the one source: the
    registry and ``python -m experiments.coupled`` both read this)."""
    seconds: float = 12.0
    runs: int = 2
    size: int = 10_000


def measure(cfg: Config):
    return short_rtt(cfg.seconds, cfg.runs, size=cfg.size)


def run(cfg: Config, out_dir):
    """The registry's entry: result.json (and figure.png) in ``out_dir``."""
    return report.run(KIND, measure, draw, cfg, out_dir)


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


def short_rtt(seconds: float, runs: int, size: int, kinds=("lia", "mptcp_d", "uncoupled")) -> dict:
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
                         "handshake_ms": {"median": 1e3 * quantile([t[0] for t in times], 0.5),
                                          "p90": 1e3 * quantile([t[0] for t in times], 0.9)},
                         "fct_ms": {"median": 1e3 * quantile([t[1] for t in times], 0.5),
                                    "p90": 1e3 * quantile([t[1] for t in times], 0.9)}})
        out[kind] = rows
    return out


def draw(out: dict, ax) -> None:
    kinds = [k for k in ("lia", "mptcp_d", "uncoupled") if k in out]
    ax.bar([i - 0.2 for i in range(len(kinds))], [mean([r["handshake_ms"]["median"] for r in out[k]])
                                                  for k in kinds], 0.4, label="handshake (median)")
    ax.bar([i + 0.2 for i in range(len(kinds))], [mean([r["fct_ms"]["median"] for r in out[k]])
                                                  for k in kinds], 0.4, label=f"{out['size']} B flow (median)")
    ax.set_xticks(range(len(kinds)), kinds)
    ax.set_ylabel("ms")
