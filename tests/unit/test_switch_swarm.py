"""benchmarks/switch_swarm.py: the swarm's switch answers what os-ken asks
a switch, in bytes os-ken's own parser reads back; mods are counted, ToR
polls recorded (a real controller serving a swarm:
tests/integration/test_switch_swarm_process.py)."""

import struct

from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser

from benchmarks import flow_stats as F
from benchmarks import switch_swarm as S


class _Transport:
    def __init__(self):
        self.out = []

    def write(self, data):
        self.out.append(data)

    def close(self):
        pass


def _switch():
    tor = next(sw for sw in S.switches_of(4, 10) if sw.entries)
    t = _Transport()
    tor.connection_made(t)
    hello = F.parse(t.out.pop())
    assert type(hello).__name__ == "OFPHello"
    return tor, t


def _ask(sw, t, msg):
    msg.serialize()
    raw = bytes(msg.buf)
    sw.data_received(raw[:5])            # a message may arrive in pieces
    sw.data_received(raw[5:])
    return [F.parse(r) for r in t.out[-1:]] if t.out else []


def test_the_handshake_os_ken_runs_is_answered():
    sw, t = _switch()
    dp = F._Datapath()
    (features,) = _ask(sw, t, parser.OFPFeaturesRequest(dp))
    assert type(features).__name__ == "OFPSwitchFeatures" and features.datapath_id == sw.dpid
    t.out.clear()
    (desc,) = _ask(sw, t, parser.OFPPortDescStatsRequest(dp, 0))
    assert sorted(p.port_no for p in desc.body) == sw.ports and len(sw.ports) == 4
    assert all(p.state & ofp.OFPPS_LIVE and not p.config & ofp.OFPPC_PORT_DOWN for p in desc.body)
    assert sw.stats.handshaken_at is not None
    (echo,) = _ask(sw, t, parser.OFPEchoRequest(dp, data=b"abc"))
    assert type(echo).__name__ == "OFPEchoReply" and echo.data == b"abc"
    (barrier,) = _ask(sw, t, parser.OFPBarrierRequest(dp))
    assert type(barrier).__name__ == "OFPBarrierReply"
    (role,) = _ask(sw, t, parser.OFPRoleRequest(dp, ofp.OFPCR_ROLE_MASTER, 7))
    assert (role.role, role.generation_id) == (ofp.OFPCR_ROLE_MASTER, 7)


def test_a_tor_answers_polls_with_growing_counters_and_counts_mods():
    sw, t = _switch()
    dp = F._Datapath()
    sw.t0 -= 10.0                                   # ten seconds of traffic so far
    req = parser.OFPFlowStatsRequest(dp, 0, 0, ofp.OFPP_ANY, ofp.OFPG_ANY, 0, 0, parser.OFPMatch())
    (first,) = _ask(sw, t, req)
    sw.t0 -= 10.0
    (second,) = _ask(sw, t, req)
    assert len(first.body) == len(second.body) == 10 and len(sw.stats.polls) == 2
    grew = [b.byte_count - a.byte_count for a, b in zip(first.body, second.body)]
    assert all(g > 0 for g in grew)
    assert any(g > 10 * S.MOUSE_BPS / 8 * 1.5 for g in grew) or not any(r > S.MOUSE_BPS for r in sw.rates)
    (stats,) = _ask(sw, t, parser.OFPPortStatsRequest(dp, 0, ofp.OFPP_ANY))
    assert sorted(s.port_no for s in stats.body) == sw.ports and all(s.tx_bytes > 0 for s in stats.body)
    n = len(t.out)
    _ask(sw, t, parser.OFPFlowMod(dp, match=parser.OFPMatch(in_port=1), instructions=[]))
    _ask(sw, t, parser.OFPGroupMod(dp, ofp.OFPGC_ADD, ofp.OFPGT_SELECT, 1, []))
    _ask(sw, t, parser.OFPMeterMod(dp, ofp.OFPMC_ADD, ofp.OFPMF_KBPS, 1, [parser.OFPMeterBandDrop(rate=10)]))
    assert len(t.out) == n and sw.stats.mods == {"flow": 1, "group": 1, "meter": 1}
    (empty,) = _ask(sw, t, parser.OFPGroupDescStatsRequest(dp, 0))
    assert empty.body == []
    sw.data_received(struct.pack(ofp.OFP_HEADER_PACK_STR, 4, 99, 8, 1))
    assert sw.stats.unknown == 1

