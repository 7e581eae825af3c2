"""BG/WC experiments on the paper's testbed (S1-S4 -> S5-S8 through one
shared link), with the prio_queues app and tc queues on every switch port,
a host agent per server (MPTCP: 1 BG + N WC subflows, nftables marking, HTB
guarantee, bwf_wc congestion control, Eq. 1 buffers).

Rates are measured at the receivers: an nftables table in each receiver's
namespace counts arriving bytes per sender and class (ToS 0x00 TCP = BG,
0x20 = WC, UDP), sampled every ``sample_s``.

Kinds (one command per figure: ``bwfabric experiment bgwc-fig12`` ...):
- ``fig12``: guarantees in the ratio 350:250:200:100 of the link; each
  sender runs one MPTCP connection; halfway each also sends UDP at 5 % of
  the link (UDP is BG: its BG TCP should drop by as much).
- ``fig13``: the same without UDP; S2 stops for ``stop_s`` seconds, then
  restarts.
- ``table3``: S1-S3 share the link with the A_l policy, rows (400/200/200,
  300/100/100, 400/200/100, 400/200/off of 1000, scaled): WC in proportion
  to A_l.
- ``fig14``: S1 opens ``conns`` connections (3, then 5), S3 and S4 one
  each; with policy ``equal`` (A_l = 1 each) WC should be equal per VM, with
  no policy (A_l = K, plain per-subflow Reno) proportional to subflows.
- ``adversarial``: S4 marks everything BG and sends UDP far above its
  guarantee; the others must keep their guarantees.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from controller.contract import NFT_DSCP_BG, NFT_DSCP_WC, TOS_BG
from experiments import ktrace, ovs
from experiments import results as R
from experiments.agents import Agents, BpfLoaded
from experiments.controller_proc import ControllerProcess
from experiments.fabric import Fabric
from experiments.options import OptionError
from hostagent import cc
from hostagent.plan import CLASS_BG, ENDPOINT_ID_BASE
from mininet_topos import builders

KINDS = {
    "fig12": "guarantees 350:250:200:100, then +5 % UDP each: BG holds, WC shares the rest",
    "fig13": "S2 stops, others' WC take its share; S2 regains its guarantee",
    "table3": "three senders, WC in proportion to A_l (four rows)",
    "fig14": "S1 with 3 and 5 connections: WC per VM with and without the policy",
    "adversarial": "an unmanaged S4 floods BG/EF UDP and many TCP connections",
    "sched": "BG-first scheduling on an idle path: default scheduler, WC as backup, backup toggling",
}
SENDERS = ("s1", "s2", "s3", "s4")
PAIR = {"s1": "s5", "s2": "s6", "s3": "s7", "s4": "s8"}
PAPER_LINK = 1000.0
PAPER_UNIT = 75.0
DATA_PORT = 7100
UDP_PORT = 7200
UDP_FLOWS_PER_SENDER = 3
METER_HEADROOM = 1.05
SUBFLOWS_AT_S = 4.0   # when the meter counts each sender's subflows (after the joins)
# fig14's guarantees (paper units, of 1000): BG small beside WC, but not so
# small that a BG subflow's GSO-sized host queue holds its connection back
# for seconds (at 10 units = 1 Mb/s, one 64 KiB packet takes 0.5 s)
FIG14_GUARANTEE = 100
TABLE3_ROWS = ((400, 200, 200), (300, 100, 100), (400, 200, 100), (400, 200, None))


@dataclass
class Config:
    kind: str = "fig12"
    # 60 Mb/s links for the paper's 1 Gb/s: at 100 Mb/s OVS's one forwarding
    # thread ran at 97-100 % of a core and its port sockets dropped packets of
    # every class in about a third of the runs (3-1697 per run, every such run
    # missing a target); at 60 Mb/s none in 66 runs (see the README)
    link_mbps: float = 60.0
    duration: float = 30.0
    sample_s: float = 0.5
    stop_at: float = 15.0          # fig13
    stop_s: float = 20.0
    conns: tuple[int, ...] = (3, 5)  # fig14: S1's connection counts
    policies: tuple[str, ...] = ("none", "equal")  # fig14: without the policy, with 1:1:1
    wc_subflows: int = 1
    # table3, fig14: runs per row; WC shares are judged on their mean. A WC
    # subflow takes about one ECN mark a second (nstat: fig14's senders 16-21
    # CE-marked segments in 20 s), so one run's 25 s shares stray: fig14's
    # 40 runs of one session (5 sets x 2 runs per row, 1:1:1 with 5
    # connections the widest) had max relative errors up to 0.24 for single
    # runs, 0.21 for means of 2, 0.13 for means of 4 (every choice of runs)
    reps: int = 4
    equal_level: float = 1.0       # fig14: every sender's A_l under the 1:1:1 policy
    beta: float = 10.0             # Eq. 1: the agents default to 3; here 10 (BG dipped to 0.74 with 3, see README)
    # WC queues: RED-style marking (ECN-capable WC) / early drop (the rest) on
    # every switch port (apps.prio_queues.aqm). Without it, drop-tail losses of
    # WC segments held whole connections (BG included) in MPTCP's in-order
    # delivery: fig12 min BG 0.19-0.97 in 8 traced runs with drop-tail and jumbo
    # frames; with it (and bwf_sockops' WC send buffers) 0.98-0.99
    wc_aqm: bool = True
    # 1500-byte frames in 450 KB per-class FIFOs: with no propagation delay the
    # windows are the queue, and jumbo frames left WC subflows at their 2-packet
    # floor, where neither marking nor Eq. 7's factor can steer them
    mtu: int = 1500
    queue_kb: float = 450.0        # per-class FIFO on every switch port
    stale_loss_cnt: int = 4        # hosts' net.mptcp.stale_loss_cnt (the kernel's default: 4)
    rto_min_ms: float = 0.0        # hosts' TCP minimum RTO; 0: the kernel's (200 ms)
    ecn: bool = True               # hosts ask for ECN: with wc_aqm, WC queues mark CE instead of dropping
    pace_bg: bool = True           # agents pace BG at its guarantee (what MPTCP's scheduler needs to feed WC)
    rcvbuf_initial_kb: float = 0.0  # agents' tcp_rmem[1] (up to Eq. 1's B); 0: the agents' default (3 MiB)
    rtt_hint_ms: float = 0.0       # agents' Eq. 1 maxRTT until (and floor under) live RTTs; 0: the agents' (50 ms)
    trace: bool = False            # record every sender's subflows (ss) at each sample: stall diagnosis
    ktrace: bool = False           # MPTCP tracepoints (experiments.ktrace): connection-level stalls, undisturbed
    of_port: int = 6653

    def check(self) -> None:
        if self.kind not in KINDS:
            raise OptionError(f"option kind={self.kind!r}: one of {', '.join(KINDS)}")
        if self.link_mbps <= 0 or self.duration <= 4 or self.sample_s <= 0:
            raise OptionError("options link_mbps, duration (> 4 s), sample_s must be positive")
        if not self.policies or set(self.policies) - {"none", "equal"}:
            raise OptionError(f"option policies={','.join(self.policies)}: some of none, equal")
        if not 0 < self.equal_level <= 100:
            raise OptionError(f"option equal_level={self.equal_level:g}: 0 < A_l <= 100")
        if not 1 <= self.reps <= 20:
            raise OptionError(f"option reps={self.reps}: 1..20")
        if self.beta <= 0:
            raise OptionError(f"option beta={self.beta}: must be positive")
        if not 576 <= self.mtu <= 9000:
            raise OptionError(f"option mtu={self.mtu}: 576..9000")
        if not 2 * self.mtu / 1000 <= self.queue_kb <= 100_000:
            raise OptionError(f"option queue_kb={self.queue_kb:g}: at least two packets of the MTU, at most 100000")
        if self.rcvbuf_initial_kb and not 4 <= self.rcvbuf_initial_kb <= 65536:
            raise OptionError(f"option rcvbuf_initial_kb={self.rcvbuf_initial_kb:g}: 4..65536, or 0 for the agents'")
        if self.rtt_hint_ms and not 0 < self.rtt_hint_ms <= 10_000:
            raise OptionError(f"option rtt_hint_ms={self.rtt_hint_ms:g}: 0..10000, or 0 for the agents'")
        if self.rto_min_ms and not 1 <= self.rto_min_ms <= 1000:
            raise OptionError(f"option rto_min_ms={self.rto_min_ms:g}: 1..1000, or 0 for the kernel's")

    @property
    def scale(self) -> float:
        return self.link_mbps / PAPER_LINK

    @property
    def unit_mbps(self) -> float:
        return PAPER_UNIT * self.scale


def _meter_rules(topo) -> str:
    rules = []
    for snd in SENDERS:
        ip = topo.host(snd).ip
        rules += [f'ip saddr {ip} meta l4proto tcp ip dscp {NFT_DSCP_BG} counter comment "bg-{snd}"',
                  f'ip saddr {ip} meta l4proto tcp ip dscp {NFT_DSCP_WC} counter comment "wc-{snd}"',
                  f'ip saddr {ip} meta l4proto udp counter comment "udp-{snd}"']
    body = "\n    ".join(rules)
    return ("table ip bwfmeter {\n  chain in {\n    type filter hook input priority filter; policy accept;\n    "
            f"{body}\n  }}\n}}\n")


class Meter:
    """Per-sender, per-class byte counters at the receivers, sampled."""

    def __init__(self, fab: Fabric, receivers: list[str], period_s: float, trace: bool = False):
        self.fab, self.receivers, self.period_s = fab, receivers, period_s
        self.samples: list[tuple[float, dict[str, int], dict[str, float]]] = []
        self.trace: list[dict] | None = [] if trace else None
        self.subflows: dict[str, dict[str, int]] | None = None
        self.connections: dict[str, list[int]] = {}   # sender -> its connections' DATA_ACKs (snd_una), once
        self._stop = threading.Event()
        self.t0 = time.time()

    def _nft(self, host: str, *args: str, stdin: str | None = None) -> str:
        res = self.fab.run_in(host, "nft", *args, stdin=stdin)
        if res.returncode != 0:
            raise RuntimeError(f"nft on {host}: {res.stderr.strip()}")
        return res.stdout

    def start(self) -> "Meter":
        rules = _meter_rules(self.fab.topo)
        for h in self.receivers:
            self._nft(h, "-f", "-", stdin="table ip bwfmeter {}\ndelete table ip bwfmeter\n" + rules)
        self.t0 = time.time()
        threading.Thread(target=self._loop, daemon=True).start()
        return self

    def read(self) -> tuple[dict[str, int], dict[str, float]]:
        """Each counter's bytes, and when it was read (the middle of its
        receiver's ``nft`` call, seconds since start): the receivers are read
        one after another, and the time one read takes varies with the load."""
        total: dict[str, int] = {}
        when: dict[str, float] = {}
        for h in self.receivers:
            t0 = time.time()
            data = json.loads(self._nft(h, "-j", "list", "table", "ip", "bwfmeter"))
            t = (t0 + time.time()) / 2 - self.t0
            for item in data["nftables"]:
                rule = item.get("rule")
                if not rule or "comment" not in rule:
                    continue
                counter = next(e["counter"] for e in rule["expr"] if "counter" in e)
                total[rule["comment"]] = total.get(rule["comment"], 0) + counter["bytes"]
                when[rule["comment"]] = t
        return total, when

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time() - self.t0, *self.read()))
            if self.subflows is None and self.samples[-1][0] >= SUBFLOWS_AT_S:
                self.subflows = self.count_subflows()
            if self.trace is not None:
                self.trace.append({"t": round(time.time() - self.t0, 3), **self.subflow_states()})
            self._stop.wait(self.period_s)

    def _ss(self, host: str) -> tuple[str, str]:
        """``ss -tinH`` (TCP sockets, subflows included) and ``ss -MinH``
        (MPTCP sockets) of one host, in one process."""
        tcp, _, msk = self.fab.run_in(host, "sh", "-c", "ss -tinH; echo ==MSK==; ss -MinH").stdout.partition(
            "==MSK==\n")
        return tcp, msk

    def subflow_states(self) -> dict[str, list[dict]]:
        """Each sender's and receiver's MPTCP subflows as ``ss`` shows them
        (cwnd, RTO, backoff, unacked, lost, windows, rates ...), and each
        host's MPTCP sockets' queues (``<host>.msk``: Recv-Q holds the data
        waiting for an earlier hole at the connection level): what a stalled
        connection looks like."""
        from hostagent.observe import msk_queues, subflow_states
        out: dict[str, list[dict]] = {}
        for host in (*SENDERS, *PAIR.values()):     # one process per host: the trace loads the CPU less
            tcp, msk = self._ss(host)
            out[host], out[host + ".msk"] = subflow_states(tcp), msk_queues(msk)
        return out

    def count_subflows(self) -> dict[str, dict[str, int]]:
        """Per sender: its MPTCP subflows by kind (first = BG, joins = WC),
        from ss, and K as the WC congestion control counts it (its map)."""
        from hostagent import cc
        from hostagent.observe import msk_queues
        out = {}
        k = cc.read_map("bwf_kcount")
        for snd in SENDERS:
            tcp, msk = self._ss(snd)
            lines = [ln for ln in tcp.splitlines() if "tcp-ulp-mptcp" in ln]
            out[snd] = {"bg": sum(" flags:M" in ln for ln in lines), "wc": sum(" flags:J" in ln for ln in lines),
                        # joins that agreed on ECN (bwf_sockops gave them bwf_wc_ecn): the rest are
                        # not ECN-capable, and the WC queues' AQM drops their packets instead of marking
                        "wc_ecn": sum(" flags:J" in ln and " bwf_wc_ecn " in ln for ln in lines),
                        "k": k.get(self.fab.topo.host(snd).ip, 0)}
            # which connection is whose, for ktrace's stalls (data sequence numbers are per connection)
            self.connections[snd] = [m["snd_una"] for m in msk_queues(msk) if "snd_una" in m]
        return out

    def stop(self) -> None:
        self._stop.set()
        for h in self.receivers:
            try:
                self._nft(h, "delete", "table", "ip", "bwfmeter")
            except RuntimeError:
                pass

    def rates(self) -> list[dict]:
        return interval_rates(self.samples)


def interval_rates(samples: list[tuple[float, dict[str, int], dict[str, float]]]) -> list[dict]:
    """Mb/s per counter between consecutive samples (each over the times its
    own counter was read), stamped at the sample's start time."""
    out = []
    for (_, a, ta), (t1, b, tb) in zip(samples, samples[1:]):
        row = {"t": round(t1, 3)}
        for k in b:
            dt = tb[k] - ta.get(k, tb[k])
            row[k] = (b[k] - a.get(k, 0)) * 8 / dt / 1e6 if dt > 0 else 0.0
        out.append(row)
    return out


