"""The host agent under random configuration sequences with injected
failures (issue #20): after every request, the kernel -- read back -- must
equal what the agent reports (its configuration in force, or nothing, or
"degraded" with the differences listed).

Runs inside a network namespace that has an interface ``ag0`` with the
address 10.9.0.1 (the integration test and ``--netns`` make one), with real
tc, nftables, MPTCP endpoints, sysctls and BPF hash maps (pinned in a bpffs
of its own, so the WC congestion control need not be loaded).

    python -m benchmarks.agent_faults --sequences 1000 --netns
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from hostagent import plan as P
from hostagent.agent import Agent
from hostagent.executor import ExecError, Executor

DESTS = [f"10.9.0.{i}" for i in range(2, 12)]


class InjectedFault(RuntimeError):
    pass


class Faults:
    """Raises at the n-th kernel change from now (n drawn per request), and
    optionally again during the rollback."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.countdown: int | None = None
        self.again = False
        self.fired = 0

    def arm(self, p_fail: float, p_double: float) -> None:
        self.countdown = self.rng.randint(0, 12) if self.rng.random() < p_fail else None
        self.again = self.countdown is not None and self.rng.random() < p_double

    def __call__(self, name: str) -> None:
        if self.countdown is None:
            return
        if self.countdown == 0:
            self.fired += 1
            # fire once more, a few changes into the rollback, when asked to
            self.countdown = self.rng.randint(0, 4) if self.again else None
            self.again = False
            raise InjectedFault(f"injected failure before: {name}")
        self.countdown -= 1


def random_config(rng: random.Random, host: str = "ns") -> dict:
    cfg = dict(host=host, interface="ag0", address="10.9.0.1", nic_mbps=100,
               guarantee_mbps=rng.choice([0, 5, 10, 20, 35]), wc_subflows=rng.randint(0, 3),
               ecn=rng.random() < 0.5, stale_loss_cnt=rng.randint(1, 8),
               rto_min_ms=rng.choice([None, 10, 50]), join_port_base=10100)
    if rng.random() < 0.6:
        cfg["pair_limits_mbps"] = {d: rng.choice([1, 2.5, 5, 20]) for d in rng.sample(DESTS, rng.randint(1, 6))}
    if rng.random() < 0.1:    # a bad one now and then: refused before anything changes
        cfg["guarantee_mbps"] = rng.choice([float("nan"), 1e12, -1])
    return cfg


def make_bpf_maps(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "bpf", "bpf", str(root)], check=True)
    for name in (P.BPF_MAP, P.BPF_PACE_MAP):
        subprocess.run(["bpftool", "map", "create", str(root / name), "type", "hash", "key", "4", "value", "8",
                        "entries", "64", "name", name], check=True)
    # the BG marker, its buckets and their state (the real program: the plan attaches it)
    from hostagent import cc
    subprocess.run(["bpftool", "prog", "load", str(cc.build()["bwf_mark"]), str(root / P.MARK_PROG), "type",
                    "classifier", "pinmaps", str(root)], check=True)


def drop_bpf_maps(root: Path) -> None:
    """Unmount the bpffs (its maps go with it) and remove the mount point."""
    subprocess.run(["umount", str(root)], check=False, capture_output=True)
    try:
        root.rmdir()
    except OSError:
        pass


def check(agent: Agent) -> str | None:
    """None if the kernel is what the agent reports, else why not."""
    st = agent.status()
    if st["degraded"] is not None:
        # a degraded agent promises nothing but must say so and keep no config
        return None if st["config"] is None and not st["in_force"] else "degraded but claims a config"
    if not st["in_force"]:
        return f"reported {'a config' if st['config'] else 'nothing'}, kernel differs: {st['differences'][:3]}"
    return None


def run(sequences: int, seed: int, length: int = 5, p_fail: float = 0.5, p_double: float = 0.1,
        out=print) -> dict:
    rng = random.Random(seed)
    faults = Faults(rng)
    tally = {"sequences": 0, "requests": 0, "applied": 0, "refused": 0, "rolled_back": 0, "degraded": 0,
             "faults_fired": 0, "mismatches": 0, "seconds": 0.0}
    t0 = time.monotonic()
    bpffs = Path(tempfile.gettempdir()) / f"bwft-bpf-{uuid.uuid4().hex[:6]}"
    make_bpf_maps(bpffs)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for s in range(sequences):
                state = Path(tmp) / f"s{s}"
                ex = Executor(state_file=state / "executor.json", bpf_pin_dir=bpffs, fault=faults)
                agent = Agent("ns", secrets.token_bytes(32), state, executor=ex)
                for _ in range(length):
                    faults.arm(p_fail, p_double)
                    tally["requests"] += 1
                    try:
                        agent.put_in_force(P.HostConfig.from_dict(random_config(rng)), None)
                        tally["applied"] += 1
                    except P.PlanError:
                        tally["refused"] += 1
                    except ExecError as exc:
                        tally["degraded" if "degraded" in str(exc) else "rolled_back"] += 1
                    faults.countdown = None
                    why = check(agent)
                    if why:
                        tally["mismatches"] += 1
                        out(f"MISMATCH in sequence {s}: {why}")
                faults.countdown = None
                ex.teardown()
                left = ex.clean_differences()
                if left:
                    tally["mismatches"] += 1
                    out(f"MISMATCH after teardown of sequence {s}: {left}")
                tally["sequences"] += 1
    finally:
        drop_bpf_maps(bpffs)
    tally["faults_fired"] = faults.fired
    tally["seconds"] = round(time.monotonic() - t0, 1)
    return tally


def make_netns() -> str:
    """A fresh namespace (named bwft-<random>) with a veth pair ag0/ag1 up in
    it, ag0 at 10.9.0.1/24; the caller deletes it (``ip netns del``)."""
    ns = f"bwft-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "add", "ag0", "type", "veth", "peer", "name", "ag1"], check=True)
        subprocess.run(["ip", "-n", ns, "addr", "add", "10.9.0.1/24", "dev", "ag0"], check=True)
        for dev in ("ag0", "ag1"):
            subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=True)
    except subprocess.CalledProcessError:
        subprocess.run(["ip", "netns", "del", ns], check=False)
        raise
    return ns


def in_netns(argv: list[str]) -> int:
    """Re-run this module inside a fresh namespace with ag0 (10.9.0.1)."""
    ns = make_netns()
    try:
        return subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "benchmarks.agent_faults", *argv],
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}).returncode
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sequences", type=int, default=1000)
    ap.add_argument("--length", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--netns", action="store_true", help="make a namespace with ag0 and run there")
    args = ap.parse_args()
    if args.netns:
        return in_netns([a for a in sys.argv[1:] if a != "--netns"])
    tally = run(args.sequences, args.seed, args.length)
    print(json.dumps(tally))
    return 1 if tally["mismatches"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
