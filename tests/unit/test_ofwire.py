"""controller/ofwire.py against os-ken's own parser: every flow-statistics
entry decodes to the same counters and match, or is left to os-ken
(None) -- LESSOR's accounting entries, arbitrary matches (Hypothesis),
masked fields, instructions, truncated buffers."""

import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser

from benchmarks import flow_stats as B
from controller import ofwire, sdn
from controller.network_view import NetworkView
from mininet_topos.builders import fattree


def _entry(match, byte_count=123456, instructions=b""):
    return B.flow_entry(match, byte_count, instructions=instructions)


def osken(raw):
    e = parser.OFPFlowStats.parser(raw, 0)
    return (e.length, e.table_id, e.duration_sec, e.duration_nsec, e.priority, e.idle_timeout, e.hard_timeout,
            e.flags, e.cookie, e.packet_count, e.byte_count), dict(e.match.items()), e.match.length


ACCOUNTING = dict(in_port=3, eth_type=0x0800, ip_proto=6, ipv4_src="10.0.1.2", ipv4_dst="10.3.0.2", tcp_src=40001,
                  tcp_dst=5001)


def test_an_accounting_entry_decodes_as_os_ken_parses_it():
    raw = _entry(parser.OFPMatch(**ACCOUNTING), 987654321)
    assert ofwire.decode_flow_stats(raw, 0) == osken(raw)
    udp = _entry(parser.OFPMatch(in_port=1, eth_type=0x0800, ip_proto=17, ipv4_src="10.0.0.2",
                                 ipv4_dst="10.0.0.3", udp_src=9, udp_dst=53))
    assert ofwire.decode_flow_stats(udp, 0) == osken(udp)
    assert ofwire.decode_flow_stats(b"\0" * 8 + raw, 8) == osken(raw)          # at an offset


@pytest.mark.parametrize("match", [
    parser.OFPMatch(eth_type=0x0800, ipv4_src=("10.0.0.0", "255.255.0.0")),     # masked
    parser.OFPMatch(eth_dst="00:00:00:00:00:01"),                                # a field not decoded here
    parser.OFPMatch(vlan_vid=0x1005),
])
def test_anything_else_is_left_to_os_ken(match):
    assert ofwire.decode_flow_stats(_entry(match, 1), 0) is None


def test_an_entry_with_instructions_is_left_to_os_ken():
    inst = struct.pack("!HHB3x", ofp.OFPIT_GOTO_TABLE, 8, 2)
    raw = _entry(parser.OFPMatch(**ACCOUNTING), 1, inst)
    assert ofwire.decode_flow_stats(raw, 0) is None
    # and the adapter's parser still gives os-ken's answer for it
    e = sdn.AccountingFlowStats.parser(raw, 0)
    assert [type(i).__name__ for i in e.instructions] == ["OFPInstructionGotoTable"]


def test_a_truncated_entry_raises_as_os_kens_does():
    raw = _entry(parser.OFPMatch(**ACCOUNTING), 1)
    with pytest.raises(struct.error):
        ofwire.decode_flow_stats(raw[:30], 0)


FIELD = st.sampled_from([
    ("in_port", st.integers(0, 2**32 - 1)), ("eth_type", st.integers(0, 2**16 - 1)),
    ("ip_proto", st.integers(0, 255)), ("ipv4_src", st.ip_addresses(v=4).map(str)),
    ("ipv4_dst", st.ip_addresses(v=4).map(str)), ("tcp_src", st.integers(0, 65535)),
    ("tcp_dst", st.integers(0, 65535)), ("udp_src", st.integers(0, 65535)), ("udp_dst", st.integers(0, 65535)),
    ("eth_src", st.sampled_from(["00:00:00:00:00:01", "0a:0b:0c:0d:0e:0f"])),
    ("arp_op", st.integers(0, 65535)), ("metadata", st.integers(0, 2**64 - 1)),
])


@settings(max_examples=300, deadline=None)
@given(st.lists(FIELD, max_size=9, unique_by=lambda f: f[0]).flatmap(
    lambda fs: st.fixed_dictionaries({name: strat for name, strat in fs})), st.integers(0, 2**64 - 1))
def test_any_entry_decodes_as_os_ken_parses_it_or_is_left_to_it(fields, byte_count):
    raw = _entry(parser.OFPMatch(**fields), byte_count)
    got = ofwire.decode_flow_stats(raw, 0)
    want = osken(raw)
    if got is not None:
        assert got == want
    else:
        assert set(fields) - set(name for name, _, _ in ofwire.FIELDS.values())
    # the adapter's entry is os-ken's, whichever decoded it
    e = sdn.AccountingFlowStats.parser(raw, 0)
    assert (e.byte_count, dict(e.match.items()), e.length, e.instructions) == (want[0][10], want[1], want[0][0], [])


def test_os_ken_parses_every_flow_stats_reply_through_the_adapter():
    entries = B.tor_entries(NetworkView(fattree(4)), "e0_0", 30, random.Random(1))
    msg = B.parse(B.reply_bytes(entries)[0])
    assert all(type(e) is sdn.AccountingFlowStats for e in msg.body)
    assert all(type(e.match) is sdn.DecodedMatch for e in msg.body)
    assert [dict(e.match.items()) for e in msg.body] == [dict(m.items()) for m, _ in entries]