def window_mean(rates: list[dict], key: str, t_from: float, t_to: float) -> float:
    vals = [r.get(key, 0.0) for r in rates if t_from < r["t"] <= t_to]
    return sum(vals) / len(vals) if vals else 0.0


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


def _measured(fab: Fabric, cfg: Config, scenario) -> tuple[list[dict], dict | None]:
    """Receiver meters around ``scenario(traffic)``, which starts flows and
    sleeps through the run: per-interval rates, and each sender's subflows
    counted ``SUBFLOWS_AT_S`` in."""
    traffic = Traffic(fab, cfg)
    meter = Meter(fab, list(PAIR.values()), cfg.sample_s, trace=cfg.trace).start()
    try:
        scenario(traffic)
        time.sleep(0.5)
    finally:
        meter.stop()
        traffic.close()
        _quiesce(fab)
    if meter.trace is not None:
        TRACES.append(meter.trace)
    RUN_T0S.append(round(meter.t0, 6))
    CONNECTIONS.append(meter.connections)
    SENDER_WAITS.append([{**w, "t": round(w["t"] - meter.t0, 3)} for w in traffic.waits])
    return meter.rates(), meter.subflows


# subflow traces of the runs of one experiment (option trace=1), in run order
TRACES: list[list[dict]] = []
# when each run's clock (its samples' t = 0) started, Unix time: to line the
# samples up with logs and kernel traces taken outside the experiment
RUN_T0S: list[float] = []
# each run's senders' connections (DATA_ACK values, from ss -M), for ktrace
CONNECTIONS: list[dict[str, list[int]]] = []
# each run's send() calls that waited >= flowgen.WAIT_LOG_S (t from the run's start)
SENDER_WAITS: list[list[dict]] = []


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


