"""How fast the controller's agent sessions push rate factors (LRC's path)
to many agents, and whether a dead or hung agent slows the others.

N real agent daemons (``bwfabric agent``, separate processes, unix
sockets, their own keys) and one controller-side session each. For each
phase of ``--seconds``, a producer offers every session a new rate-factor
message every ``--period-ms`` (latest value wins); the figure is what the
agents confirmed:

- ``all up``: every agent alive;
- ``one hung``: one agent stopped with SIGSTOP (its connection stays open,
  nothing answers: the worst case for a sender that waits);
- ``one dead``: that agent killed (connection refused from then on).

Printed per phase: confirmed pushes/s over all live agents, the slowest
live agent's pushes/s, the mean delivered period per agent, and the
controller side's CPU per confirmed push (this process's process time:
the sessions and the producer; the agents are other processes) with the
pushes/s one controller core would sustain at that cost -- on this machine
the agents share the controller's two cores, on a fabric they run on their
hosts. Run:
``python -m benchmarks.agent_push --agents 64``; 1000 agents at LRC's
τ_r = 100 ms: ``--agents 1000 --per-process 50 --period-ms 100`` (50 real
agents per process, benchmarks.agent_host).
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from controller.agent_sessions import Session
from controller.tenancy import Endpoint
from bwcommon.channel import host_key, write_secret


def start_agents(workdir: Path, n: int, master: bytes, per_process: int = 1) -> dict[str, subprocess.Popen]:
    """``n`` agents h1..hN: each a ``bwfabric agent`` daemon of its own
    (``per_process`` 1), or ``per_process`` real agents in each of
    n/per_process processes (benchmarks.agent_host: more agents than the
    machine holds processes). Returns each host's process."""
    hosts = [f"h{i + 1}" for i in range(n)]
    procs = {}
    if per_process == 1:
        for h in hosts:
            write_secret(workdir / f"{h}.key", host_key(master, h).hex())
            procs[h] = subprocess.Popen(
                [sys.executable, "-m", "bwfabric.cli", "agent", "--host", h, "--key-file", str(workdir / f"{h}.key"),
                 "--listen", f"unix:{workdir}/{h}.sock", "--state-dir", str(workdir / f"state-{h}")],
                stdout=subprocess.DEVNULL, stderr=open(workdir / f"{h}.log", "w"))
    else:
        write_secret(workdir / "master.key", master.hex())
        for i in range(0, n, per_process):
            group = hosts[i:i + per_process]
            p = subprocess.Popen([sys.executable, "-m", "benchmarks.agent_host", str(workdir),
                                  str(workdir / "master.key"), *group],
                                 stdout=subprocess.DEVNULL, stderr=open(workdir / f"{group[0]}.log", "w"))
            procs.update({h: p for h in group})
    deadline = time.monotonic() + 300
    for h in hosts:
        while not (workdir / f"{h}.sock").exists():
            if time.monotonic() > deadline or procs[h].poll() is not None:
                log = next(workdir.glob("*.log")).read_text()[-500:] if per_process > 1 else \
                    (workdir / f"{h}.log").read_text()[-500:]
                raise SystemExit(f"agent {h} did not start: {log}")
            time.sleep(0.05)
    return procs


