"""Which path each long flow really took through an emulated fabric
(emulation only; production never imports this).

ECMP's paths hang on the switches' hash of each connection's ephemeral
port (Open vSwitch's ``dp_hash``, computed in its datapath: neither the
controller nor ``ofproto/trace`` knows the bucket a connection gets). To
compare the flow-level simulator with one emulated run like for like
(``bwfabric simulate fabric-validate``), the run records what the switches
did: for a moment during the flows' warm-up, a packet socket on every
switch port that is one of several equal-cost next hops counts the data
packets leaving it, by (source address, destination address, destination
port); :func:`walk` then follows each flow from its ToR: at a switch with
one next hop towards the destination that hop, at one with several the
port its packets left by.

Why a packet socket and not ``tcpdump``: one process reads all the ports
through ``select`` and parses 40 bytes of IPv4 + TCP header; nothing to
spawn per port and no text to parse.
"""

from __future__ import annotations

import collections
import ipaddress
import select
import socket
import struct
import time

from controller.network_view import NetworkView

ETH_P_ALL = 0x0003           # outgoing packets reach only the taps of every protocol (dev_queue_xmit_nit)
ETH_P_IP = 0x0800
PACKET_OUTGOING = 4          # linux/if_packet.h: a packet the interface sent
CHECK_S = 0.1               # how often capture() asks whether it has seen enough
MIN_DATA_BYTES = 500         # IP length: data segments, not ACKs or iperf3's control exchanges

Key = tuple[str, str, int]   # (source address, destination address, destination TCP port)


class ProbeError(RuntimeError):
    pass


def probe_ports(view: NetworkView) -> dict[str, tuple[str, int]]:
    """``{interface: (switch, port)}`` of every switch port that is one of
    several equal-cost next hops towards some host (Mininet names a
    switch's port N ``<switch>-eth<N>``)."""
    out = {}
    for sw in view.switches:
        for host in view.hosts:
            hops = view.next_hops(sw, host)
            if len(hops) > 1:
                for h in hops:
                    port = view.port(sw, h)
                    out[f"{sw}-eth{port}"] = (sw, port)
    return out


def parse_ipv4_tcp(frame: bytes) -> tuple[Key, int] | None:
    """``((src, dst, dport), ip length)`` of an IPv4 TCP packet as an
    ``AF_PACKET``/``SOCK_DGRAM`` socket gives it (from the IP header); None
    for anything else or a truncated header."""
    if len(frame) < 20 or frame[0] >> 4 != 4:
        return None
    ihl = (frame[0] & 0x0F) * 4
    if ihl < 20 or frame[9] != socket.IPPROTO_TCP or len(frame) < ihl + 4:
        return None
    total = struct.unpack_from("!H", frame, 2)[0]
    src, dst = str(ipaddress.IPv4Address(frame[12:16])), str(ipaddress.IPv4Address(frame[16:20]))
    dport = struct.unpack_from("!H", frame, ihl + 2)[0]
    return (src, dst, dport), total


def capture(ifaces: list[str], seconds: float, done=None) -> dict[str, collections.Counter]:
    """Data packets each interface sent during ``seconds`` -- or until
    ``done(counts)`` says enough, asked every ``CHECK_S`` -- counted by
    :data:`Key` (root's network namespace, where Mininet leaves switch ports)."""
    if not (0 < seconds <= 60):
        raise ProbeError(f"capture seconds {seconds!r}: must be in (0, 60]")
    socks: dict[socket.socket, str] = {}
    counts: dict[str, collections.Counter] = {i: collections.Counter() for i in ifaces}
    try:
        for name in ifaces:
            s = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_ALL))
            socks[s] = name
            s.bind((name, ETH_P_ALL))
            s.setblocking(False)
        end = time.monotonic() + seconds
        check = time.monotonic() + CHECK_S
        while (left := end - time.monotonic()) > 0:
            if done is not None and time.monotonic() >= check:
                if done(counts):
                    break
                check = time.monotonic() + CHECK_S
            ready, _, _ = select.select(list(socks), [], [], min(left, CHECK_S))
            for s in ready:
                while True:
                    try:
                        frame, addr = s.recvfrom(64)
                    except BlockingIOError:
                        break
                    if addr[2] != PACKET_OUTGOING or addr[1] != ETH_P_IP:
                        continue
                    got = parse_ipv4_tcp(frame)
                    if got and got[1] >= MIN_DATA_BYTES:
                        counts[socks[s]][got[0]] += 1
    finally:
        for s in socks:
            s.close()
    return counts


def walk(view: NetworkView, src: str, dst: str, key: Key,
         seen: dict[tuple[str, int], collections.Counter]) -> tuple[str, ...] | None:
    """The path of the flow ``key`` from host ``src`` to host ``dst``:
    single next hops followed, at a multipath switch the port that sent the
    most of its packets. None when such a switch sent none of them (the
    probe missed the flow)."""
    sw, _ = view.host_switch(src)
    path = [src, sw]
    while path[-1] != dst:
        node = path[-1]
        hops = view.next_hops(node, dst)
        if not hops:
            raise ProbeError(f"{src} -> {dst}: no next hop at {node}")
        if len(hops) == 1:
            nxt = hops[0]
        else:
            packets = {h: seen.get((node, view.port(node, h)), {}).get(key, 0) for h in hops}
            nxt = max(packets, key=packets.get)
            if packets[nxt] == 0:
                return None
        path.append(nxt)
        if len(path) > 2 * len(view.switches) + 2:
            raise ProbeError(f"{src} -> {dst}: a loop: {path}")
    return tuple(path)


def observe(view: NetworkView, flows: list[tuple[str, str, Key]], seconds: float) -> list[tuple[str, ...] | None]:
    """Each flow's path, watching the multipath ports until every flow has
    been walked or ``seconds`` have passed (a flow in a retransmission
    time-out sends nothing for a while: one fixed second missed some)."""
    def walked(counts):
        return all(p is not None for p in observed_paths(view, flows, counts))
    return observed_paths(view, flows, capture(list(probe_ports(view)), seconds, done=walked))


def observed_paths(view: NetworkView, flows: list[tuple[str, str, Key]],
                   counts: dict[str, collections.Counter]) -> list[tuple[str, ...] | None]:
    """:func:`walk` for each ``(src host, dst host, key)`` over a
    :func:`capture`'s counts."""
    ports = probe_ports(view)
    seen = {ports[i]: c for i, c in counts.items() if i in ports}
    return [walk(view, s, d, key, seen) for s, d, key in flows]