def run(cfg: Config, out_dir: Path) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    topo = builders.bgwc_testbed(link_mbps=cfg.link_mbps, mtu=cfg.mtu, queue_bytes=int(cfg.queue_kb * 1000))
    topo.save(out_dir / "topology.json")
    report: dict = {"config": asdict(cfg), "scale": f"{cfg.link_mbps:g} Mb/s links for the paper's "
                    f"{PAPER_LINK:g}: rates x{cfg.scale:g}; U = {cfg.unit_mbps:g} Mb/s"}
    # second line of enforcement: ToR meters at the guarantees (+5 % so that a
    # host's own HTB-shaped BG never meets the policer)
    meters = {s: round(r * cfg.scale * METER_HEADROOM, 3) for s, r in zip(SENDERS, (350, 250, 200, 100))}
    env = {"BWFABRIC_PRIO_QUEUES": json.dumps({"guarantees_mbps": meters})} if cfg.kind in (
        "fig12", "fig13", "adversarial") else None
    report["meters_mbps"] = meters if env else None
    with BpfLoaded(), Fabric(topo, of_port=cfg.of_port, queues="tc", wc_aqm=cfg.wc_aqm) as fab, \
            ControllerProcess(out_dir / "topology.json", ["single_path", "prio_queues"], cfg.of_port,
                              out_dir / "controller.log", env=env), \
            Agents(fab, out_dir / "agents") as agents:
        fab.wait_routes(60)
        report["warnings"] = list(fab.warnings)
        TRACES.clear()
        RUN_T0S.clear()
        CONNECTIONS.clear()
        SENDER_WAITS.clear()
        drops_before = ovs.packet_socket_drops() or 0
        fixes_before, cuts_before = cc.repairs(), cc.mark_cuts()
        ktrace_path = out_dir / "ktrace.txt.gz"
        with (ktrace.KernelTrace(ktrace_path) if cfg.ktrace else contextlib.nullcontext()):
            report.update(KIND_RUNNERS[cfg.kind](fab, agents, cfg))
        # corrupt WC thresholds/windows bwf_wc put right (see its source)
        report["wc_cc_repairs"] = {k: v - fixes_before[k] for k, v in cc.repairs().items()}
        # WC windows cut again for ECN marks beyond a reduction's first
        report["wc_mark_cuts"] = {k: v - cuts_before[k] for k, v in cc.mark_cuts().items()}
        # packets the emulator itself lost (OVS did not read a port in time):
        # every class alike, so a run with any is not a faithful one
        report["emulator_drops"] = (ovs.packet_socket_drops() or 0) - drops_before
        if report["emulator_drops"]:
            report["warnings"].append(f"ovs-vswitchd dropped {report['emulator_drops']} packets on its port "
                                      "sockets (not read in time): the emulation was overloaded")
        report["run_t0_epoch"] = list(RUN_T0S)
        # an application asleep in send() gives its connection no data: BG runs dry without any stall
        report["sender_waits"] = [{"run": i, **w} for i, ws in enumerate(SENDER_WAITS) for w in ws]
        if cfg.ktrace:
            # a connection's DATA_ACK standing still >= 0.3 s with data outstanding: a hole holding BG back
            try:
                lost = ktrace.overwritten(ktrace_path)
                if lost:
                    report["warnings"].append(f"ktrace: the kernel's trace buffer overwrote {lost} events: "
                                              "stalls early in the run may be missing")
                report["connection_stalls"] = ktrace.report(ktrace.read(ktrace_path), RUN_T0S, CONNECTIONS,
                                                            {h: topo.host(h).ip for h in SENDERS})
            except (ktrace.KtraceError, OSError) as exc:    # the run's figures stand without it
                report["warnings"].append(f"ktrace: no connection stalls: {exc}")
        if cfg.trace:
            report["subflow_traces"] = list(TRACES)
        if env:
            report["meter_drops"] = meter_drops(topo)
    R.write_json(out_dir / "results.json", report)
    plot(report, out_dir / "results.png")
    for line in share_spread_lines(report):
        print(line)
    print(json.dumps(report.get("verdict", {}), indent=1))
    print(f"\nresults: {out_dir / 'results.json'}  plot: {out_dir / 'results.png'}")
    return report


