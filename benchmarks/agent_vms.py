"""One agent, many VMs (issue #32 §4): N VMs in network namespaces of their
own behind one server, each with P LRC peers, on the real kernel (tc, the
BG marker and its buckets, nftables, MPTCP endpoints, sysctls; BPF maps in
a bpffs of the benchmark's own). Times, side by side in one run:

- the full apply: every VM from nothing, one configuration message;
- the same configuration again (read back, nothing to change);
- a status read-back of every VM;
- LRC's first round per VM with its P pairs open (the whole plan: P pair
  classes and buckets);
- LRC's rates-only round per VM, every pair's limit moved (the fast path:
  P tc class changes and P bucket rewrites), and all VMs' rounds together
  against τ_v.

The pairs' conntrack entries are given to the round (the agent's conntrack
read is measured by ``benchmarks.conntrack_cost``). Needs root.

    python -m benchmarks.agent_vms [--vms 32] [--peers 32] [--rounds 10]
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks.agent_faults import drop_bpf_maps, make_bpf_maps
from hostagent import netns
from hostagent.agent import Agent
from hostagent.executor import Executor
from hostagent.lrc import Entry


def _ip(*cmd: str) -> None:
    subprocess.run(["ip", *cmd], check=True, capture_output=True)


def address(i: int) -> str:
    return f"10.66.{i // 200}.{i % 200 + 1}"


def peers_of(i: int, n_vms: int, n_peers: int) -> list[str]:
    """The other VMs first, then addresses elsewhere in the tenant."""
    out = [address(j) for j in range(n_vms) if j != i][:n_peers]
    k = 0
    while len(out) < n_peers:
        out.append(f"10.67.{k // 200}.{k % 200 + 1}")
        k += 1
    return out


def vm_config(i: int, ns: str, peers: list[str], tau_v_s: float) -> dict:
    return {"host": "srv", "vm_id": f"t/v{i}", "netns": ns, "nic": "srv0", "interface": "ag0",
            "address": address(i), "nic_mbps": 10_000, "guarantee_mbps": 100, "wc_subflows": 1,
            "lrc": {"mode": "combined", "wc": "ceiling", "weight": 1.0,
                    "peers": {p: {"weight": 1.0, "guarantee_mbps": 100} for p in peers},
                    "params": {"tau_v_s": tau_v_s, "alpha": 2.0}}}


def run(n_vms: int, n_peers: int, rounds: int, out=print) -> dict:
    tag = uuid.uuid4().hex[:5]
    server, names = f"bwfb{tag}s", [f"bwfb{tag}v{i}" for i in range(n_vms)]
    bpf = Path(tempfile.gettempdir()) / f"bwfb-bpf-{tag}"
    state = Path(tempfile.mkdtemp(prefix="bwfb-state-"))
    made: list[str] = []
    result: dict = {"vms": n_vms, "peers": n_peers}
    try:
        make_bpf_maps(bpf)
        for ns in [server, *names]:
            _ip("netns", "add", ns)
            made.append(ns)
        _ip("-n", server, "link", "add", "srv0", "type", "veth", "peer", "name", "srv1")
        for dev in ("srv0", "srv1"):
            _ip("-n", server, "link", "set", dev, "up")
        for i, ns in enumerate(names):
            _ip("-n", ns, "link", "add", "ag0", "type", "veth", "peer", "name", "ag1")
            _ip("-n", ns, "addr", "add", f"{address(i)}/16", "dev", "ag0")
            for dev in ("ag0", "ag1"):
                _ip("-n", ns, "link", "set", dev, "up")
        tau_v = 0.5
        peers = {i: peers_of(i, n_vms, n_peers) for i in range(n_vms)}
        cfg = {"vms": {f"t/v{i}": vm_config(i, ns, peers[i], tau_v) for i, ns in enumerate(names)}}
        agent = Agent("srv", secrets.token_bytes(32), state / "agent",
                      executor=Executor(state_file=state / "agent" / "executor.json", bpf_pin_dir=bpf))

        def push(version: int) -> float:
            t0 = time.perf_counter()
            with netns.entered(server), agent.lock:
                reply = agent._dispatch("config", {"generation": 1, "version": version, "config": cfg})
            assert reply["ok"], reply
            return time.perf_counter() - t0

        result["full_apply_s"] = push(1)
        result["again_s"] = push(2)
        t0 = time.perf_counter()
        with netns.entered(server):
            st = agent.status()
        result["status_s"] = time.perf_counter() - t0
        assert st["in_force"] and len(st["vms"]) == n_vms, st["differences"][:3]

        def entries(i: int) -> list[Entry]:
            return [Entry(address(i), p, 6, True, True, 432000 - 1) for p in peers[i]]

        first = []
        with netns.entered(server):
            for i in range(n_vms):
                t0 = time.perf_counter()
                did = agent.lrc_round(entries=entries(i), vm=f"t/v{i}")
                first.append(time.perf_counter() - t0)
                assert did == "pairs", did
        per_vm, per_round, dids = [], [], {}
        with netns.entered(server):
            for k in range(rounds):
                factor = 20.0 + 10.0 * (k % 2)          # every pair's term moves: every limit moves
                with agent.lock:
                    agent._dispatch("rates", {"generation": 1, "vms": {
                        f"t/v{i}": {p: [factor, 1.0, 100.0] for p in peers[i]} for i in range(n_vms)}})
                t_all = time.perf_counter()
                for i in range(n_vms):
                    t0 = time.perf_counter()
                    did = agent.lrc_round(entries=entries(i), vm=f"t/v{i}")
                    per_vm.append(time.perf_counter() - t0)
                    assert did in ("rates", "competition", "idle"), did
                    dids[did] = dids.get(did, 0) + 1
                per_round.append(time.perf_counter() - t_all)
            st = agent.status()
        assert st["in_force"], st["differences"][:3]
        repairs = sum(v.lrc_repairs for v in agent.vms.values())
        from hostagent.agent import _pair_class
        from hostagent.plan import BgBucket, TcClass, marker_plan, tc_plan
        one = agent.vm("t/v0")
        moved_classes = sum(isinstance(x, TcClass) and _pair_class(x.classid)
                            for x in tc_plan(one.config, one.lrc_slots or {}, one.lrc_in_force))
        moved_buckets = sum(isinstance(x, BgBucket) and x.dst is not None
                            for x in marker_plan(one.config, one.lrc_in_force))
        result.update({
            "lrc_first_round_ms": {"median": 1e3 * statistics.median(first), "max": 1e3 * max(first)},
            "lrc_rates_round_ms": {"median": 1e3 * statistics.median(per_vm),
                                   "p95": 1e3 * sorted(per_vm)[int(0.95 * (len(per_vm) - 1))],
                                   "max": 1e3 * max(per_vm)},
            "all_vms_round_s": {"median": statistics.median(per_round), "max": max(per_round), "tau_v_s": tau_v},
            "repairs": repairs, "rounds_did": dids, "per_round": {"classes": moved_classes,
                                                                  "buckets": moved_buckets}})
        with netns.entered(server):
            agent.shutdown()
        return result
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        drop_bpf_maps(bpf)
        subprocess.run(["rm", "-rf", str(state)], check=False)
        out(json.dumps(result, indent=1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vms", type=int, default=32)
    ap.add_argument("--peers", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=10)
    a = ap.parse_args()
    if not 1 <= a.vms <= 200 or not 1 <= a.peers <= 200 or not 1 <= a.rounds <= 1000:
        ap.error("--vms and --peers in 1..200, --rounds in 1..1000")
    r = run(a.vms, a.peers, a.rounds, out=lambda s: None)
    print(f"one agent, {r['vms']} VMs x {r['peers']} LRC peers each (real tc, marker, nftables, MPTCP, BPF maps):")
    print(f"  full apply of every VM:        {r['full_apply_s']:.2f} s")
    print(f"  the same configuration again:  {r['again_s']:.2f} s")
    print(f"  status (read back every VM):   {r['status_s']:.2f} s")
    f, q = r["lrc_first_round_ms"], r["lrc_rates_round_ms"]
    print(f"  LRC round, pairs opening:      median {f['median']:.0f} ms, max {f['max']:.0f} ms per VM")
    print(f"  LRC rates-only round:          median {q['median']:.1f} ms, p95 {q['p95']:.1f}, max {q['max']:.1f} "
          f"ms per VM ({r['per_round']['classes']} HTB classes + {r['per_round']['buckets']} marker buckets "
          "rewritten)")
    a_ = r["all_vms_round_s"]
    print(f"  every VM's round, together:    median {a_['median']:.2f} s, max {a_['max']:.2f} s "
          f"(tau_v {a_['tau_v_s']} s); repairs {r['repairs']}; rounds that moved rates / nothing: "
          f"{r['rounds_did'].get('rates', 0)} / {r['rounds_did'].get('idle', 0)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
