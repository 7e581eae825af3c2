"""How fast LESSOR takes in a ToR's flow statistics, on one core, with
real os-ken message objects (issue #34 §3): a ToR's OFPFlowStatsReply of N
accounting entries as the switch sends it (bytes on the wire), parsed by
os-ken's OpenFlow 1.3 parser (what the controller's datapath does with
every reply), turned into (match, byte count) pairs as the app does
(``apps.lessor.app``), and fed to PRE (``LessorLogic.flow_stats``: trust
checks, the flow table, elephant detection). Prints entries/s for each
stage and for the whole, on FatTrees of growing k (goal: >= 50 k entries/s),
beside os-ken's own entry parser on the same bytes.

    python -m benchmarks.flow_stats [--k 8 16] [--entries 1000 10000] [--rounds 5]

The reply's bytes are packed here from os-ken's own wire layouts
(``ofproto_v1_3.OFP_FLOW_STATS_0_PACK_STR``, ``OFPMatch.serialize``): os-ken
parses replies but has no serializer for them (a controller never sends one).
"""

from __future__ import annotations

import argparse
import random
import struct
import time

from os_ken.ofproto import ofproto_parser
from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser

from apps.lessor.logic import LessorLogic
from controller.sdn import AccountingFlowStats
from controller.network_view import NetworkView
from mininet_topos.builders import fattree


class _Datapath:
    """What os-ken's parser reads of a datapath (its protocol modules)."""
    ofproto, ofproto_parser = ofp, parser