def process_cpu_s(pids) -> float:
    """User + system CPU seconds of these processes (/proc; a process gone counts 0)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])      # utime, stime (fields 14 and 15 of stat)
    return total / os.sysconf("SC_CLK_TCK")


def phase(sessions: dict[str, Session], live: list[str], seconds: float, period_s: float, agent_pids=()) -> dict:
    before = {h: sessions[h].state()["rate_pushes"] for h in sessions}
    agents0 = process_cpu_s(agent_pids)
    cpu0 = time.process_time()          # this process is the controller's side: sessions and producer
    t0 = time.monotonic()
    k = 0
    while time.monotonic() - t0 < seconds:
        k += 1
        for s in sessions.values():
            s.push_rates({"factors": {"k": k}})
        time.sleep(max(0.0, t0 + k * period_s - time.monotonic()))
    dt = time.monotonic() - t0
    cpu = time.process_time() - cpu0
    agents_cpu = process_cpu_s(agent_pids) - agents0
    got = {h: sessions[h].state()["rate_pushes"] - before[h] for h in sessions}
    rates = [got[h] / dt for h in live]
    pushes = sum(got[h] for h in live)
    return {"pushes_per_s": sum(rates), "slowest_agent_per_s": min(rates), "offered_per_agent_per_s": k / dt,
            "mean_period_ms": 1000 * len(live) * dt / max(1, pushes),
            # what the agents' machines do not pay for: the controller's CPU per confirmed push
            "controller_cpu_ms_per_push": 1000 * cpu / max(1, pushes),
            "pushes_per_controller_core_s": pushes / cpu if cpu > 0 else float("inf"),
            # the agents' processes, on this machine the same cores: what a fabric's hosts pay instead
            "agents_cpu_ms_per_push": 1000 * agents_cpu / max(1, pushes)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--period-ms", type=float, default=0.0, help="0: offer as fast as the producer can")
    ap.add_argument("--per-process", type=int, default=1,
                    help="agents per process (1: each a bwfabric agent daemon; more: benchmarks.agent_host, for "
                         "1000 agents -- the hung/dead phases then stop one process of them)")
    args = ap.parse_args(argv)
    if args.agents < 2 or args.per_process < 1 or args.per_process >= args.agents:
        ap.error("need --agents >= 2 and 1 <= --per-process < --agents")
    workdir = Path(tempfile.mkdtemp(prefix="bwfabric-push-"))
    master = secrets.token_bytes(32)
    procs = {}
    sessions: dict[str, Session] = {}
    try:
        t = time.monotonic()
        procs = start_agents(workdir, args.agents, master, args.per_process)
        n_procs = len({p.pid for p in procs.values()})
        print(f"{args.agents} agents in {n_procs} processes listening after {time.monotonic() - t:.1f} s")
        for h in procs:
            sessions[h] = Session(Endpoint(h, f"unix:{workdir}/{h}.sock", None), host_key(master, h),
                                  generation=time.time_ns(), timeout_s=2.0, status_interval_s=60).start()
        deadline = time.monotonic() + 30
        while not all(s.state()["connected"] for s in sessions.values()):
            if time.monotonic() > deadline:
                raise SystemExit("sessions did not connect")
            time.sleep(0.05)
        hosts = sorted(sessions, key=lambda h: int(h[1:]))
        victim = procs[hosts[0]]
        stopped = [h for h in hosts if procs[h] is victim]
        live = [h for h in hosts if procs[h] is not victim]
        what = "one" if len(stopped) == 1 else f"{len(stopped)} (one process)"
        period = args.period_ms / 1000
        pids = sorted({p.pid for p in procs.values()})
        rows = [("all up", phase(sessions, hosts, args.seconds, period, pids))]
        os.kill(victim.pid, signal.SIGSTOP)
        rows.append((f"{what} hung (SIGSTOP)", phase(sessions, live, args.seconds, period, pids)))
        os.kill(victim.pid, signal.SIGKILL)
        rows.append((f"{what} dead (SIGKILL)", phase(sessions, live, args.seconds, period, pids)))
        print(f"\nrate-factor pushes confirmed by the agents ({args.agents} agents, {args.seconds:g} s per phase, "
              f"{'as fast as offered' if not period else f'offered every {args.period_ms:g} ms'}):")
        print(f"{'phase':<32}{'pushes/s':>10}{'slowest live agent/s':>22}{'mean period ms':>16}"
              f"{'ctl CPU ms/push':>17}{'per ctl core/s':>16}{'agents CPU ms/push':>20}")
        for name, r in rows:
            print(f"{name:<32}{r['pushes_per_s']:>10.0f}{r['slowest_agent_per_s']:>22.1f}{r['mean_period_ms']:>16.1f}"
                  f"{r['controller_cpu_ms_per_push']:>17.3f}{r['pushes_per_controller_core_s']:>16.0f}"
                  f"{r['agents_cpu_ms_per_push']:>20.3f}")
        ratio = rows[1][1]["slowest_agent_per_s"] / rows[0][1]["slowest_agent_per_s"]
        print(f"slowest live agent with one hung / all up: {ratio:.2f}")
    finally:
        for s in sessions.values():
            s.stop(timeout=3)
        for p in {p.pid: p for p in procs.values()}.values():
            try:
                p.send_signal(signal.SIGCONT)
            except ProcessLookupError:
                pass
            if p.poll() is None:
                p.terminate()
        for p in {p.pid: p for p in procs.values()}.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
