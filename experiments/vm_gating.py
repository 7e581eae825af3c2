"""VM scheduling emulated by a gated delay line (issue #23 §1): the sender's
link is open for a slice and closed for about three (a VM sharing its CPU
with three others), with a trickle while closed. For each slice length a
TCP connection runs through it; its RTT samples (``ss -tin``, every 20 ms)
and goodput are recorded. The seed paper's Figs. 4-6 show what LIA
misreads: RTT samples inflated by the off-periods and throughput falling
as the slice grows. This checks the gating element reproduces that trend
before the coupled controllers are judged on it.

    python -m experiments.vm_gating [--slices 30 120 480] [--seconds 10] [--cc reno]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import threading
import time

from mininet_topos.delayline.testbed import sh, testbed
from mininet_topos.delayline import DelayLine

RTT_RE = re.compile(r"\brtt:([0-9.]+)/")


def rtt_samples(ns: str, dst: str, stop: threading.Event, out: list) -> None:
    while not stop.wait(0.02):
        text = sh("ip", "netns", "exec", ns, "ss", "-tinH", "dst", dst, check=False).stdout
        out += [float(x) for x in RTT_RE.findall(text)]


def one(slice_ms: float | None, seconds: float, cc: str, delay_us: float, mbps: float) -> dict:
    with testbed() as (a, m, b):
        for ns, dev in ((a, "a0"), (b, "b0")):
            sh("ip", "netns", "exec", ns, "sysctl", "-qw", f"net.ipv4.tcp_congestion_control={cc}")
            # the path's rate (the seed paper's 100 Mb/s links): a token bucket on each host's interface
            sh("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{mbps}mbit",
               "burst", "32kb", "latency", "20ms")
        opts = {} if slice_ms is None else {"on_ms": slice_ms, "off_ms": 3 * slice_ms, "off_gap_us": 5000}
        line = DelayLine("xa", "xb", delay_us, netns=m, **opts).start()
        server = subprocess.Popen(["ip", "netns", "exec", b, "iperf3", "-s", "-1", "-p", "5302"],
                                  stdout=subprocess.DEVNULL)
        time.sleep(0.5)
        samples: list[float] = []
        stop = threading.Event()
        th = threading.Thread(target=rtt_samples, args=(a, "10.77.0.2", stop, samples), daemon=True)
        th.start()
        res = sh("ip", "netns", "exec", a, "iperf3", "-c", "10.77.0.2", "-p", "5302", "-t", str(seconds), "-J",
                 check=False)
        stop.set()
        th.join(2)
        server.wait(10)
        line.stop()
    mbps = json.loads(res.stdout)["end"]["sum_received"]["bits_per_second"] / 1e6 if res.returncode == 0 else None
    samples.sort()
    return {"slice_ms": slice_ms, "goodput_mbps": mbps,
            "rtt_ms": {"median": samples[len(samples) // 2] if samples else None,
                       "p90": samples[int(len(samples) * 0.9)] if samples else None,
                       "max": samples[-1] if samples else None, "n": len(samples)}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--slices", type=float, nargs="+", default=[30, 120, 480])
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--cc", default="reno")
    ap.add_argument("--delay-us", type=float, default=250, help="one way: the seed paper's 0.5 ms RTT")
    ap.add_argument("--mbps", type=float, default=100)
    args = ap.parse_args()
    rows = [one(s, args.seconds, args.cc, args.delay_us, args.mbps) for s in [None, *args.slices]]
    print(json.dumps(rows, indent=1))
    for r in rows:
        what = "no scheduling" if r["slice_ms"] is None else f"slice {r['slice_ms']:g} ms, off {3 * r['slice_ms']:g} ms"
        print(f"{what}: goodput {r['goodput_mbps']:.1f} Mb/s; sRTT median {r['rtt_ms']['median']} ms, "
              f"p90 {r['rtt_ms']['p90']} ms, max {r['rtt_ms']['max']} ms")


if __name__ == "__main__":
    main()