def share_spread_lines(report: dict) -> list[str]:
    """Table 3 / Figs. 14-15: per row, the error of the mean shares, the
    spread of single runs' errors, and each run's lowest BG / guarantee."""
    rows = report.get("rows") or report.get("runs") or []
    lines = []
    for r in rows:
        if not isinstance(r, dict) or "run_errors" not in r:
            continue
        name = r.get("row") or f"{r.get('conns')} conns, {r.get('policy')}"
        errs = [e for e in r["run_errors"] if e is not None]
        g = r.get("guarantees") or {}
        bg_min = [min((run["bg"][s] / g[s] for s in g if g.get(s)), default=None) for run in r.get("runs", [])]
        bg_min = [b for b in bg_min if b is not None]
        lines.append(f"{name}: error of the mean {r['max_rel_error']:.3f}; single runs "
                     f"{min(errs, default=float('nan')):.3f}..{max(errs, default=float('nan')):.3f}"
                     + (f"; BG/guarantee per run min {min(bg_min):.3f}" if bg_min else ""))
    return lines


def _configure(agents: Agents, cfg: Config, guarantees: dict[str, float], policy: str = "guarantee",
               explicit: dict[str, float] | None = None, wc_subflows: int | None = None) -> None:
    for h in PAIR.values():   # receivers: endpoints for the joins; their BG is the BG subflows' ACKs
        agents.configure(h, guarantee_mbps=cfg.link_mbps, wc_subflows=cfg.wc_subflows, policy="equal",
                         beta=cfg.beta, stale_loss_cnt=cfg.stale_loss_cnt, rto_min_ms=cfg.rto_min_ms or None,
                         ecn=cfg.ecn, pace_bg=cfg.pace_bg, **_rcvbuf(cfg))
    for snd, g in guarantees.items():
        extra = {"competition": explicit[snd]} if explicit and snd in explicit else {}
        agents.configure(snd, guarantee_mbps=g, wc_subflows=wc_subflows or cfg.wc_subflows,
                         policy="explicit" if extra else policy, unit_mbps=cfg.unit_mbps, beta=cfg.beta,
                         stale_loss_cnt=cfg.stale_loss_cnt, rto_min_ms=cfg.rto_min_ms or None, ecn=cfg.ecn,
                         pace_bg=cfg.pace_bg, **_rcvbuf(cfg), **extra)


