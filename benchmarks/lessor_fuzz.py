"""LESSOR under a fuzzed OpenFlow event stream (issue #20): the real
``LessorApp`` -- its poll thread, its handlers fed with real os-ken event
and parser objects -- driving the fake network, while a second thread
throws at it what a hostile tenant and a broken fabric produce: spoofed
source addresses, link failures and recoveries, flow-stats replies from
unknown datapaths, absurd counters (2^64-1, going backwards, broadcast
addresses, missing fields), garbage echo replies, second connections with
a live switch's dpid, switch reconnects with wiped tables.

Prints, every ``report_s``, how many polls and allocations the app has
made: both must keep rising.

    python -m benchmarks.lessor_fuzz --minutes 10
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import struct
import tempfile
import threading
import time
from pathlib import Path

from os_ken.controller import ofp_event
from os_ken.ofproto import ofproto_protocol, ofproto_v1_3, ofproto_v1_3_parser as parser

from controller import ofmsg, pipeline
from bwtesting import readback
from bwtesting.fakenet import FakeNetwork
from mininet_topos import builders


class FuzzDatapath(ofproto_protocol.ProtocolDesc):
    """A switch connection as os-ken hands it to apps: every message the app
    sends is serialised (it must be valid on the wire), then dropped."""

    def __init__(self, dpid: int):
        super().__init__(ofproto_v1_3.OFP_VERSION)
        self.id = dpid
        self.is_active = True
        self.address = ("fuzz", dpid)
        self.xid = 0
        self.read_back: list = []     # the read-back requests not answered yet

    def set_xid(self, msg) -> int:
        self.xid += 1
        msg.set_xid(self.xid)
        return self.xid

    def send_msg(self, msg) -> None:
        if msg.xid is None:
            self.set_xid(msg)
        msg.serialize()
        if type(msg).__name__ in readback.READ_BACK:
            self.read_back.append(msg)

    def close(self) -> None:
        self.is_active = False


Msg = readback.Msg


def _flow_stats(match: dict, byte_count: int):
    return parser.OFPFlowStats(table_id=3, duration_sec=1, duration_nsec=0, priority=100, idle_timeout=10,
                               hard_timeout=0, flags=0, cookie=5 << 48, packet_count=1,
                               byte_count=byte_count, match=parser.OFPMatch(**match), instructions=[])


def _port(no: int, up: bool):
    state = 0 if up else ofproto_v1_3.OFPPS_LINK_DOWN
    return parser.OFPPort(no, "00:00:00:00:00:01", f"p{no}", 0, state, 0, 0, 0, 0, 0, 0)


def _set_env(values: dict[str, str | None]) -> None:
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


class Harness:
    def __init__(self, seed: int, workdir: Path):
        from apps.lessor.app import LessorApp

        topo = builders.fattree(4, link_mbps=10)
        topo.save(workdir / "topo.json")
        harness = self

        class FuzzedLessor(LessorApp):
            def send(self, switch, msgs):
                super().send(switch, msgs)            # serialised through ofsend, as for a switch
                if switch in self.datapaths:
                    harness.deliver(switch, msgs)

        self.rng = random.Random(seed)
        # the app reads its environment once, when it is made: set it for that
        # moment only (a test process goes on with its own)
        (workdir / "bwfabric.yaml").write_text(json.dumps({
            "fabric": {"topology": str(workdir / "topo.json")}, "controller": {"routing": "lessor"},
            "lessor": {"polling": {"min_s": 0.2, "initial_s": 0.5, "max_s": 1.0}}}))   # JSON is YAML
        env = {"BWFABRIC_CONFIG": str(workdir / "bwfabric.yaml")}
        saved = {k: os.environ.get(k) for k in env}
        try:
            _set_env(env)
            self.app = FuzzedLessor()
        finally:
            _set_env(saved)
        self.view = self.app.view
        self.net = FakeNetwork(self.view)
        self.net_lock = threading.Lock()
        self.dps = {sw: FuzzDatapath(self.view.dpid(sw)) for sw in self.view.switches}
        self.events = 0
        for sw, dp in self.dps.items():
            self.connect(sw, dp)
        self.uplinks = [(u, v) for u, v in self.view.graph.edges
                        if not self.view.is_host(u) and not self.view.is_host(v)
                        and self.view.graph.nodes[u]["layer"] < self.view.graph.nodes[v]["layer"]]
        self.elephants = [(f"h{i}", f"h{(i + 7) % 16 + 1}") for i in range(1, 17, 2)]

    # ---- the switches' side -------------------------------------------------------------
    def connect(self, switch: str, dp: FuzzDatapath) -> None:
        """A connection's features, then the switch's answers to the read-back."""
        self.app._switch_features(ofp_event.EventOFPSwitchFeatures(Msg(dp)))
        with self.net_lock:
            held = self.net.held(switch)
        requests, dp.read_back = dp.read_back, []
        readback.answer(self.app, dp, requests, held)

    def deliver(self, switch: str, msgs) -> None:
        replies = []
        with self.net_lock:
            for m in msgs:
                if isinstance(m, ofmsg.FlowStatsRequest):
                    body = [_flow_stats(match, b) for match, b in self.net.flow_stats(switch, m)]
                    replies.append(("stats", body))
                elif isinstance(m, ofmsg.EchoRequest):
                    replies.append(("echo", m.data))
                elif isinstance(m, (ofmsg.FlowMod, ofmsg.GroupMod, ofmsg.MeterMod)):
                    self.net.apply(switch, [m])
        dp = self.dps[switch]
        for kind, payload in replies:
            if kind == "stats":
                self.app._flow_stats(ofp_event.EventOFPFlowStatsReply(Msg(dp, body=payload)))
            else:
                self.app._echo_reply(ofp_event.EventOFPEchoReply(Msg(dp, data=payload)))

    # ---- the fuzzer ---------------------------------------------------------------------------
    def _traffic(self, pairs, packets: int, spoof: str | None = None, sport: int = 1000) -> None:
        # the fake fabric's links are up or down as the app's view says: a trace must not
        # interleave with the app changing it (a gathered port change is acted on from the
        # poll thread), so it holds the app's lock, then the network's (the order send() takes)
        with self.app.lock, self.net_lock:
            for src, dst in pairs:
                for _ in range(packets):
                    pkt = self.net.packet(src, dst, sport=sport, length=9000)
                    if spoof:
                        pkt["ipv4_src"] = spoof
                    self.net.trace(src, pkt)

    def step(self) -> None:
        r = self.rng
        self.events += 1
        kind = r.choice(["traffic", "traffic", "traffic", "spoof", "link", "stranger", "absurd", "echo",
                         "duplicate", "reconnect", "portdesc"])
        if kind == "traffic":
            pairs = r.sample(self.elephants, r.randint(1, len(self.elephants)))
            self._traffic(pairs, r.randint(1, 30))
            self._traffic([(f"h{r.randint(1, 16)}", f"h{r.randint(1, 16)}")], r.randint(1, 3),
                          sport=r.randint(2000, 60000))
        elif kind == "spoof":
            src, dst = r.choice(self.elephants)
            fake = r.choice(["10.99.0.1", "0.0.0.0", "255.255.255.255", "224.0.0.1",
                             self.view.ip(f"h{r.randint(1, 16)}")])
            self._traffic([(src, dst)], r.randint(1, 30), spoof=fake, sport=r.randint(1, 65535))
        elif kind == "link":
            u, v = r.choice(self.uplinks)
            up = r.random() < 0.6
            dp = self.dps[u]
            msg = Msg(dp, reason=ofproto_v1_3.OFPPR_MODIFY, desc=_port(self.view.port(u, v), up))
            self.app._port_status(ofp_event.EventOFPPortStatus(msg))
        elif kind == "stranger":
            dp = FuzzDatapath(r.randint(10_000, 2**40))
            if r.random() < 0.5:
                self.app._switch_features(ofp_event.EventOFPSwitchFeatures(Msg(dp)))
            match = dict(eth_type=0x800, ip_proto=6, in_port=1, ipv4_src="10.0.0.1", ipv4_dst="10.0.0.16",
                         tcp_src=1, tcp_dst=2)
            self.app._flow_stats(ofp_event.EventOFPFlowStatsReply(Msg(dp, body=[_flow_stats(match, 10**6)])))
        elif kind == "absurd":
            tor = r.choice([sw for sw in self.view.switches if sw.startswith("e")])
            ip = lambda: r.choice(["10.0.0.1", "10.0.0.16", "255.255.255.255", "0.0.0.0", "10.0.0.9"])  # noqa: E731
            match = r.choice([
                dict(eth_type=0x800, ip_proto=6, in_port=r.randint(1, 4), ipv4_src=ip(), ipv4_dst=ip(),
                     tcp_src=r.randint(0, 65535), tcp_dst=r.randint(0, 65535)),
                dict(eth_type=0x800, ip_proto=17, ipv4_src=ip(), udp_src=1),
                dict(eth_type=0x800, ip_proto=1, ipv4_src=ip(), ipv4_dst=ip()),
                dict(eth_type=0x806),
            ])
            count = r.choice([0, 1, 2**64 - 1, 2**63, r.randint(0, 10**12)])
            self.app._flow_stats(ofp_event.EventOFPFlowStatsReply(Msg(self.dps[tor],
                                                                      body=[_flow_stats(match, count)])))
        elif kind == "echo":
            data = r.choice([struct.pack("!d", math.nan), struct.pack("!d", math.inf), b"", b"\x00" * 9,
                             struct.pack("!d", time.monotonic() + 100), struct.pack("!d", -1e308),
                             bytes(r.getrandbits(8) for _ in range(8))])
            self.app._echo_reply(ofp_event.EventOFPEchoReply(Msg(r.choice(list(self.dps.values())), data=data)))
        elif kind == "duplicate":
            sw = r.choice(list(self.dps))
            self.app._switch_features(ofp_event.EventOFPSwitchFeatures(Msg(FuzzDatapath(self.view.dpid(sw)))))
        elif kind == "reconnect":
            sw = r.choice(list(self.dps))
            old = self.dps[sw]
            old.close()
            self.app._disconnected(ofp_event.EventOFPStateChange(old))
            fate = r.random()
            with self.net_lock:
                if fate < 0.4:         # a restarted switch comes back with empty tables
                    self.net.restart(sw)
                elif fate < 0.7:       # or holding junk besides what it had (read back, reconciled)
                    self._junk(self.net.switches[sw])
            new = FuzzDatapath(self.view.dpid(sw))   # or a lost connection: the tables stay
            self.dps[sw] = new
            self.connect(sw, new)
        elif kind == "portdesc":
            sw = r.choice(list(self.dps))
            ports = [_port(r.choice([1, 2, 3, 4, 99, 0xFFFFFFFE]), r.random() < 0.8) for _ in range(3)]
            self.app._port_desc(ofp_event.EventOFPPortDescStatsReply(Msg(self.dps[sw], body=ports)))

    def _junk(self, s) -> None:
        """Entries, groups and meters no controller of this run installed:
        routing's and LESSOR's cookies, another app's, any priority, groups
        of any type and bucket, meters in either app's range."""
        r = self.rng
        for _ in range(r.randint(1, 6)):
            match = ofmsg.Match.of(eth_type=0x800, ipv4_dst=f"10.{r.randint(0, 255)}.0.{r.randint(0, 255)}")
            s.apply(ofmsg.flow_add(pipeline.TABLE_FORWARD, r.choice([7, 100, 200, 300, 1000]), match,
                                   [ofmsg.Output(r.randint(1, 4))],
                                   cookie=pipeline.cookie(r.choice([pipeline.APP_ROUTING, pipeline.APP_LESSOR, 9]))))
        for _ in range(r.randint(0, 3)):
            gid = r.randint(1, 40)
            if gid not in s.groups:
                ports = [r.randint(1, 4) for _ in range(r.randint(1, 4))]
                s.apply(ofmsg.group_select(gid, ports) if r.random() < 0.7 else ofmsg.GroupMod(
                    "add", "all", gid, (ofmsg.Bucket(tuple(ofmsg.Output(p) for p in ports)),)))
        for _ in range(r.randint(0, 2)):
            mid = r.choice([r.randint(1, 64), r.randint(pipeline.METER_LESSOR_BASE, pipeline.METER_LESSOR_BASE + 50)])
            if mid not in s.meters:
                s.apply(ofmsg.MeterMod("add", mid, r.randint(1, 10**6), 100))

    def counters(self) -> dict:
        lessor = self.app.lessor
        return {"polls": self.app.polls, "allocations": lessor.allocations,
                "allocations_skipped": lessor.allocations_skipped, "events": self.events,
                "untrusted": lessor.untrusted, "round_errors": sum(s.errors for s in self.app.guard.stats.values()),
                "refused": sum(self.app.refused.values())}


