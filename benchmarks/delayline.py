"""The delay line on one core: UDP at 100 Mb/s each way (1500-byte
frames) through it, with a one-way delay; prints the rates carried, the
ping RTT against 2 x delay, and the hold error (when a frame left minus
when it was due).

    python -m benchmarks.delayline [--delay-us 2000] [--mbps 100] [--seconds 10] [--spin-us 60 0]

Each --spin-us setting is run in turn (default: the line's spinning margin
of 60 us, then none), so hold error and CPU cost are printed side by side.

Three namespaces of its own (A, B, and M in the middle running the delay
line), removed at the end.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time

from mininet_topos.delayline import DelayLine
from mininet_topos.delayline.testbed import ping_rtts, testbed


def udp_both_ways(a: str, b: str, mbps: float, seconds: float) -> dict:
    srv = [subprocess.Popen(["ip", "netns", "exec", ns, "iperf3", "-s", "-1", "-p", "5301", "-J"],
                            stdout=subprocess.PIPE, text=True) for ns in (a, b)]
    time.sleep(0.5)
    cl = [subprocess.Popen(["ip", "netns", "exec", src, "iperf3", "-c", dst, "-p", "5301", "-u", "-b", f"{mbps}M",
                            "-l", "1472", "-t", str(seconds), "-J"], stdout=subprocess.PIPE, text=True)
          for src, dst in ((a, "10.77.0.2"), (b, "10.77.0.1"))]
    out = {}
    for name, p in zip(("a_to_b", "b_to_a"), cl):
        res = json.loads(p.communicate(timeout=seconds + 30)[0])
        s = res["end"]["sum"]
        out[name] = {"mbps": s["bits_per_second"] / 1e6, "lost_percent": s.get("lost_percent")}
    for p in srv:
        p.wait(10)
    return out


def run(delay_us: float, mbps: float, seconds: float, spin_us: float | None = None) -> dict:
    with testbed() as (a, m, b):
        line = DelayLine("xa", "xb", delay_us, netns=m, spin_us=spin_us).start()
        time.sleep(0.3)
        rtts = ping_rtts(a, "10.77.0.2")
        rates = udp_both_ways(a, b, mbps, seconds)
        stats = line.stop()
    return {"delay_us": delay_us, "spin_us": spin_us, "ping_rtt_ms": {"median": sorted(rtts)[len(rtts) // 2] if rtts else None,
                                                  "expected": 2 * delay_us / 1e3}, "udp": rates, "line": stats}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--delay-us", type=float, default=2000)
    ap.add_argument("--mbps", type=float, default=100)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--spin-us", type=float, nargs="+", default=[60, 0])
    args = ap.parse_args()
    outs = [run(args.delay_us, args.mbps, args.seconds, spin) for spin in args.spin_us]
    print(json.dumps(outs, indent=1))
    for out in outs:
        print(f"-- spin {out['spin_us']:g} us")
        for d in ("a_to_b", "b_to_a"):
            e = out["line"][d]["hold_error_us"]
            print(f"{d}: {out['udp'][d]['mbps']:.1f} Mb/s carried of {args.mbps:g} offered "
                  f"({out['udp'][d]['lost_percent']} % lost); hold error median {e['median']} us, p99 {e['p99']} us")
        print(f"ping RTT median {out['ping_rtt_ms']['median']} ms, 2 x delay = {out['ping_rtt_ms']['expected']} ms; "
              f"the delay line used {out['line']['cpu_cores']} cores (both directions, over the whole run)")

if __name__ == "__main__":
    main()