def _rcvbuf(cfg: Config) -> dict:
    return {k: v for k, v in (("rcvbuf_initial_kb", cfg.rcvbuf_initial_kb), ("rtt_hint_ms", cfg.rtt_hint_ms)) if v}


def _fig12(fab: Fabric, agents: Agents, cfg: Config) -> dict:
    g = {s: r * cfg.scale for s, r in zip(SENDERS, (350, 250, 200, 100))}
    _configure(agents, cfg, g)
    half = cfg.duration / 2
    udp_mbps = 0.05 * cfg.link_mbps

    def scenario(traffic: Traffic) -> None:
        for s in SENDERS:
            traffic.bulk(s, cfg.duration)
        time.sleep(half)
        for s in SENDERS:
            traffic.udp(s, udp_mbps, half)
        time.sleep(half)
    rates, subflows = _measured(fab, cfg, scenario)
    phases = {"tcp": (3.0, half), "tcp+udp": (half + 3.0, cfg.duration)}
    table = {}
    for name, (a, b) in phases.items():
        table[name] = {s: {"guarantee": g[s], "bg": window_mean(rates, f"bg-{s}", a, b),
                           "wc": window_mean(rates, f"wc-{s}", a, b), "udp": window_mean(rates, f"udp-{s}", a, b)}
                       for s in SENDERS}
    verdict = {}
    for name, rows in table.items():
        held = {s: (r["bg"] + r["udp"]) / r["guarantee"] for s, r in rows.items()}
        used = sum(r["bg"] + r["wc"] + r["udp"] for r in rows.values()) / cfg.link_mbps
        verdict[name] = {"min_bg_of_guarantee": min(held.values()), "link_use": used,
                         "bg_of_guarantee": held}
    return {"rates": rates, "subflows": subflows, "phases": table, "verdict": verdict}


def _fig13(fab: Fabric, agents: Agents, cfg: Config) -> dict:
    g = {s: r * cfg.scale for s, r in zip(SENDERS, (350, 250, 200, 100))}
    _configure(agents, cfg, g)
    total = cfg.stop_at + cfg.stop_s + 15.0

    def scenario(traffic: Traffic) -> None:
        for s in SENDERS:
            traffic.bulk(s, total)
        time.sleep(cfg.stop_at)
        traffic.stop("s2")
        time.sleep(cfg.stop_s)
        traffic.bulk("s2", total)
        time.sleep(15.0)
    rates, subflows = _measured(fab, cfg, scenario)
    return {"rates": rates, "subflows": subflows,
            "verdict": fig13_verdict(rates, cfg.stop_at, cfg.stop_at + cfg.stop_s, g["s2"], cfg.link_mbps)}


def _regained(series: list[dict], t_back: float, floor: float) -> float | None:
    """Seconds after ``t_back`` of the first sample from which S2's BG stays
    >= ``floor`` for 2 s (None: never)."""
    for i, r in enumerate(series):
        hold = [x for x in series[i:] if x["t"] <= r["t"] + 2.0]
        if hold and hold[-1]["t"] >= r["t"] + 1.5 and all(x.get("bg-s2", 0) >= floor for x in hold):
            return r["t"] - t_back
    return None