def run(seconds: float, seed: int = 1, report_s: float = 10.0, out=print) -> list[dict]:
    """Fuzz for ``seconds``; returns a counters sample per report."""
    with tempfile.TemporaryDirectory() as tmp:
        h = Harness(seed, Path(tmp))
        poller = threading.Thread(target=h.app._poll_loop, daemon=True)
        poller.start()
        t0 = time.monotonic()
        samples: list[dict] = []
        next_report = t0 + report_s
        try:
            while time.monotonic() - t0 < seconds:
                h.step()
                time.sleep(h.rng.uniform(0.0, 0.01))
                if time.monotonic() >= next_report:
                    sample = {"t": round(time.monotonic() - t0, 1), **h.counters(), "alive": poller.is_alive()}
                    samples.append(sample)
                    out(json.dumps(sample))
                    next_report += report_s
        finally:                            # the poll thread ends with the run (a test process goes on)
            h.app.poll_stop.set()
            poller.join(10)
        errors = {k: v for k, v in h.app.guard.as_dict().items() if v["errors"]}
        if errors:
            out("rounds that raised (logged, counted, survived): " + json.dumps(
                {k: (v["errors"], v["last_error"]) for k, v in errors.items()}))
        return samples


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--report-s", type=float, default=30.0)
    args = ap.parse_args()
    samples = run(args.minutes * 60, args.seed, args.report_s)
    rising = all(b["polls"] > a["polls"] and b["allocations"] > a["allocations"]
                 for a, b in zip(samples, samples[1:]))
    print(f"polls and allocations rose in every interval: {rising}; "
          f"{samples[-1]['polls']} polls, {samples[-1]['allocations']} allocations, "
          f"{samples[-1]['events']} fuzz events")
    return 0 if rising and samples[-1]["alive"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
