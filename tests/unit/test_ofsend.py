"""The one exit: plain messages become os-ken parser objects that serialise
to valid OpenFlow 1.3 and parse back to the same content."""

import struct

import pytest
from os_ken.ofproto import ofproto_parser, ofproto_protocol, ofproto_v1_3, ofproto_v1_3_parser

from apps.routing.logic import app_logic
from controller import ofmsg, ofsend
from controller.network_view import NetworkView
from mininet_topos import builders


@pytest.fixture
def dp():
    return ofproto_protocol.ProtocolDesc(ofproto_v1_3.OFP_VERSION)


def _round_trip(dp, msg):
    obj = ofsend.to_parser(dp, msg)
    obj.serialize()
    version, msg_type, msg_len, xid = ofproto_parser.header(obj.buf)
    assert version == ofproto_v1_3.OFP_VERSION and msg_len == len(obj.buf)
    return ofproto_parser.msg(dp, version, msg_type, msg_len, xid, bytes(obj.buf))


def test_flow_mod_round_trip(dp):
    fm = ofmsg.flow_add(1, 100, ofmsg.Match.of(eth_type=0x800, ipv4_dst="10.0.0.16", ip_dscp=8),
                        [ofmsg.SetQueue(1), ofmsg.SetField("ip_dscp", 8), ofmsg.GroupAction(3)],
                        goto=None, cookie=0x2 << 48, idle_timeout=10, send_flow_removed=True)
    back = _round_trip(dp, fm)
    assert back.table_id == 1 and back.priority == 100 and back.idle_timeout == 10
    assert back.cookie == 0x2 << 48 and back.flags == ofproto_v1_3.OFPFF_SEND_FLOW_REM
    assert back.match["ipv4_dst"] == "10.0.0.16" and back.match["ip_dscp"] == 8
    acts = back.instructions[0].actions
    assert [type(a).__name__ for a in acts] == ["OFPActionSetQueue", "OFPActionSetField", "OFPActionGroup"]


def test_masked_match_goto_and_delete(dp):
    fm = ofmsg.flow_add(0, 5, ofmsg.Match.of(eth_type=0x800, ipv4_dst=("10.0.0.0", "255.255.0.0")), goto=1)
    back = _round_trip(dp, fm)
    assert back.match["ipv4_dst"] == ("10.0.0.0", "255.255.0.0")
    assert back.instructions[0].table_id == 1
    dl = _round_trip(dp, ofmsg.flow_delete(2 << 48, 0xFFFF << 48))
    assert dl.command == ofproto_v1_3.OFPFC_DELETE and dl.table_id == ofproto_v1_3.OFPTT_ALL
    assert dl.cookie_mask == 0xFFFF << 48


def _decode_group_mod(dp, msg):
    """os-ken parses no GroupMod (it only sends them): decode by hand."""
    obj = ofsend.to_parser(dp, msg)
    obj.serialize()
    buf = bytes(obj.buf)
    command, gtype, _, group_id = struct.unpack_from("!HBBI", buf, 8)
    buckets, off = [], 16
    while off < len(buf):
        bucket = ofproto_v1_3_parser.OFPBucket.parser(buf, off)
        buckets.append(bucket)
        off += bucket.len
    return command, gtype, group_id, buckets


def test_group_mod_round_trip(dp):
    command, gtype, gid, buckets = _decode_group_mod(dp, ofmsg.group_select(7, [3, 3, 4, 4]))
    assert (command, gtype, gid) == (ofproto_v1_3.OFPGC_ADD, ofproto_v1_3.OFPGT_SELECT, 7)
    assert [b.actions[0].port for b in buckets] == [3, 3, 4, 4]
    assert [b.watch_port for b in buckets] == [3, 3, 4, 4]
    assert [b.weight for b in buckets] == [1, 1, 1, 1]
    command, _, gid, buckets = _decode_group_mod(dp, ofmsg.group_delete(7))
    assert (command, gid, buckets) == (ofproto_v1_3.OFPGC_DELETE, 7, [])


def test_every_message_an_app_produces_serialises(dp):
    view = NetworkView(builders.fattree(4))
    for app in ("single_path", "ecmp"):
        routing = app_logic(view, app)
        for sw in view.switches:
            for m in routing.switch_connected(sw):
                if isinstance(m, ofmsg.GroupMod):
                    _decode_group_mod(dp, m)
                else:
                    _round_trip(dp, m)


def test_send_uses_the_datapath_in_order(dp):
    sent = []

    class FakeDatapath:
        ofproto = dp.ofproto
        ofproto_parser = dp.ofproto_parser

        def send_msg(self, m):
            sent.append(m)

    msgs = [ofmsg.group_select(1, [1, 2]), ofmsg.PortDescRequest()]
    assert ofsend.send(FakeDatapath(), msgs) == 2
    assert [type(m).__name__ for m in sent] == ["OFPGroupMod", "OFPPortDescStatsRequest"]
    with pytest.raises(TypeError):
        ofsend.to_parser(dp, object())


def test_meter_mod_and_meter_instruction_serialise(dp):
    import struct
    obj = ofsend.to_parser(dp, ofmsg.MeterMod("add", 3, 35000, 64))
    obj.serialize()
    # ofp_meter_mod: header(8) command(2) flags(2) meter_id(4), then a drop band: type len rate burst
    command, flags, meter_id = struct.unpack_from("!HHI", obj.buf, 8)
    band_type, _, rate, burst = struct.unpack_from("!HHII", obj.buf, 16)
    assert (command, meter_id) == (ofproto_v1_3.OFPMC_ADD, 3)
    assert flags == ofproto_v1_3.OFPMF_KBPS | ofproto_v1_3.OFPMF_BURST
    assert (band_type, rate, burst) == (ofproto_v1_3.OFPMBT_DROP, 35000, 64)
    fm = ofmsg.FlowMod(0, 310, ofmsg.Match.of(in_port=3, eth_type=0x800, ip_dscp=0),
                       (ofmsg.MeterInstruction(3), ofmsg.ApplyActions((ofmsg.SetQueue(0),)), ofmsg.GotoTable(1)))
    back = _round_trip(dp, fm)
    assert [type(i).__name__ for i in back.instructions] == ["OFPInstructionMeter", "OFPInstructionActions",
                                                              "OFPInstructionGotoTable"]
    assert back.instructions[0].meter_id == 3