def fig13_verdict(rates: list[dict], t_stop: float, t_back: float, s2_guarantee: float, link_mbps: float) -> dict:
    """What S2 freed (its BG+WC over the 5 s before it stops), how much of
    it the others' WC took 2 s after the stop (their WC rise over [+2, +3] s),
    and S2's return: the first sample from which its BG stays >= 97 % of its
    guarantee for 2 s (per 0.5 s sample, and on 1 s means), and its mean BG
    over [+2, +4] s."""
    others = [s for s in SENDERS if s != "s2"]
    freed = sum(window_mean(rates, f"{c}-s2", t_stop - 5, t_stop) for c in ("bg", "wc", "udp"))
    wc_before = sum(window_mean(rates, f"wc-{s}", t_stop - 5, t_stop) for s in others)
    wc_after = sum(window_mean(rates, f"wc-{s}", t_stop + 2, t_stop + 3) for s in others)
    link_after = sum(window_mean(rates, f"{c}-{s}", t_stop + 2, t_stop + 3) for s in others
                     for c in ("bg", "wc", "udp")) / link_mbps
    back = [r for r in rates if r["t"] > t_back]
    # also on 1 s means: a 0.5 s sample of a 25 Mb/s flow varies by +-4 %
    # with the bursts packets arrive in (pairs like 0.956 / 1.024 of the guarantee)
    smooth = [{"t": r["t"], "bg-s2": window_mean(rates, "bg-s2", r["t"] - 1.0, r["t"])} for r in back
              if r["t"] - 1.0 >= t_back]
    return {"freed_mbps": freed, "others_wc_before": wc_before, "others_wc_2s_after": wc_after,
            "captured_fraction_2s": (wc_after - wc_before) / freed if freed else None,
            "link_use_2s_after_stop": link_after,
            "s2_regained_97pct_after_s": _regained(back, t_back, 0.97 * s2_guarantee),
            "s2_regained_97pct_1s_means_after_s": _regained(smooth, t_back, 0.97 * s2_guarantee),
            "s2_bg_2_to_4s_after_restart_of_guarantee": window_mean(rates, "bg-s2", t_back + 2, t_back + 4)
            / s2_guarantee}


def _repeated(fab: Fabric, cfg: Config, scenario, senders: tuple[str, ...]) -> dict:
    """``scenario`` measured ``cfg.reps`` times: each run's BG and WC per
    sender (means from 5 s in), and their mean over the runs."""
    runs = []
    for _ in range(cfg.reps):
        rates, subflows = _measured(fab, cfg, scenario)
        runs.append({"wc": {s: window_mean(rates, f"wc-{s}", 5.0, cfg.duration) for s in senders},
                     "bg": {s: window_mean(rates, f"bg-{s}", 5.0, cfg.duration) for s in senders},
                     "subflows": subflows})
        time.sleep(2.0)
    mean = {c: {s: sum(r[c][s] for r in runs) / len(runs) for s in senders} for c in ("wc", "bg")}
    return {**mean, "runs": runs}


def _table3(fab: Fabric, agents: Agents, cfg: Config) -> dict:
    rows = []
    for row in TABLE3_ROWS:
        g = {s: (r or 0) * cfg.scale for s, r in zip(SENDERS[:3], row)}
        explicit = {s: (0.0 if r is None else r * cfg.scale / cfg.unit_mbps) for s, r in zip(SENDERS[:3], row)}
        _configure(agents, cfg, g, explicit=explicit)
        active = [s for s, r in zip(SENDERS[:3], row) if r is not None]     # "off": that VM does not send
        got = _repeated(fab, cfg, lambda t: ([t.bulk(s, cfg.duration) for s in active], time.sleep(cfg.duration)),
                        SENDERS[:3])
        a_l = {s: explicit[s] for s in SENDERS[:3]}
        rows.append({"row": row, "guarantees": g, "a_l": a_l, "bg": got["bg"], "wc": got["wc"],
                     "max_rel_error": share_error(got["wc"], a_l),
                     "run_errors": [share_error(r["wc"], a_l) for r in got["runs"]], "runs": got["runs"]})
    return {"rows": rows, "verdict": {"max_rel_error": max(r["max_rel_error"] or 9 for r in rows)}}


def _fig14(fab: Fabric, agents: Agents, cfg: Config) -> dict:
    out = []
    senders = ("s1", "s3", "s4")
    for conns in cfg.conns:
        for policy in cfg.policies:
            g = {s: FIG14_GUARANTEE * cfg.scale for s in senders}
            if policy == "none":
                # no fairness policy: every WC subflow a plain Reno (A_l = K keeps alpha_w = 1)
                explicit = {"s1": float(conns), "s3": 1.0, "s4": 1.0}
                _configure(agents, cfg, g, explicit=explicit)
            else:
                _configure(agents, cfg, g, explicit={s: cfg.equal_level for s in senders})

            def scenario(traffic: Traffic, conns: int = conns) -> None:
                traffic.bulk("s1", cfg.duration, conns=conns)
                for s in ("s3", "s4"):
                    traffic.bulk(s, cfg.duration)
                time.sleep(cfg.duration)
            got = _repeated(fab, cfg, scenario, senders)
            want = ({"s1": conns / (conns + 2), "s3": 1 / (conns + 2), "s4": 1 / (conns + 2)} if policy == "none"
                    else {s: 1 / 3 for s in senders})
            out.append({"conns": conns, "policy": policy, "wc": got["wc"], "bg": got["bg"], "expected_share": want,
                        "max_rel_error": share_error(got["wc"], want),
                        "run_errors": [share_error(r["wc"], want) for r in got["runs"]], "runs": got["runs"]})
    return {"runs": out, "verdict": {"max_rel_error": max(r["max_rel_error"] or 9 for r in out)}}


