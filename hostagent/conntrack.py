"""The conntrack entries of one address, filtered in the kernel.

LRC at a host needs only the entries of its VM's address (as source or as
destination of the original direction); the whole table may hold tens of
thousands of others (a busy hypervisor, a NAT). Reading the kernel's text
(``/proc/net/nf_conntrack``) costs CPU in proportion to the whole table:
110 ms per read of 10,000 entries measured here, 74 % of a core at
τ_v = 50 ms. Since Linux 5.8 a netlink dump takes a filter on the original
tuple (CTA_FILTER) and the kernel returns only the matching entries, so
the agent's cost follows its own pairs.

pyroute2 encodes and decodes these messages (its ``nfct_msg``), and its
``Conntrack.dump_entries`` sends exactly this request -- but its
synchronous wrapper runs an asyncio round per call, about 10 ms of CPU per
dump even of an empty result (measured with pyroute2 0.9.7), which alone
would be 40 % of a core for two dumps every 50 ms. So this module drives
one plain netlink socket itself and leaves the message format to
pyroute2's classes.
"""

from __future__ import annotations

import ipaddress
import socket
import struct

from hostagent.lrc import IPS_ASSURED, TCP, Entry

NETLINK_NETFILTER = 12
NFNL_SUBSYS_CTNETLINK = 1
IPCTNL_MSG_CT_GET = 1
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
TCP_CONNTRACK_ESTABLISHED = 3


class ConntrackError(OSError):
    pass


class ConntrackReader:
    """One netlink socket, kept open across rounds; ``entries_of(addr)`` is
    every IPv4 entry whose original direction starts or ends at ``addr``."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self.sock.bind((0, 0))
        self.seq = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "ConntrackReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def entries_of(self, address: str) -> list[Entry]:
        ipaddress.IPv4Address(address)               # ValueError for anything else
        out = {}
        for side in ("saddr", "daddr"):
            for e in self._dump(**{side: address}):
                out[e.key] = e                         # an entry from the address to itself: once
        return list(out.values())

    def _dump(self, **match) -> list[Entry]:
        from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple, nfct_msg
        tuple_orig = NFCTAttrTuple(**match)
        tuple_orig.attrs()                            # computes the filter flags
        msg = nfct_msg.create_from(tuple_orig=tuple_orig,
                                   cta_filter={"attrs": [["CTA_FILTER_ORIG_FLAGS", tuple_orig.flags]]})
        self.seq += 1
        msg["header"]["type"] = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET
        msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_DUMP
        msg["header"]["sequence_number"] = self.seq
        msg["nfgen_family"] = socket.AF_INET
        msg.encode()
        self.sock.send(msg.data)
        entries = []
        while True:
            data = self.sock.recv(1 << 20)
            offset = 0
            while offset + 16 <= len(data):
                length, kind, _, seq = struct.unpack_from("=LHHL", data, offset)
                if length < 16:
                    raise ConntrackError("conntrack: malformed netlink message")
                if seq == self.seq:
                    if kind == NLMSG_DONE:
                        return entries
                    if kind == NLMSG_ERROR:
                        code = -struct.unpack_from("=i", data, offset + 16)[0]
                        if code:
                            raise ConntrackError(code, f"conntrack dump: {socket.errno.errorcode.get(code, code)}")
                    else:
                        entry = _entry(nfct_msg(data[offset:offset + length]))
                        if entry is not None:
                            entries.append(entry)
                offset += (length + 3) & ~3


def _entry(msg) -> Entry | None:
    msg.decode()
    orig = msg.get_attr("CTA_TUPLE_ORIG")
    if orig is None:
        return None
    ip = orig.get_attr("CTA_TUPLE_IP")
    proto = orig.get_attr("CTA_TUPLE_PROTO")
    if ip is None or proto is None:
        return None
    saddr, daddr = ip.get_attr("CTA_IP_V4_SRC"), ip.get_attr("CTA_IP_V4_DST")
    if saddr is None or daddr is None:
        return None
    pnum = proto.get_attr("CTA_PROTO_NUM") or 0
    established = False
    info = msg.get_attr("CTA_PROTOINFO")
    if pnum == TCP and info is not None:
        tcp = info.get_attr("CTA_PROTOINFO_TCP")
        established = tcp is not None and tcp.get_attr("CTA_PROTOINFO_TCP_STATE") == TCP_CONNTRACK_ESTABLISHED

    def counted(name):
        c = msg.get_attr(name)
        return None if c is None else c.get_attr("CTA_COUNTERS_BYTES")
    return Entry(saddr, daddr, pnum, established, bool((msg.get_attr("CTA_STATUS") or 0) & IPS_ASSURED),
                 int(msg.get_attr("CTA_TIMEOUT") or 0), int(proto.get_attr("CTA_PROTO_SRC_PORT") or 0),
                 int(proto.get_attr("CTA_PROTO_DST_PORT") or 0), counted("CTA_COUNTERS_ORIG"),
                 counted("CTA_COUNTERS_REPLY"))