def flow_entry(match: parser.OFPMatch, byte_count: int, seconds: int = 7, instructions: bytes = b"") -> bytes:
    """One ofp_flow_stats: the fixed part (every field set, none zero
    where a decoder could confuse two), the match, ``instructions``."""
    body = bytearray()
    match.serialize(body, 0)
    length = ofp.OFP_FLOW_STATS_0_SIZE + len(body) + len(instructions)
    fixed = struct.pack(ofp.OFP_FLOW_STATS_0_PACK_STR, length, 2, seconds, 9, 100, 10, 0, 1,
                        0x0200_0000_0000_0001, byte_count // 1500, byte_count)
    return fixed + bytes(body) + instructions


MAX_MESSAGE = 65535        # an OpenFlow message's length is 16 bits: a switch splits a long reply


def reply_bytes(entries: list[tuple[parser.OFPMatch, int]], xid: int = 7, seconds: int = 3) -> list[bytes]:
    """The OFPMP_FLOW multipart reply carrying ``entries`` (match, bytes):
    as many messages as 64 KB allows, each but the last flagged REPLY_MORE."""
    parts, chunk, size = [], [], 0
    room = MAX_MESSAGE - ofp.OFP_HEADER_SIZE - struct.calcsize(ofp.OFP_MULTIPART_REPLY_PACK_STR)
    for m, b in entries:
        one = flow_entry(m, b, seconds)
        if size + len(one) > room:
            parts.append(chunk)
            chunk, size = [], 0
        chunk.append(one)
        size += len(one)
    parts.append(chunk)
    out = []
    for i, chunk in enumerate(parts):
        body = b"".join(chunk)
        length = ofp.OFP_HEADER_SIZE + struct.calcsize(ofp.OFP_MULTIPART_REPLY_PACK_STR) + len(body)
        flags = ofp.OFPMPF_REPLY_MORE if i < len(parts) - 1 else 0
        out.append(struct.pack(ofp.OFP_HEADER_PACK_STR, ofp.OFP_VERSION, ofp.OFPT_MULTIPART_REPLY, length, xid)
                   + struct.pack(ofp.OFP_MULTIPART_REPLY_PACK_STR, ofp.OFPMP_FLOW, flags) + body)
    return out


def parse(raw: bytes):
    version, msg_type, msg_len, xid = ofproto_parser.header(raw)
    return ofproto_parser.msg(_Datapath, version, msg_type, msg_len, xid, raw)


STOCK = parser.OFPFlowStats               # os-ken's own entry parser


def with_entries(body_cls):
    """Replies parsed with ``body_cls`` per entry from now on (os-ken reads
    OFPFlowStatsReply.cls_stats_body_cls at every reply)."""
    parser.OFPFlowStatsReply.cls_stats_body_cls = body_cls


def tor_entries(view: NetworkView, tor: str, n: int, rng: random.Random) -> list[tuple[parser.OFPMatch, int]]:
    """``n`` TCP flows from the hosts behind ``tor`` to hosts anywhere, as
    LESSOR's accounting table learns them (in_port: the source's port)."""
    hosts = [h for h in view.hosts]
    below = [h for h in hosts if view.host_switch(h)[0] == tor]
    ip = {h.name: h.ip for h in view.topo.hosts}
    out = []
    for i in range(n):
        src = below[i % len(below)]
        dst = rng.choice([h for h in hosts if h != src])
        m = parser.OFPMatch(in_port=view.host_switch(src)[1], eth_type=0x0800, ip_proto=6,
                            ipv4_src=ip[src], ipv4_dst=ip[dst], tcp_src=10000 + i % 50000, tcp_dst=5001)
        out.append((m, rng.randrange(1, 10**9)))
    return out


def measure(k: int, n: int, rounds: int, seed: int = 1) -> dict:
    topo = fattree(k)
    view = NetworkView(topo)
    lessor = LessorLogic(view)
    tor = sorted(s.name for s in topo.switches if s.role == "edge")[0]
    rng = random.Random(seed)
    entries = tor_entries(view, tor, n, rng)
    rounds_raw = [reply_bytes([(m, b + r * 1_000_000) for m, b in entries], xid=r + 1)   # counters grow
                  for r in range(rounds)]
    # os-ken's own parser alone, for comparison (the same bytes)
    with_entries(STOCK)
    t0 = time.process_time()
    for messages in rounds_raw:
        for raw in messages:
            parse(raw)
    t_stock = time.process_time() - t0
    with_entries(AccountingFlowStats)            # what the controller runs (controller.sdn)
    t_parse = t_pairs = t_pre = 0.0
    for r, messages in enumerate(rounds_raw):
        for raw in messages:               # the app takes each message of the reply as it comes
            t0 = time.process_time()
            msg = parse(raw)
            t1 = time.process_time()
            pairs = [(dict(s.match.items()), s.byte_count) for s in msg.body]
            t2 = time.process_time()
            lessor.flow_stats(tor, pairs, float(r))
            t3 = time.process_time()
            t_parse, t_pairs, t_pre = t_parse + t1 - t0, t_pairs + t2 - t1, t_pre + t3 - t2
    total = n * rounds
    if lessor.untrusted:
        raise AssertionError(f"{lessor.untrusted} entries not trusted: the benchmark's flows are not the ToR's")
    return {"k": k, "entries": n, "rounds": rounds, "reply_bytes": sum(map(len, rounds_raw[0])),
            "messages": len(rounds_raw[0]),
            "flows_known": len(lessor.table.flows),
            "stock_parse_per_s": total / t_stock, "parse_per_s": total / t_parse, "pairs_per_s": total / t_pairs, "pre_per_s": total / t_pre,
            "all_per_s": total / (t_parse + t_pairs + t_pre)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--entries", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    print(f"{'k':>3}{'entries':>9}{'reply KB':>10}{'msgs':>6}{'os-ken/s':>11}{'parse/s':>11}{'to pairs/s':>12}"
          f"{'PRE/s':>10}{'all/s':>10}")
    for k in args.k:
        for n in args.entries:
            r = measure(k, n, args.rounds)
            print(f"{k:>3}{n:>9}{r['reply_bytes'] / 1024:>10.0f}{r['messages']:>6}{r['stock_parse_per_s']:>11,.0f}{r['parse_per_s']:>11,.0f}{r['pairs_per_s']:>12,.0f}"
                  f"{r['pre_per_s']:>10,.0f}{r['all_per_s']:>10,.0f}")
    print("entries/s on one core (process time): os-ken's own entry parser, then what the controller runs --\n"
          "controller.sdn's AccountingFlowStats (controller.ofwire), the app's pairs, PRE; goal >= 50,000 for the whole")


if __name__ == "__main__":
    main()