ATTACK_LEAD_S = 5.0


def _adversarial(fab: Fabric, agents: Agents, cfg: Config) -> dict:
    """s4 runs no agent configuration at all (an adversary would not): no
    host limit, no marking of its own choosing but its own.

    The honest senders start ``ATTACK_LEAD_S`` before the first attack, and
    each attack (``duration`` / 3) is judged over all of it, from its first
    sample: what an attack does to guarantees already in force. Judging
    from 3 s after everything started together (as before) mixed the
    honest connections' own start-up into the first attack's figure -- the
    runs that missed did so 3-4 s after start -- and skipped each attack's
    first 3 s."""
    g = {s: r * cfg.scale for s, r in zip(SENDERS, (350, 250, 200, 100))}
    _configure(agents, cfg, {s: g[s] for s in SENDERS[:3]})
    third = cfg.duration / 3

    def scenario(traffic: Traffic) -> None:
        for s in SENDERS[:3]:
            traffic.bulk(s, ATTACK_LEAD_S + cfg.duration)
        time.sleep(ATTACK_LEAD_S)
        # s4: UDP at the whole link rate, first marked BG (ToS 0x00), then EF (0xb8)
        traffic.udp("s4", cfg.link_mbps, third, tos=TOS_BG)
        time.sleep(third)
        traffic.udp("s4", cfg.link_mbps, third, tos=0xB8)
        time.sleep(third)
        traffic.bulk("s4", third, conns=4)   # and TCP from many connections
        time.sleep(third)
    rates, subflows = _measured(fab, cfg, scenario)
    held = {}
    for i, attack in enumerate(("udp-bg", "udp-ef", "tcp-many")):
        a, b = ATTACK_LEAD_S + i * third, ATTACK_LEAD_S + (i + 1) * third
        held[attack] = {s: window_mean(rates, f"bg-{s}", a, b) / g[s] for s in SENDERS[:3]}
    return {"rates": rates, "subflows": subflows, "attack_lead_s": ATTACK_LEAD_S,
            "verdict": {"min_bg_of_guarantee": min(min(v.values()) for v in held.values()), "bg_of_guarantee": held}}


SCHED_VARIANTS = ("default", "backup", "toggle")
PACED_OF_GUARANTEE = 0.9


def _tc_backlog(fab: Fabric, host: str, classid: str) -> int:
    res = fab.run_in(host, "tc", "-s", "class", "show", "dev", f"{host}-eth0", "classid", classid)
    m = re.search(r"backlog (\d+)b", res.stdout)
    return int(m.group(1)) if m else 0


def _set_backup(fab: Fabric, receiver: str, backup: bool) -> None:
    """The receiver's join endpoint as backup or not: the kernel tells the
    sender (MP_PRIO), whose scheduler then uses the WC subflow only when no
    other subflow can send."""
    ep = str(ENDPOINT_ID_BASE + 1)
    res = fab.run_in(receiver, "ip", "mptcp", "endpoint", "change", "id", ep, "backup" if backup else "nobackup")
    if res.returncode != 0:
        raise RuntimeError(f"{receiver}: ip mptcp endpoint change id {ep}: {res.stderr.strip()}")


class BackupToggler:
    """Backup-flag toggling driven by the sender's BG class: while BG has a
    standing queue in its HTB class (it is at its guarantee and there is
    more to send) WC is enabled; once that queue is gone for ``idle_n``
    samples, WC goes back to backup so that BG carries everything it can.
    Observes the sender, acts on the receiver's endpoint -- the controller's
    place in a deployment."""

    def __init__(self, fab: Fabric, sender: str, receiver: str, period_s: float = 0.1, busy_n: int = 3,
                 idle_n: int = 5):
        self.fab, self.sender, self.receiver = fab, sender, receiver
        self.period_s, self.busy_n, self.idle_n = period_s, busy_n, idle_n
        self.backup = True
        self.toggles = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> "BackupToggler":
        _set_backup(self.fab, self.receiver, True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        recent: list[bool] = []
        while not self._stop.wait(self.period_s):
            recent = (recent + [_tc_backlog(self.fab, self.sender, CLASS_BG) > 0])[-max(self.busy_n, self.idle_n):]
            want = decide_backup(self.backup, recent, self.busy_n, self.idle_n)
            if want != self.backup:
                _set_backup(self.fab, self.receiver, want)
                self.backup, self.toggles = want, self.toggles + 1
                recent = []

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)


