"""coupled-throughput: goodput and CPU per byte of LIA, MPTCP-D, uncoupled (and TCP) on disjoint/shared paths.

    bwfabric experiment coupled-throughput [key=value ...]      (the options: :class:`Config`)
    python -m experiments.coupled throughput [--key value ...]
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass

from experiments.coupled import report
from experiments.coupled.report import mean
from experiments.coupled.testbed import Path, testbed, select, run_flows, machine_cpu_s, closer
from mininet_topos.delayline.testbed import sh

KIND = 'throughput'
HELP = 'goodput and CPU per byte of LIA, MPTCP-D, uncoupled (and TCP) on disjoint/shared paths'


@dataclass
class Config:
    """The options of coupled-throughput and their defaults (the one source: the
    registry and ``python -m experiments.coupled`` both read this)."""
    seconds: float = 10.0
    runs: int = 3


def measure(cfg: Config):
    return throughput(cfg.seconds, cfg.runs)


def run(cfg: Config, out_dir):
    """The registry's entry: result.json (and figure.png) in ``out_dir``."""
    return report.run(KIND, measure, draw, cfg, out_dir)


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


def draw(out: dict, ax) -> None:
    keys = [k for k in out if "/" in k]
    ax.barh(range(len(keys)), [mean(out[k]["mbps"]) for k in keys])
    for i, k in enumerate(keys):
        hosts = out[k].get("cpu_s_per_gb", {}).get("hosts")
        if hosts:
            ax.text(1, i, f"hosts {mean(hosts):.1f} CPU s/GB", va="center", fontsize=7, color="white")
    ax.set_yticks(range(len(keys)), keys, fontsize=7)
    ax.set_xlabel("goodput (Mb/s); the energy proxy written on each bar")
