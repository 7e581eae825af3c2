"""Measuring a BG/WC run: per-sender, per-class byte counters at the
receivers (nftables), the traffic (MPTCP bulk senders, UDP), and what each
run leaves for diagnosis (:class:`RunLog`)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from experiments.bgwc.testbed import DATA_PORT, PAIR, SENDERS, UDP_FLOWS_PER_SENDER, UDP_PORT, Config
from experiments.fabric import Fabric
from experiments.meter import Meter, interval_rates, window_mean  # noqa: F401 (re-exported)

class Traffic:
    def __init__(self, fab: Fabric, cfg: Config):
        self.fab, self.cfg = fab, cfg
        self.procs: dict[str, list] = {}
        py = [sys.executable, "-m", "experiments.flowgen"]
        self.sinks = [fab.host(r).popen(py + ["server", "--port", str(DATA_PORT), "--out", "/dev/null",
                                              "--mptcp"]) for r in PAIR.values()]
        # iperf3 serves one test at a time: a server port per UDP flow of a run
        self.udp_sinks = [fab.host(r).popen(["iperf3", "-s", "-p", str(UDP_PORT + i)], stdout=subprocess.DEVNULL)
                          for r in PAIR.values() for i in range(UDP_FLOWS_PER_SENDER)]
        self.udp_started: dict[str, int] = {}
        # each bulk sender lists its send() calls that waited (flowgen --waits)
        self.waits_dir = Path(tempfile.mkdtemp(prefix="bwfabric-waits-"))
        self.bulk_runs: list[tuple[str, Path, subprocess.Popen]] = []
        self.waits: list[dict] = []
        time.sleep(1.0)

    def bulk(self, snd: str, secs: float, conns: int = 1, rate_mbps: float | None = None) -> None:
        dst = self.fab.topo.host(PAIR[snd]).ip
        rate = ["--rate", str(rate_mbps)] if rate_mbps else []
        waits = self.waits_dir / f"{snd}-{len(self.bulk_runs)}.json"
        proc = self.fab.host(snd).popen(
            [sys.executable, "-m", "experiments.flowgen", "bulk", "--dst", dst, "--port", str(DATA_PORT),
             "--duration", str(secs), "--conns", str(conns), "--mptcp", *rate, "--waits", str(waits)])
        self.procs.setdefault(snd, []).append(proc)
        self.bulk_runs.append((snd, waits, proc))

    def udp(self, snd: str, mbps: float, secs: float, tos: int = 0) -> None:
        dst = self.fab.topo.host(PAIR[snd]).ip
        n = self.udp_started.get(snd, 0)
        if n >= UDP_FLOWS_PER_SENDER:
            raise RuntimeError(f"{snd}: at most {UDP_FLOWS_PER_SENDER} UDP flows per run")
        self.udp_started[snd] = n + 1
        self.procs.setdefault(snd, []).append(self.fab.host(snd).popen(
            ["iperf3", "-c", dst, "-p", str(UDP_PORT + n), "-u", "-b", f"{mbps}M", "-t", str(int(secs)), "-S", str(tos),
             # one datagram per packet: a policer dropping one fragment loses the whole datagram
             "-l", str(self.fab.topo.mtu - 28)], stdout=subprocess.DEVNULL))

    def stop(self, snd: str) -> None:
        for p in self.procs.pop(snd, []):
            if p.poll() is None:
                p.terminate()

    def close(self) -> None:
        for snd in list(self.procs):
            self.stop(snd)
        for p in self.sinks + self.udp_sinks:
            if p.poll() is None:
                p.terminate()
            p.wait(5)
        for snd, path, proc in self.bulk_runs:
            try:
                proc.wait(5)
                self.waits += [{"sender": snd, **w} for w in json.loads(path.read_text())]
            except (subprocess.TimeoutExpired, OSError, ValueError):
                pass    # a sender that did not finish in time: its waits are not known
        shutil.rmtree(self.waits_dir, ignore_errors=True)




@dataclass
class RunLog:
    """What each run of one experiment leaves for diagnosis, in run order."""
    traces: list[list[dict]] = field(default_factory=list)      # subflow traces (option trace=1)
    # when each run's clock (its samples' t = 0) started, Unix time: to line the
    # samples up with logs and kernel traces taken outside the experiment
    run_t0s: list[float] = field(default_factory=list)
    connections: list[dict[str, list[int]]] = field(default_factory=list)   # DATA_ACKs per sender (ktrace)
    # each run's send() calls that waited >= flowgen.WAIT_LOG_S (t from the run's start)
    sender_waits: list[list[dict]] = field(default_factory=list)


def measured(fab: Fabric, cfg: Config, scenario, log: RunLog) -> tuple[list[dict], dict | None]:
    """Receiver meters around ``scenario(traffic)``, which starts flows and
    sleeps through the run: per-interval rates, and each sender's subflows
    counted ``SUBFLOWS_AT_S`` in."""
    traffic = Traffic(fab, cfg)
    meter = Meter(fab, list(PAIR.values()), cfg.sample_s, trace=cfg.trace, senders=SENDERS).start()
    try:
        scenario(traffic)
        time.sleep(0.5)
    finally:
        meter.stop()
        traffic.close()
        _quiesce(fab)
    if meter.trace is not None:
        log.traces.append(meter.trace)
    log.run_t0s.append(round(meter.t0, 6))
    log.connections.append(meter.connections)
    log.sender_waits.append([{**w, "t": round(w["t"] - meter.t0, 3)} for w in traffic.waits])
    return meter.rates(), meter.subflows


def _quiesce(fab: Fabric, timeout_s: float = 20.0) -> None:
    """Wait until no sender has an MPTCP subflow left, so the next run's
    WC subflow count K (and its share) starts from a clean slate."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = 0
        for snd in SENDERS:
            left += fab.run_in(snd, "ss", "-tinH", "state", "connected").stdout.count("tcp-ulp-mptcp")
        if not left:
            return
        time.sleep(0.5)
    print(f"warning: senders still have MPTCP subflows after {timeout_s:g} s", file=sys.stderr)


def parse_meter_stats(text: str) -> dict[int, dict[str, int]]:
    """``ovs-ofctl -O OpenFlow13 meter-stats`` -> {meter id: {packets in, packets dropped by its band}}."""
    out: dict[int, dict[str, int]] = {}
    for m in re.finditer(r"meter:(\d+).*?packet_in_count:(\d+).*?0: packet_count:(\d+)", text, re.S):
        out[int(m.group(1))] = {"packets": int(m.group(2)), "dropped": int(m.group(3))}
    return out


def meter_drops(topo) -> dict[str, dict[str, int]]:
    """Per metered host: packets its ToR meter saw and dropped (the ToR
    meter's id is the host's port)."""
    out = {}
    for snd in SENDERS:
        link = next(lk for lk in topo.links if snd in (lk.a, lk.b))
        tor, port = (link.b, link.b_port) if link.a == snd else (link.a, link.a_port)
        res = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "meter-stats", tor], capture_output=True, text=True)
        got = parse_meter_stats(res.stdout).get(port)
        if got:
            out[snd] = got
    return out


def share_error(measured: dict[str, float], wanted: dict[str, float]) -> float | None:
    """Largest relative error of the measured shares against the wanted
    proportions (entries wanted 0 are left out)."""
    tot_m, tot_w = sum(measured.values()), sum(wanted.values())
    if tot_m <= 0 or tot_w <= 0:
        return None
    return max(abs(measured[k] / tot_m - wanted[k] / tot_w) / (wanted[k] / tot_w) for k in wanted if wanted[k] > 0)

