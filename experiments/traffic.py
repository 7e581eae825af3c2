"""Run traffic on an emulated fabric: iperf3 long flows and flow-size
workloads (experiments.flowgen), collecting per-flow results."""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from experiments.fabric import Fabric
from experiments.workloads import FlowSpec

IPERF_BASE_PORT = 5201
FLOWGEN_PORT = 7000


@dataclass
class LongFlowResult:
    src: str
    dst: str
    mbps: float | None  # receiver goodput after the omitted warm-up; None: failed
    error: str | None = None


def run_long_flows(fab: Fabric, pairs: list[tuple[str, str]], duration_s: float = 20,
                   omit_s: float = 3, progress=None, during_warmup=None) -> list[LongFlowResult]:
    """One iperf3 TCP flow per pair, all at once; goodput measured at the
    receiver over ``duration_s`` after ``omit_s`` of warm-up. Pair i's
    server listens on ``IPERF_BASE_PORT + i``. ``during_warmup()``, if
    given, runs 1 s after the clients start (inside the warm-up when
    ``omit_s`` leaves it room: it must return before the warm-up ends)."""
    servers = []
    for i, (_, dst) in enumerate(pairs):
        port = IPERF_BASE_PORT + i
        servers.append(fab.endpoint(dst).popen(["iperf3", "-s", "-1", "-p", str(port)]))
    time.sleep(1.0)
    clients = []
    for i, (src, dst) in enumerate(pairs):
        cmd = ["timeout", str(int(duration_s + omit_s + 30)), "iperf3", "-c", fab.ip(dst),
               "-p", str(IPERF_BASE_PORT + i), "-t", str(duration_s), "-O", str(omit_s), "-J"]
        clients.append(fab.endpoint(src).popen(cmd))
    waited = 0.0
    if during_warmup is not None:
        t0 = time.monotonic()
        _wait(1.0, progress)
        during_warmup()
        waited = time.monotonic() - t0
        if progress is not None:
            progress(waited - 1.0)
    _wait(max(0.0, duration_s + omit_s + 2 - waited), progress)
    results = []
    for (src, dst), proc in zip(pairs, clients):
        out, err = proc.communicate(timeout=60)
        try:
            data = json.loads(out)
            if "error" in data:
                raise ValueError(data["error"])
            results.append(LongFlowResult(src, dst, data["end"]["sum_received"]["bits_per_second"] / 1e6))
        except (ValueError, KeyError) as exc:
            results.append(LongFlowResult(src, dst, None, f"iperf3: {exc}"))
    for s in servers:
        if s.poll() is None:
            s.terminate()
        s.wait(5)
    return results


@dataclass
class WorkloadResult:
    flows: list[dict]            # per flow: src, dst, size, start, fct, complete
    rx_mbps_by_host: dict[str, float]  # receiver goodput in the measurement window
    window_s: tuple[float, float]
    rx_bytes_total_by_host: dict[str, int]  # everything received, window or not

    @property
    def aggregate_mbps(self) -> float:
        return sum(self.rx_mbps_by_host.values())


def run_workload(fab: Fabric, flows: list[FlowSpec], duration_s: float, workdir: Path,
                 drain_s: float = 10.0, warmup_s: float = 2.0, mptcp: bool = False,
                 progress=None) -> WorkloadResult:
    """Start a flowgen server on every destination and one client per sender
    replaying its flows; wait ``duration_s + drain_s``; collect."""
    workdir.mkdir(parents=True, exist_ok=True)
    py = [sys.executable, "-m", "experiments.flowgen"]
    extra = ["--mptcp"] if mptcp else []
    hosts = sorted({f.dst for f in flows})         # hosts or VMs: wherever a flow ends
    servers = {h: fab.endpoint(h).popen(py + ["server", "--port", str(FLOWGEN_PORT), "--out",
                                          str(workdir / f"rx-{h}.json")] + extra) for h in hosts}
    by_src: dict[str, list[dict]] = defaultdict(list)
    for i, f in enumerate(flows):
        by_src[f.src].append({"id": i, "dst": f.dst, "ip": fab.ip(f.dst), "port": FLOWGEN_PORT,
                              "start_s": f.start_s, "size": f.size})
    time.sleep(1.5)
    t0 = time.time() + 1.0
    deadline = duration_s + drain_s
    clients = {}
    for src, plan in by_src.items():
        plan_file = workdir / f"plan-{src}.json"
        plan_file.write_text(json.dumps(plan))
        clients[src] = fab.endpoint(src).popen(py + ["client", "--plan", str(plan_file), "--t0", repr(t0),
                                                 "--deadline", str(deadline), "--out",
                                                 str(workdir / f"flows-{src}.jsonl")] + extra)
    # clients exit once all their flows are done: stop waiting then
    _wait(deadline + 1.0, progress, until=lambda: all(p.poll() is not None for p in clients.values()))
    for proc in clients.values():
        try:
            proc.wait(timeout=15)
        except Exception:
            proc.kill()
    for proc in servers.values():
        proc.terminate()
    for proc in servers.values():
        proc.wait(10)
    records = []
    for src in by_src:
        path = workdir / f"flows-{src}.jsonl"
        for line in path.read_text().splitlines() if path.exists() else []:
            rec = json.loads(line)
            rec["src"] = src
            records.append(rec)
    window = (warmup_s, duration_s)
    rx, rx_total = {}, {}
    for h in hosts:
        path = workdir / f"rx-{h}.json"
        data = json.loads(path.read_text()) if path.exists() else {"bytes": [], "t0": t0, "slot_s": 1}
        rx_total[h] = sum(data["bytes"])
        in_window = window_bytes(data["bytes"], data["slot_s"], data["t0"] - t0, window)
        rx[h] = in_window * 8 / (window[1] - window[0]) / 1e6
    return WorkloadResult(sorted(records, key=lambda r: r["id"]), rx, window, rx_total)


def window_bytes(slots: list[int], slot_s: float, slot0_s: float, window: tuple[float, float]) -> float:
    """Bytes received in ``window`` (seconds after t0) from per-slot counts;
    slot i covers [slot0_s + i*slot_s, +slot_s); a slot straddling an edge of
    the window counts in proportion to its overlap."""
    total = 0.0
    for i, b in enumerate(slots):
        start = slot0_s + i * slot_s
        overlap = min(start + slot_s, window[1]) - max(start, window[0])
        if overlap > 0:
            total += b * overlap / slot_s
    return total


def _wait(seconds: float, progress=None, until=None) -> None:
    end = time.monotonic() + seconds
    while True:
        left = end - time.monotonic()
        if left <= 0 or (until is not None and until()):
            return
        step = min(0.5, left)
        time.sleep(step)
        if progress is not None:
            progress(step)


def stop_all(procs, wait_s: float = 10.0) -> None:
    """Terminate every process still running, then wait for each (killed
    after ``wait_s``)."""
    import subprocess
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(wait_s)
        except subprocess.TimeoutExpired:
            p.kill()
