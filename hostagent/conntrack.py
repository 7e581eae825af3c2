"""The conntrack entries of one address, filtered in the kernel.

LRC at a host needs only the entries of its VM's address (as source or as
destination of the original direction); the whole table may hold tens of
thousands of others (a busy hypervisor, a NAT). Reading the kernel's text
(``/proc/net/nf_conntrack``) costs CPU in proportion to the whole table:
110 ms per read of 10,000 entries measured here, 74 % of a core at
τ_v = 50 ms. Since Linux 5.8 a netlink dump takes a filter on the original
tuple (CTA_FILTER) and the kernel returns only the matching entries, so
the agent's cost follows its own pairs.

A dump still walks the kernel's whole hash table (about 9 ms of an empty
table here: its buckets), so the agent dumps only to start, every 60 s and
after lost events; between, the kernel's NEW/DESTROY events keep the set of
the VM's tuples and each round looks them up one by one (a hash lookup).

pyroute2 encodes these requests (its ``nfct_msg``), and its
``Conntrack.dump_entries`` sends the dump -- but its synchronous wrapper
runs an asyncio round per call (about 10 ms of CPU even for an empty
result, pyroute2 0.9.7) and its decoder takes about 0.2 ms per entry. So
this module drives plain netlink sockets, encodes each request once with
pyroute2, and reads the few attributes it needs with a TLV walk of its own.
"""

from __future__ import annotations

import errno
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


IPCTNL_MSG_CT_NEW, IPCTNL_MSG_CT_DELETE = 0, 2
NFNLGRP_CONNTRACK_NEW, NFNLGRP_CONNTRACK_DESTROY = 1, 3
ENOENT, ENOBUFS = 2, 105
RESYNC_S = 60.0                    # a filtered dump now and then, whatever the events said


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
        self._requests: dict[tuple, bytearray] = {}

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

    def get(self, key: tuple) -> Entry | None:
        """The entry of one original tuple (saddr, daddr, proto, sport,
        dport) -- a hash lookup in the kernel -- or None if it is gone. The
        request is encoded once per tuple (pyroute2's classes), then only
        its sequence number changes."""
        raw = self._requests.get(key)
        if raw is None:
            from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple, nfct_msg
            saddr, daddr, proto, sport, dport = key
            msg = nfct_msg.create_from(tuple_orig=NFCTAttrTuple(saddr=saddr, daddr=daddr, proto=proto,
                                                               sport=sport, dport=dport))
            raw = self._encode(msg, NLM_F_REQUEST)
            if len(self._requests) > 65536:
                self._requests.clear()
            self._requests[key] = raw
        try:
            got = self._exchange(raw, NLM_F_REQUEST)
        except ConntrackError as exc:
            if exc.errno == ENOENT:
                return None
            raise
        return got[0] if got else None

    def _dump(self, **match) -> list[Entry]:
        from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple, nfct_msg
        tuple_orig = NFCTAttrTuple(**match)
        tuple_orig.attrs()                            # computes the filter flags
        msg = nfct_msg.create_from(tuple_orig=tuple_orig,
                                   cta_filter={"attrs": [["CTA_FILTER_ORIG_FLAGS", tuple_orig.flags]]})
        return self._request(msg, NLM_F_REQUEST | NLM_F_DUMP)

    def _request(self, msg, flags: int) -> list[Entry]:
        return self._exchange(self._encode(msg, flags), flags)

    @staticmethod
    def _encode(msg, flags: int) -> bytearray:
        msg["header"]["type"] = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET
        msg["header"]["flags"] = flags
        msg["nfgen_family"] = socket.AF_INET
        msg.encode()
        return bytearray(msg.data)

    def _exchange(self, raw: bytearray, flags: int) -> list[Entry]:
        self.seq += 1
        struct.pack_into("=L", raw, 8, self.seq)        # nlmsghdr's sequence number
        self.sock.send(raw)
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
                            raise ConntrackError(code, f"conntrack: {errno.errorcode.get(code, code)}")
                        return entries
                    entry = _entry_bytes(data, offset, length)
                    if entry is not None:
                        entries.append(entry)
                    if not flags & NLM_F_DUMP:
                        return entries
                offset += (length + 3) & ~3


