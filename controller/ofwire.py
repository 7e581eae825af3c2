"""A fast decoder for the flow-statistics entries LESSOR polls (pure; no
os-ken import).

Every poll, every ToR replies with one OpenFlow 1.3 ``ofp_flow_stats`` per
accounting entry. os-ken parses each entry's match field by field through
its generic OXM machinery, twice (its current and its legacy layout):
about 8-25 k entries/s on one core here (``benchmarks/flow_stats``), short of
issue #34's 50 k/s. The accounting entries carry a handful of fixed-size
OXM fields, so this module decodes exactly those with one ``struct`` call
per field and leaves everything else -- a masked field, an experimenter
class, a field not listed here, an entry with instructions, a match that
is not OXM -- to os-ken's own parser (``None`` here: the caller falls back).
:mod:`controller.sdn` plugs it under os-ken's ``OFPFlowStatsReply``;
``tests/unit/test_ofwire.py`` checks it against os-ken's parser entry by
entry, arbitrary entries included.
"""

from __future__ import annotations

import socket
import struct

FLOW_STATS_0 = struct.Struct("!HBxIIHHHH4xQQQ")      # ofproto_v1_3.OFP_FLOW_STATS_0_PACK_STR
FLOW_STATS_0_SIZE = 48
MATCH_HEADER = struct.Struct("!HH")                   # ofp_match: type, length
OFPMT_OXM = 1
OFPXMC_OPENFLOW_BASIC = 0x8000
_U8, _U16, _U32 = struct.Struct("!B"), struct.Struct("!H"), struct.Struct("!I")


def _ipv4(buf, pos: int) -> str:
    return socket.inet_ntoa(bytes(buf[pos:pos + 4]))


# OXM field number -> (os-ken's name, payload length, decoder(buf, pos))
FIELDS = {
    0: ("in_port", 4, lambda b, p: _U32.unpack_from(b, p)[0]),
    5: ("eth_type", 2, lambda b, p: _U16.unpack_from(b, p)[0]),
    10: ("ip_proto", 1, lambda b, p: _U8.unpack_from(b, p)[0]),
    11: ("ipv4_src", 4, _ipv4),
    12: ("ipv4_dst", 4, _ipv4),
    13: ("tcp_src", 2, lambda b, p: _U16.unpack_from(b, p)[0]),
    14: ("tcp_dst", 2, lambda b, p: _U16.unpack_from(b, p)[0]),
    15: ("udp_src", 2, lambda b, p: _U16.unpack_from(b, p)[0]),
    16: ("udp_dst", 2, lambda b, p: _U16.unpack_from(b, p)[0]),
}


def decode_flow_stats(buf, offset: int):
    """One ``ofp_flow_stats`` at ``offset``: (its 11 fixed fields in
    os-ken's order -- length, table_id, duration_sec, duration_nsec,
    priority, idle_timeout, hard_timeout, flags, cookie, packet_count,
    byte_count --, the match's fields {name: value} in wire order, the
    match's length), or None where os-ken's parser must decide (see the
    module's docstring). Raises struct.error on a truncated buffer, as
    os-ken's parser does."""
    fixed = FLOW_STATS_0.unpack_from(buf, offset)
    length = fixed[0]
    pos = offset + FLOW_STATS_0_SIZE
    mtype, mlen = MATCH_HEADER.unpack_from(buf, pos)
    if mtype != OFPMT_OXM or mlen < MATCH_HEADER.size:
        return None
    padded = (mlen + 7) // 8 * 8
    if length != FLOW_STATS_0_SIZE + padded:          # instructions follow (or a malformed length)
        return None
    end, pos = pos + mlen, pos + MATCH_HEADER.size
    fields = {}
    while pos < end:
        (header,) = _U32.unpack_from(buf, pos)
        oxm_class, field, has_mask, size = header >> 16, (header >> 9) & 0x7F, (header >> 8) & 1, header & 0xFF
        known = FIELDS.get(field) if oxm_class == OFPXMC_OPENFLOW_BASIC and not has_mask else None
        if known is None or known[1] != size or pos + 4 + size > end:
            return None
        name, _, decode = known
        if name in fields:                               # a field twice: os-ken's to judge
            return None
        fields[name] = decode(buf, pos + 4)
        pos += 4 + size
    return fixed, fields, mlen
