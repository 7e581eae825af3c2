"""TCP's own shares at one drop-tail port, with no routing choice at all
(issue #32: the yardstick for "a long flow gets >= 0.8 of its max-min
share"), and what LESSOR's receiver fairness makes of them. Run as root:

    .venv/bin/python -m benchmarks.port_shares [--flows 3] [--cross 2] [--seconds 40] [--reps 5]
        [--routings single_path,lessor]

One emulated switch (Open vSwitch, the evaluation fabrics' port: 10 Mb/s,
a 225 KB FIFO, jumbo frames, ACKs first) and, in each rep one after the
other, the controller's single-path routes (TCP alone) and LESSOR (its
receiver fairness polices the flows into a saturated host at that host's
max-min share: apps/lessor/fairness.py). ``--flows`` long TCP flows (iperf3, the hosts' default cubic) from
h1.. into r1; ``--cross`` more flows into h1, so that one sender's own
downlink is saturated too (as the senders of the k = 4 fabric's starved
flows were). Printed per rep: each flow's mean rate after its first 5 s
over the equal share of the port it meets (10 / flows into it), and the
lowest. Figures move with machine load and with TCP's own dynamics: run
the reps, read the spread.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LINK_MBPS = 10.0
SKIP_S = 5          # the first seconds of every flow (slow start) are left out


def run_once(flows: int, cross: int, seconds: int, work: Path, routing: str = "single_path") -> dict[str, float]:
    """One rep: {"hX>dst": mean Mb/s}."""
    from experiments import configs
    from experiments.controller_proc import ControllerProcess
    from experiments.fabric import Fabric
    from mininet_topos import builders

    port = configs.free_port()
    topo = builders.star(flows + cross, link_mbps=LINK_MBPS)
    topo.save(work / "topo.json")
    fab = Fabric(topo, of_port=port, ack_first=True).start()
    ctl = None
    servers, clients = [], []
    try:
        ctl = ControllerProcess(configs.write(work / "bwfabric.yaml", work / "topo.json", routing, port),
                                work / "ctl.log").start()
        fab.wait_routes(60)
        pairs = [(f"h{i + 1}", "r1") for i in range(flows)] + [(f"h{flows + i + 1}", "h1") for i in range(cross)]
        for n, (_, dst) in enumerate(pairs):
            servers.append(fab.host(dst).popen(["iperf3", "-s", "-1", "-p", str(5201 + n)],
                                               stdout=subprocess.DEVNULL))
        time.sleep(1)       # listening before the clients connect
        for n, (src, dst) in enumerate(pairs):
            clients.append(fab.host(src).popen(["iperf3", "-c", fab.ip(dst), "-p", str(5201 + n), "-t",
                                                str(seconds), "-J"], stdout=subprocess.PIPE, text=True))
        out = {}
        for (src, dst), proc in zip(pairs, clients):
            text, _ = proc.communicate(timeout=seconds + 60)
            iv = [x["sum"]["bits_per_second"] / 1e6 for x in json.loads(text)["intervals"]][SKIP_S:]
            out[f"{src}>{dst}"] = sum(iv) / len(iv)
        return out
    finally:
        for p in servers + clients:
            p.kill()
        if ctl is not None:
            ctl.stop()
        fab.stop()


def shares(rates: dict[str, float]) -> dict[str, float]:
    """Each flow's rate over the equal share of its destination's port."""
    into: dict[str, int] = {}
    for name in rates:
        dst = name.split(">")[1]
        into[dst] = into.get(dst, 0) + 1
    return {name: r / (LINK_MBPS / into[name.split(">")[1]]) for name, r in rates.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flows", type=int, default=3)
    ap.add_argument("--cross", type=int, default=2)
    ap.add_argument("--seconds", type=int, default=40)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--routings", default="single_path,lessor",
                    help="controller routing apps, each run in every rep (comma-separated)")
    args = ap.parse_args(argv)
    routings = [r for r in args.routings.split(",") if r]
    if args.flows < 2 or args.cross < 0 or args.seconds <= SKIP_S + 1 or args.reps < 1 or not routings \
            or not set(routings) <= {"single_path", "ecmp", "lessor", "hedera"}:
        ap.error("need --flows >= 2, --cross >= 0, --seconds > 6, --reps >= 1, --routings among "
                 "single_path, ecmp, lessor, hedera")
    reps: dict[str, list] = {r: [] for r in routings}
    for rep in range(args.reps):
        for routing in routings:
            print(f"rep {rep + 1}, {routing} ...", file=sys.stderr, flush=True)
            with tempfile.TemporaryDirectory(prefix="bwf-port-shares-") as tmp:
                reps[routing].append(run_once(args.flows, args.cross, args.seconds, Path(tmp), routing))
    print(f"{args.flows} TCP flows into r1 and {args.cross} into h1, {args.seconds} s, one {LINK_MBPS:g} Mb/s "
          "port each: rate / equal share")
    for routing, runs in reps.items():
        print(routing)
        for n, rates in enumerate(runs, 1):
            sh = shares(rates)
            print(f"  rep {n}: " + "  ".join(f"{k} {v:.2f}" for k, v in sh.items())
                  + f"   lowest {min(sh.values()):.2f}   both ports {sum(rates.values()):.2f} Mb/s")
        lows = [min(shares(rates).values()) for rates in runs]
        print(f"  lowest share per rep: {min(lows):.2f} .. {max(lows):.2f}")
    print(json.dumps(reps))       # Mb/s per flow
    return 0


if __name__ == "__main__":
    sys.exit(main())