class VmConntrack:
    """The conntrack entries of one VM address at a cost that follows the
    VM's own entries, not the table: one kernel-filtered dump to start
    (and every RESYNC_S, or when the event queue overflowed), then the
    kernel's NEW and DESTROY events -- whose bytes are searched for the
    address before anything is decoded -- keep the set of the VM's tuples,
    and each read looks those up one by one (a hash lookup each)."""

    def __init__(self, address: str, clock=None):
        import time
        self.address = address
        self.packed = socket.inet_aton(address)
        self.clock = clock or time.monotonic
        self.reader = ConntrackReader()
        self.events = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.events.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.events.bind((0, (1 << (NFNLGRP_CONNTRACK_NEW - 1)) | (1 << (NFNLGRP_CONNTRACK_DESTROY - 1))))
        self.events.setblocking(False)
        self.tuples: set[tuple] = set()
        self.synced_at: float | None = None
        self.resyncs = 0
        # with events off (nf_conntrack_events = 0) the kernel sends none: dump every round instead
        try:
            self.events_on = open("/proc/sys/net/netfilter/nf_conntrack_events").read().strip() != "0"
        except OSError:
            self.events_on = True
        self._last: list[Entry] = []

    def close(self) -> None:
        self.reader.close()
        self.events.close()

    def entries(self) -> list[Entry]:
        now = self.clock()
        if self.synced_at is None or not self.events_on or now - self.synced_at >= RESYNC_S or not self._drain():
            self._resync(now)
            return list(self._last)
        out = []
        for key in sorted(self.tuples):
            e = self.reader.get(key)
            if e is None:
                self.tuples.discard(key)
            else:
                out.append(e)
        return out

    def _resync(self, now: float) -> None:
        self._drain()                          # what the dump will show anyway
        self._last = self.reader.entries_of(self.address)
        self.tuples = {_tuple(e) for e in self._last}
        self.synced_at = now
        self.resyncs += 1

    def _drain(self) -> bool:
        """Take every pending event; False if the kernel dropped some (the
        set may be wrong: resync)."""
        while True:
            try:
                data = self.events.recv(1 << 20)
            except BlockingIOError:
                return True
            except OSError as exc:
                if exc.errno == ENOBUFS:
                    return False
                raise
            offset = 0
            while offset + 16 <= len(data):
                length, kind, _, _ = struct.unpack_from("=LHHL", data, offset)
                if length < 16:
                    return False
                if data.find(self.packed, offset, offset + length) >= 0:   # cheap: most events are others'
                    e = _entry_bytes(data, offset, length)
                    if e is not None and self.address in (e.saddr, e.daddr):
                        if kind & 0xFF == IPCTNL_MSG_CT_DELETE:
                            self.tuples.discard(_tuple(e))
                        else:
                            self.tuples.add(_tuple(e))
                offset += (length + 3) & ~3


def _tuple(e: Entry) -> tuple:
    return (e.saddr, e.daddr, e.proto, e.sport, e.dport)


def _attrs(data: bytes, start: int, end: int) -> dict[int, tuple[int, int]]:
    """Netlink attributes between ``start`` and ``end``: type -> (offset of
    the payload, its end). A plain TLV walk: pyroute2's decoder takes about
    0.2 ms per conntrack message, more than the rest of a round's work."""
    out = {}
    while start + 4 <= end:
        length, kind = struct.unpack_from("=HH", data, start)
        if length < 4:
            break
        out[kind & 0x3FFF] = (start + 4, min(start + length, end))
        start += (length + 3) & ~3
    return out


def _entry_bytes(data: bytes, offset: int, length: int) -> Entry | None:
    """One conntrack message (from its netlink header at ``offset``) as an
    Entry, or None if it lacks the original tuple."""
    top = _attrs(data, offset + 20, offset + length)        # after nlmsghdr (16) and nfgenmsg (4)
    if 1 not in top:                                         # CTA_TUPLE_ORIG
        return None
    tup = _attrs(data, *top[1])
    if 1 not in tup or 2 not in tup:                         # CTA_TUPLE_IP, CTA_TUPLE_PROTO
        return None
    ip, pr = _attrs(data, *tup[1]), _attrs(data, *tup[2])
    if 1 not in ip or 2 not in ip or 1 not in pr:            # CTA_IP_V4_SRC/DST, CTA_PROTO_NUM
        return None
    saddr = socket.inet_ntoa(data[ip[1][0]:ip[1][0] + 4])
    daddr = socket.inet_ntoa(data[ip[2][0]:ip[2][0] + 4])
    proto = data[pr[1][0]]
    sport = struct.unpack_from("!H", data, pr[2][0])[0] if 2 in pr else 0
    dport = struct.unpack_from("!H", data, pr[3][0])[0] if 3 in pr else 0
    status = struct.unpack_from("!I", data, top[3][0])[0] if 3 in top else 0
    timeout = struct.unpack_from("!I", data, top[7][0])[0] if 7 in top else 0
    established = False
    if proto == TCP and 4 in top:                            # CTA_PROTOINFO -> CTA_PROTOINFO_TCP -> STATE
        info = _attrs(data, *top[4])
        if 1 in info:
            tcp = _attrs(data, *info[1])
            established = 1 in tcp and data[tcp[1][0]] == TCP_CONNTRACK_ESTABLISHED

    def counted(kind: int) -> int | None:                    # CTA_COUNTERS_ORIG/REPLY -> CTA_COUNTERS_BYTES
        if kind not in top:
            return None
        c = _attrs(data, *top[kind])
        return struct.unpack_from("!Q", data, c[2][0])[0] if 2 in c else None
    return Entry(saddr, daddr, proto, established, bool(status & IPS_ASSURED), timeout, sport, dport,
                 counted(9), counted(10))
