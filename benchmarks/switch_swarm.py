"""A swarm of OpenFlow 1.3 switches against one real bwfabric controller
(issue #34 §3): how many switches one controller serves with LESSOR
polling its ToRs at the minimum period before Algorithm 1 stretches the
period, and how many flow-mods per second it installs.

The controller is the product's own process (``bwfabric controller
--config``, LESSOR routing, the polling period starting at its minimum),
listening on a free port. The switches are this module's: one asyncio
process, one TCP connection per switch of a k fat-tree, speaking the
OpenFlow 1.3 wire protocol a switch speaks to a controller -- HELLO,
FEATURES_REPLY with the topology's datapath id, PORT_DESC with its ports
(all up), ECHO, BARRIER, ROLE and GET_CONFIG replies, and multipart replies
to FLOW and PORT_STATS requests. A ToR answers a flow-statistics request
with the accounting entries of ``flows_per_tor`` TCP flows from its hosts
(``benchmarks.flow_stats``: the bytes a switch sends), a tenth of them
elephants at 10 % of a host link each, their counters growing with time;
so PRE sees long flows, PMPT places them and the controller installs
their paths. Flow, group and meter mods are counted as they arrive.

Why not many OVS bridges: each ovs-vswitchd bridge costs the switch side
far more CPU than the controller under test, and 320 bridges (k = 16) do
not fit beside a controller on two cores; a switch that only speaks the
protocol leaves the controller the machine's other core.

Printed per k: switches connected and handshaken, the time to connect them
all, the flow-mods (with groups and meters) received and their rate over
the busiest 5 s (the install burst as switches connect), each ToR's polling period (median and
90th percentile of the gaps between its flow-statistics requests, over the
run's last ``--window`` seconds; ToRs polled twice or more in it) against
the configured minimum, and the controller's CPU (one core = 1.0).

    python -m benchmarks.switch_swarm [--k 4 8 16] [--seconds 40] [--flows-per-tor 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import socket
import statistics
import struct
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from os_ken.ofproto import ofproto_v1_3 as ofp

from benchmarks.flow_stats import reply_bytes, tor_entries
from experiments import configs
from experiments.controller_proc import ControllerProcess
from controller.network_view import NetworkView
from mininet_topos.builders import fattree

HEADER = struct.Struct(ofp.OFP_HEADER_PACK_STR)
MP_HEADER = struct.calcsize(ofp.OFP_MULTIPART_REPLY_PACK_STR)
ELEPHANT_SHARE = 0.1        # of a ToR's flows: elephants at ELEPHANT_RATE of a host link
ELEPHANT_RATE = 0.1
MOUSE_BPS = 8_000           # the others: far below LESSOR's long-flow threshold


def message(msg_type: int, xid: int, body: bytes = b"") -> bytes:
    return HEADER.pack(ofp.OFP_VERSION, msg_type, HEADER.size + len(body), xid) + body


def multipart_reply(mp_type: int, xid: int, body: bytes = b"") -> bytes:
    return message(ofp.OFPT_MULTIPART_REPLY, xid, struct.pack(ofp.OFP_MULTIPART_REPLY_PACK_STR, mp_type, 0) + body)


@dataclass
class SwitchStats:
    connected_at: float | None = None
    handshaken_at: float | None = None       # its port description was asked for: os-ken's handshake is done
    mods: dict[str, int] = field(default_factory=lambda: {"flow": 0, "group": 0, "meter": 0})
    mod_times: list[float] = field(default_factory=list)
    polls: list[float] = field(default_factory=list)     # flow-statistics requests
    errors: int = 0                                       # OFPT_ERROR from the controller
    unknown: int = 0                                      # message types this switch does not speak


class Switch(asyncio.Protocol):
    """One switch: the replies listed in the module docstring, nothing
    else; every FLOW_MOD/GROUP_MOD/METER_MOD counted."""

    MODS = {ofp.OFPT_FLOW_MOD: "flow", ofp.OFPT_GROUP_MOD: "group", ofp.OFPT_METER_MOD: "meter"}

    def __init__(self, name: str, dpid: int, ports: list[int], entries=None, rates=None, link_bps: float = 10e6):
        self.name, self.dpid, self.ports = name, dpid, sorted(ports)
        self.entries, self.rates = entries or [], rates or []
        self.stats = SwitchStats()
        self.transport = None
        self.buf = b""
        self.t0 = time.monotonic()
        self.link_bps = link_bps

    def connection_made(self, transport):
        self.transport = transport
        self.stats.connected_at = time.monotonic()
        transport.write(message(ofp.OFPT_HELLO, 1))

    def connection_lost(self, exc):
        self.transport = None

    def data_received(self, data: bytes):
        self.buf += data
        while len(self.buf) >= HEADER.size:
            _, msg_type, length, xid = HEADER.unpack_from(self.buf)
            if length < HEADER.size:
                raise ValueError(f"{self.name}: OpenFlow message of length {length}")
            if len(self.buf) < length:
                return
            body, self.buf = self.buf[HEADER.size:length], self.buf[length:]
            self.handle(msg_type, xid, body)

    def handle(self, msg_type: int, xid: int, body: bytes) -> None:
        now = time.monotonic()
        out = None
        if msg_type in self.MODS:
            self.stats.mods[self.MODS[msg_type]] += 1
            self.stats.mod_times.append(now)
        elif msg_type == ofp.OFPT_HELLO or msg_type == ofp.OFPT_SET_CONFIG or msg_type == ofp.OFPT_ECHO_REPLY:
            pass
        elif msg_type == ofp.OFPT_ECHO_REQUEST:
            out = message(ofp.OFPT_ECHO_REPLY, xid, body)
        elif msg_type == ofp.OFPT_FEATURES_REQUEST:
            out = message(ofp.OFPT_FEATURES_REPLY, xid,
                          struct.pack(ofp.OFP_SWITCH_FEATURES_PACK_STR, self.dpid, 0, 254, 0, 0x0F, 0))
        elif msg_type == ofp.OFPT_GET_CONFIG_REQUEST:
            out = message(ofp.OFPT_GET_CONFIG_REPLY, xid, struct.pack(ofp.OFP_SWITCH_CONFIG_PACK_STR, 0, 128))
        elif msg_type == ofp.OFPT_BARRIER_REQUEST:
            out = message(ofp.OFPT_BARRIER_REPLY, xid)
        elif msg_type == ofp.OFPT_ROLE_REQUEST:
            out = message(ofp.OFPT_ROLE_REPLY, xid, body)
        elif msg_type == ofp.OFPT_MULTIPART_REQUEST:
            mp_type, _ = struct.unpack_from("!HH", body)
            out = self.multipart(mp_type, xid, now)
        elif msg_type == ofp.OFPT_ERROR:
            self.stats.errors += 1
        else:
            self.stats.unknown += 1
        if out is not None and self.transport is not None:
            self.transport.write(out)

    def multipart(self, mp_type: int, xid: int, now: float) -> bytes:
        if mp_type == ofp.OFPMP_PORT_DESC:
            self.stats.handshaken_at = self.stats.handshaken_at or now
            body = b"".join(struct.pack(ofp.OFP_PORT_PACK_STR, p, struct.pack("!IH", self.dpid & 0xFFFFFFFF, p),
                                        f"{self.name}-eth{p}".encode()[:15], 0, ofp.OFPPS_LIVE, 0, 0, 0, 0,
                                        10_000, 10_000) for p in self.ports)
            return multipart_reply(mp_type, xid, body)
        if mp_type == ofp.OFPMP_PORT_STATS:
            up = int(now - self.t0)
            sent = int((now - self.t0) * 1e6)
            body = b"".join(struct.pack(ofp.OFP_PORT_STATS_PACK_STR, p, sent // 1000, sent // 1000, sent, sent,
                                        0, 0, 0, 0, 0, 0, 0, 0, up, 0) for p in self.ports)
            return multipart_reply(mp_type, xid, body)
        if mp_type == ofp.OFPMP_FLOW:
            self.stats.polls.append(now)
            elapsed = now - self.t0
            entries = [(m, base + int(rate * elapsed / 8)) for (m, base), rate in zip(self.entries, self.rates)]
            return b"".join(reply_bytes(entries, xid=xid, seconds=int(elapsed)))
        return multipart_reply(mp_type, xid)      # an empty reply to what a fabric switch has none of


def switches_of(k: int, flows_per_tor: int, seed: int = 1) -> list[Switch]:
    topo = fattree(k)
    view = NetworkView(topo)
    rng = random.Random(seed)
    ports: dict[str, list[int]] = {s.name: [] for s in topo.switches}
    for lk in topo.links:
        for end, port in ((lk.a, lk.a_port), (lk.b, lk.b_port)):
            if end in ports:
                ports[end].append(port)
    out = []
    for s in sorted(topo.switches, key=lambda s: s.name):
        entries, rates = [], []
        if s.role == "edge":
            entries = [(m, 0) for m, _ in tor_entries(view, s.name, flows_per_tor, rng)]
            link_bps = min(lk.capacity_mbps for lk in topo.links if s.name in (lk.a, lk.b)) * 1e6
            rates = [ELEPHANT_RATE * link_bps if rng.random() < ELEPHANT_SHARE else MOUSE_BPS for _ in entries]
        out.append(Switch(s.name, s.dpid, ports[s.name], entries, rates))
    return out


def start_controller(k: int, workdir: Path, min_period_s: float,
                     log_level: str = "WARNING") -> tuple[ControllerProcess, int]:
    """The product's controller on a k fat-tree, LESSOR routing (and the
    priority queues), polling from its minimum period; (process, OpenFlow
    port) once it listens. The process samples its own CPU every second."""
    fattree(k).save(workdir / "topology.json")
    port = configs.free_port()
    conf = configs.write(workdir / "bwfabric.yaml", workdir / "topology.json", "lessor", port, prio_queues=True,
                         lessor={"polling": {"initial_s": min_period_s, "min_s": min_period_s, "max_s": 60.0}},
                         log_level=log_level)
    ctl = ControllerProcess(conf, workdir / "controller.log").start()
    deadline = time.monotonic() + 120                  # the PMPT kernels compile (or load) at start
    while time.monotonic() < deadline:
        if not ctl.alive():
            ctl.stop()
            raise RuntimeError("controller exited: " + (workdir / "controller.log").read_text()[-2000:])
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return ctl, port
        except OSError:
            time.sleep(0.2)
    ctl.stop()
    raise RuntimeError("the controller did not listen within 120 s")


async def _swarm(switches: list[Switch], port: int, seconds: float) -> None:
    loop = asyncio.get_running_loop()
    t0 = time.monotonic()
    for sw in switches:
        await loop.create_connection(lambda sw=sw: sw, "127.0.0.1", port)
    await asyncio.sleep(max(0.0, seconds - (time.monotonic() - t0)))
    for sw in switches:
        if sw.transport is not None:
            sw.transport.close()


def _quantile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def run(k: int, seconds: float = 40.0, flows_per_tor: int = 64, min_period_s: float = 0.5,
        window_s: float | None = None, log_to: Path | None = None) -> dict:
    """One swarm of a k fat-tree for ``seconds``; the polling periods are
    measured over the last ``window_s`` (default: the second half). With
    ``log_to``, the controller logs at INFO into that file."""
    window_s = seconds / 2 if window_s is None else window_s
    switches = switches_of(k, flows_per_tor)
    with tempfile.TemporaryDirectory(prefix="bwf-swarm-") as tmp:
        ctl, port = start_controller(k, Path(tmp), min_period_s, "INFO" if log_to else "WARNING")
        try:
            t_start = time.monotonic()
            asyncio.run(_swarm(switches, port, seconds))
            alive = ctl.alive()
            cpu = [c / 100.0 for _, c in ctl.cpu_samples]
        finally:
            ctl.stop()
        log_tail = (Path(tmp) / "controller.log").read_text()[-3000:]
        if log_to is not None:
            shutil.copy(Path(tmp) / "controller.log", log_to)
    st = [s.stats for s in switches]
    connected = [s.connected_at for s in st if s.connected_at is not None]
    handshaken = [s.handshaken_at for s in st if s.handshaken_at is not None]
    mod_times = sorted(t for s in st for t in s.mod_times)
    # mods/s: the busiest 5 s (the install burst as switches connect: routing's rules) and the last window's
    bins = [0] * (int(seconds) + 2)
    for t in mod_times:
        bins[min(len(bins) - 1, max(0, int(t - t_start)))] += 1
    peak5 = max((sum(bins[i:i + 5]) for i in range(max(1, len(bins) - 4))), default=0) / 5
    in_window = [t for t in mod_times if t >= t_start + seconds - window_s]
    cpu_window = cpu[-int(window_s):] if window_s >= 1 else []
    gaps = [b - a for sw in switches if sw.entries for a, b in zip(sw.stats.polls, sw.stats.polls[1:])
            if a >= t_start + seconds - window_s]
    tors = [sw for sw in switches if sw.entries]
    return {"k": k, "switches": len(switches), "tors": len(tors), "flows_per_tor": flows_per_tor,
            "connected": len(connected), "handshaken": len(handshaken),
            "connect_all_s": round(max(handshaken) - t_start, 3) if handshaken else None,
            "flow_mods": sum(s.mods["flow"] for s in st), "group_mods": sum(s.mods["group"] for s in st),
            "meter_mods": sum(s.mods["meter"] for s in st),
            "mods_per_s_peak5": peak5, "window_mods_per_s": round(len(in_window) / window_s, 1),
            "tors_polled": sum(1 for sw in tors if len([t for t in sw.stats.polls if t >= t_start + seconds - window_s]) >= 2),
            "window_s": window_s,
            "min_period_s": min_period_s,
            "period_median_s": None if not gaps else round(statistics.median(gaps), 3),
            "period_p90_s": None if not gaps else round(_quantile(gaps, 0.9), 3),
            "controller_cpu_median": None if not cpu else round(statistics.median(cpu), 3),
            "controller_cpu_window_median": None if not cpu_window else round(statistics.median(cpu_window), 3),
            "controller_alive": alive, "errors": sum(s.errors for s in st), "unknown": sum(s.unknown for s in st),
            "log_tail": log_tail if not alive or any(s.errors for s in st) else ""}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--flows-per-tor", type=int, default=64)
    ap.add_argument("--min-period", type=float, default=0.5)
    ap.add_argument("--log", type=Path, default=None, help="the controller's log (at INFO) copied here")
    ap.add_argument("--window", type=float, default=None, help="polling measured over the last WINDOW s "
                    "(default: the second half)")
    args = ap.parse_args(argv)
    print(f"{'k':>3} {'switches':>8} {'handshaken':>10} {'connect s':>9} {'mods':>7} {'peak mods/s':>11} "
          f"{'ToRs polled':>11} {'period med/p90 s':>16} {'mods/s':>7} {'ctl CPU':>7}  (last --window s: "
          "ToRs polled, their period, mods/s, controller CPU)")
    for k in args.k:
        r = run(k, args.seconds, args.flows_per_tor, args.min_period, args.window, args.log)
        per = f"{r['period_median_s']}/{r['period_p90_s']}"
        print(f"{k:>3} {r['switches']:>8} {r['handshaken']:>10} {r['connect_all_s']!s:>9} "
              f"{r['flow_mods'] + r['group_mods'] + r['meter_mods']:>7} {r['mods_per_s_peak5']:>11.0f} "
              f"{r['tors_polled']:>5} of {r['tors']:<3} {per:>16} {r['window_mods_per_s']:>7.0f} "
              f"{r['controller_cpu_window_median']!s:>7}", flush=True)
        print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