def decide_backup(backup: bool, recent: list[bool], busy_n: int, idle_n: int) -> bool:
    """Pure rule of :class:`BackupToggler`: ``recent`` says, newest last,
    whether BG had a standing queue at each sample."""
    if backup and sum(recent[-busy_n:]) >= busy_n:
        return False
    if not backup and len(recent) >= idle_n and not any(recent[-idle_n:]):
        return True
    return backup


def _sched(fab: Fabric, agents: Agents, cfg: Config) -> dict:
    """The paper's Fig. 5 problem: on an idle path the default scheduler
    puts part of a connection on WC even when BG could carry all of it.
    One sender (S1, guarantee 350 of 1000 scaled), alone; the application
    either paced at 90 % of the guarantee or backlogged."""
    g = 350 * cfg.scale
    _configure(agents, cfg, {"s1": g})
    runs = []
    for variant in SCHED_VARIANTS:
        for demand in ("paced", "backlogged"):
            rate = PACED_OF_GUARANTEE * g if demand == "paced" else None
            _set_backup(fab, "s5", variant == "backup")
            toggler = BackupToggler(fab, "s1", "s5") if variant == "toggle" else None

            def scenario(traffic: Traffic, rate: float | None = rate, toggler=toggler) -> None:
                if toggler:
                    toggler.start()
                traffic.bulk("s1", cfg.duration, rate_mbps=rate)
                time.sleep(cfg.duration)
            try:
                rates, subflows = _measured(fab, cfg, scenario)
            finally:
                if toggler:
                    toggler.stop()
                _set_backup(fab, "s5", False)
            bg, wc = (window_mean(rates, f"{c}-s1", 3.0, cfg.duration) for c in ("bg", "wc"))
            runs.append({"variant": variant, "demand": demand, "app_mbps": rate, "bg": bg, "wc": wc,
                         "bg_share_of_traffic": bg / (bg + wc) if bg + wc else None,
                         "bg_of_guarantee": bg / g, "link_use": (bg + wc) / cfg.link_mbps,
                         "toggles": toggler.toggles if toggler else 0, "subflows": subflows})
    verdict = {}
    for variant in SCHED_VARIANTS:
        paced = next(r for r in runs if r["variant"] == variant and r["demand"] == "paced")
        full = next(r for r in runs if r["variant"] == variant and r["demand"] == "backlogged")
        verdict[variant] = {"paced_bg_share": paced["bg_share_of_traffic"],
                            "backlogged_bg_of_guarantee": full["bg_of_guarantee"],
                            "backlogged_link_use": full["link_use"]}
    verdict["best"] = sched_best(verdict)
    return {"runs": runs, "verdict": verdict}


def sched_best(verdict: dict, margin: float = 0.02) -> str:
    """The variant whose worst of (BG's share of a paced demand, BG of its
    guarantee and link use when backlogged) is highest; the simplest one
    (in SCHED_VARIANTS order) unless another is better by more than
    ``margin`` -- a toggling loop must earn its keep."""
    score = {v: min(verdict[v]["paced_bg_share"] or 0, verdict[v]["backlogged_link_use"],
                    verdict[v]["backlogged_bg_of_guarantee"]) for v in SCHED_VARIANTS}
    top = max(score.values())
    return next(v for v in SCHED_VARIANTS if score[v] >= top - margin)


KIND_RUNNERS = {"fig12": _fig12, "fig13": _fig13, "table3": _table3, "fig14": _fig14, "adversarial": _adversarial,
                "sched": _sched}


def plot(report: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = report.get("rates")
    fig, ax = plt.subplots(figsize=(10, 4.2))
    if rates:
        ts = [r["t"] for r in rates]
        for s in SENDERS:
            for cls, ls in (("bg", "-"), ("wc", "--"), ("udp", ":")):
                ys = [r.get(f"{cls}-{s}", 0.0) for r in rates]
                if any(y > 0.05 for y in ys):
                    ax.plot(ts, ys, ls, lw=1, label=f"{s} {cls}")
        ax.set_xlabel("time (s)")
        ax.set_ylabel("Mb/s at the receiver")
    elif report["config"]["kind"] == "sched":
        runs = report["runs"]
        xs = range(len(runs))
        ax.bar(xs, [r["bg"] for r in runs], 0.6, label="S1 BG")
        ax.bar(xs, [r["wc"] for r in runs], 0.6, bottom=[r["bg"] for r in runs], label="S1 WC")
        g = 350 * report["config"]["link_mbps"] / PAPER_LINK
        ax.axhline(g, color="k", lw=0.8, ls=":", label="guarantee")
        ax.set_xticks(list(xs), [f"{r['variant']}\n{r['demand']}" for r in runs], fontsize=7)
        ax.set_ylabel("Mb/s at the receiver")
    else:
        rows = report.get("rows") or report.get("runs") or []
        labels = [str(r.get("row", (r.get("conns"), r.get("policy")))) for r in rows]
        for i, s in enumerate(("s1", "s2", "s3", "s4")):
            vals = [r["wc"].get(s, 0.0) for r in rows]
            if any(vals):
                ax.bar([j + i * 0.2 for j in range(len(rows))], vals, 0.2, label=f"{s} WC")
        ax.set_xticks(range(len(rows)), labels, fontsize=7)
        ax.set_ylabel("WC Mb/s")
    ax.set_title(f"BG/WC {report['config']['kind']} ({report['scale']})")
    ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
