"""A fake OpenFlow 1.3 network for tests: simulated flow and group tables on
every switch of a NetworkView, fed with the messages apps produce, and a
packet tracer that answers "which path does this packet take".

Semantics follow the spec and Open vSwitch where it matters:
- highest-priority matching entry wins; ADD replaces an entry with the same
  table, priority and match; non-strict DELETE removes entries at least as
  specific as the given match whose cookie matches under the mask;
- deleting a group removes the flows that use it;
- a SELECT group picks ``buckets[hash % len(buckets)]`` with the same
  symmetric 5-tuple hash at every switch, as OVS's ``hash(sym_l4(0))`` does,
  so layer-correlated (polarised) ECMP shows up here as it does on OVS;
- output to CONTROLLER is recorded as a PacketIn (the packet would wait for
  the controller).
"""

from __future__ import annotations

import ipaddress
import zlib
from dataclasses import dataclass, field
from typing import Any

from controller import ofmsg
from controller.network_view import NetworkView

MAX_HOPS = 64


@dataclass
class _Entry:
    flow: ofmsg.FlowMod
    packets: int = 0
    bytes: int = 0

    @property
    def key(self) -> tuple[int, int, ofmsg.Match]:
        return (self.flow.table_id, self.flow.priority, self.flow.match)


class FakeSwitch:
    def __init__(self, name: str, dpid: int):
        self.name = name
        self.dpid = dpid
        self.entries: dict[tuple[int, int, ofmsg.Match], _Entry] = {}
        self.groups: dict[int, ofmsg.GroupMod] = {}
        self.meters: dict[int, ofmsg.MeterMod] = {}
        self.errors: list[str] = []

    # ---- message application -------------------------------------------
    def apply(self, msg: ofmsg.Message) -> None:
        if isinstance(msg, ofmsg.FlowMod):
            self._flow_mod(msg)
        elif isinstance(msg, ofmsg.GroupMod):
            self._group_mod(msg)
        elif isinstance(msg, ofmsg.MeterMod):
            if msg.command == "delete":   # the entries that use it go with it (Open vSwitch's meter delete)
                self.meters.pop(msg.meter_id, None)
                for key, entry in list(self.entries.items()):
                    if any(isinstance(ins, ofmsg.MeterInstruction) and ins.meter_id == msg.meter_id
                           for ins in entry.flow.instructions):
                        del self.entries[key]
            elif msg.command == "add" and msg.meter_id in self.meters:
                self.errors.append(f"meter {msg.meter_id} already exists")
            else:
                self.meters[msg.meter_id] = msg

    def _flow_mod(self, fm: ofmsg.FlowMod) -> None:
        if fm.command in ("add", "modify", "modify_strict"):
            for ins in fm.instructions:
                if isinstance(ins, ofmsg.ApplyActions):
                    for a in ins.actions:
                        if isinstance(a, ofmsg.GroupAction) and a.group_id not in self.groups:
                            self.errors.append(f"flow uses missing group {a.group_id}")
                            return
                if isinstance(ins, ofmsg.MeterInstruction) and ins.meter_id not in self.meters:
                    self.errors.append(f"flow uses missing meter {ins.meter_id}")
                    return
            key = (fm.table_id, fm.priority, fm.match)
            self.entries[key] = _Entry(fm)
            return
        strict = fm.command == "delete_strict"
        for key, entry in list(self.entries.items()):
            f = entry.flow
            if fm.table_id != ofmsg.OFPTT_ALL and f.table_id != fm.table_id:
                continue
            if (f.cookie & fm.cookie_mask) != (fm.cookie & fm.cookie_mask):
                continue
            if strict:
                if f.priority != fm.priority or f.match != fm.match:
                    continue
            elif not _at_least_as_specific(f.match, fm.match):
                continue
            if fm.out_port != ofmsg.OFPP_ANY and fm.out_port not in _output_ports(f):
                continue
            del self.entries[key]

    def _group_mod(self, gm: ofmsg.GroupMod) -> None:
        if gm.command == "delete":
            self.groups.pop(gm.group_id, None)
            for key, entry in list(self.entries.items()):
                if gm.group_id in _groups_used(entry.flow):
                    del self.entries[key]
        elif gm.command == "add":
            if gm.group_id in self.groups:
                self.errors.append(f"group {gm.group_id} already exists")
                return
            self.groups[gm.group_id] = gm
        else:
            if gm.group_id not in self.groups:
                self.errors.append(f"modify of unknown group {gm.group_id}")
                return
            self.groups[gm.group_id] = gm

    # ---- lookup -----------------------------------------------------------
    def lookup(self, table_id: int, pkt: dict[str, Any]) -> _Entry | None:
        best = None
        for entry in self.entries.values():
            f = entry.flow
            if f.table_id == table_id and _matches(f.match, pkt):
                if best is None or f.priority > best.flow.priority:
                    best = entry
        return best

    def flows(self, table_id: int | None = None) -> list[ofmsg.FlowMod]:
        return [e.flow for e in self.entries.values()
                if table_id is None or e.flow.table_id == table_id]


@dataclass
class Hop:
    switch: str
    in_port: int
    out_port: int | None
    queue_id: int | None
    pkt: dict[str, Any]
    meters: tuple[int, ...] = ()   # meters the packet passed through at this switch


@dataclass
class Trace:
    hops: list[Hop] = field(default_factory=list)
    delivered_to: str | None = None
    packet_in: bool = False
    dropped_at: str | None = None

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(h.switch for h in self.hops)


class FakeNetwork:
    def __init__(self, view: NetworkView):
        self.view = view
        self.switches = {sw: FakeSwitch(sw, view.dpid(sw)) for sw in view.switches}
        self.packet_ins: list[tuple[str, dict[str, Any]]] = []

    def restart(self, switch: str) -> None:
        """The switch restarted (or its tables were cleared): it comes back
        with empty flow, group and meter tables, as a real one does."""
        self.switches[switch] = FakeSwitch(switch, self.view.dpid(switch))

    def apply(self, switch: str, msgs: list[ofmsg.Message]) -> None:
        sw = self.switches[switch]
        for m in msgs:
            sw.apply(m)

    def flow_stats(self, switch: str, req: ofmsg.FlowStatsRequest) -> list[tuple[dict, int]]:
        """What a flow-stats reply would carry: (match fields, byte count) of
        the table's entries whose cookie matches under the mask."""
        out = []
        for e in self.switches[switch].entries.values():
            f = e.flow
            if f.table_id == req.table_id and (f.cookie & req.cookie_mask) == (req.cookie & req.cookie_mask):
                out.append((f.match.as_dict(), e.bytes))
        return sorted(out, key=lambda t: sorted(t[0].items()))

    def held(self, switch: str) -> ofmsg.Held:
        """What a switch's read-back would report (:class:`ofmsg.Held`)."""
        sw = self.switches[switch]

        def layout(gm: ofmsg.GroupMod):
            if gm.group_type != "select" or any(len(b.actions) != 1 or not isinstance(b.actions[0], ofmsg.Output)
                                                for b in gm.buckets):
                return None
            return tuple(b.actions[0].port for b in gm.buckets)
        def output(fm: ofmsg.FlowMod):
            ports = [a.port for ins in fm.instructions if isinstance(ins, ofmsg.ApplyActions)
                     for a in ins.actions if isinstance(a, ofmsg.Output)]
            return ports[0] if len(ports) == 1 else None
        outs = {k: output(e.flow) for k, e in sw.entries.items()}
        return ofmsg.Held(flows={k: e.flow.cookie for k, e in sw.entries.items()},
                          groups={gid: layout(gm) for gid, gm in sw.groups.items()}, meters=set(sw.meters),
                          outputs={k: p for k, p in outs.items() if p is not None})

    def errors(self) -> dict[str, list[str]]:
        return {n: s.errors for n, s in self.switches.items() if s.errors}

    def tables_snapshot(self) -> dict[str, tuple]:
        """Per switch: its entries (with the identity of each installed entry,
        so one that was deleted and added again differs: its counters would
        have restarted), groups and meters -- to compare before and after."""
        return {n: (frozenset((k, id(e)) for k, e in s.entries.items()), dict(s.groups), dict(s.meters))
                for n, s in self.switches.items()}

    # ---- packets ------------------------------------------------------------
    def packet(self, src: str, dst: str, proto: str = "tcp", sport: int = 40000,
               dport: int = 80, dscp: int = 0, length: int = 64) -> dict[str, Any]:
        v = self.view
        pkt: dict[str, Any] = {"eth_src": v.graph.nodes[src]["mac"], "eth_dst": v.graph.nodes[dst]["mac"],
                               "len": length}
        if proto == "arp":
            pkt.update(eth_type=ofmsg.ETH_TYPE_ARP, arp_spa=v.ip(src), arp_tpa=v.ip(dst), arp_op=1)
            return pkt
        pkt.update(eth_type=ofmsg.ETH_TYPE_IP, ipv4_src=v.ip(src), ipv4_dst=v.ip(dst), ip_dscp=dscp)
        if proto == "tcp":
            pkt.update(ip_proto=ofmsg.IPPROTO_TCP, tcp_src=sport, tcp_dst=dport)
        elif proto == "udp":
            pkt.update(ip_proto=ofmsg.IPPROTO_UDP, udp_src=sport, udp_dst=dport)
        return pkt

    def trace(self, src: str, pkt: dict[str, Any]) -> Trace:
        """Send ``pkt`` from host ``src`` and follow it through the tables."""
        trace = Trace()
        node, in_port = self.view.host_switch(src)
        pkt = dict(pkt)
        for _ in range(MAX_HOPS):
            sw = self.switches[node]
            out_port, queue_id, pkt, to_controller, meters = self._process(sw, in_port, pkt)
            trace.hops.append(Hop(node, in_port, out_port, queue_id, dict(pkt), tuple(meters)))
            if to_controller:
                trace.packet_in = True
                self.packet_ins.append((node, dict(pkt)))
                return trace
            if out_port is None:
                trace.dropped_at = node
                return trace
            peer = self.view.peer(node, out_port)
            if peer is None or not self.view.link_up(node, peer):
                trace.dropped_at = node
                return trace
            if self.view.is_host(peer):
                trace.delivered_to = peer
                return trace
            in_port = self.view.port(peer, node)
            node = peer
        first = trace.hops[0]
        raise RuntimeError(f"forwarding loop: {trace.path}; the packet {pkt}; entries met: "
                           + " | ".join(self._explain(h.switch, h.in_port, h.pkt) for h in trace.hops[:2])
                           + f" (first hop in at port {first.in_port})")

    def _explain(self, switch: str, in_port: int, pkt: dict[str, Any]) -> str:
        """What each table of ``switch`` matches for ``pkt`` (a loop's diagnosis)."""
        sw = self.switches[switch]
        found = []
        for table in sorted({e.flow.table_id for e in sw.entries.values()}):
            e = sw.lookup(table, dict(pkt, in_port=in_port))
            if e is not None:
                found.append(f"t{table} prio {e.flow.priority} cookie {e.flow.cookie:#x} "
                             f"{dict(e.flow.match.items()) if hasattr(e.flow.match, 'items') else e.flow.match} "
                             f"-> {e.flow.instructions}"[:400])
        return f"{switch}: " + "; ".join(found) + f"; groups {sorted(sw.groups)}"

    def _process(self, sw: FakeSwitch, in_port: int, pkt: dict[str, Any]):
        pkt = dict(pkt, in_port=in_port)
        table = 0
        out_port = queue_id = None
        to_controller = False
        meters: list[int] = []
        while table is not None:
            entry = sw.lookup(table, pkt)
            if entry is None:
                break  # table miss: drop
            entry.packets += 1
            entry.bytes += pkt.get("len", 0)
            table = None
            for ins in entry.flow.instructions:
                if isinstance(ins, ofmsg.GotoTable):
                    table = ins.table_id
                elif isinstance(ins, ofmsg.MeterInstruction):
                    meters.append(ins.meter_id)
                elif isinstance(ins, ofmsg.ApplyActions):
                    actions = list(ins.actions)
                    while actions:
                        a = actions.pop(0)
                        if isinstance(a, ofmsg.Output):
                            if a.port == ofmsg.OFPP_CONTROLLER:
                                to_controller = True
                            else:
                                out_port = a.port
                        elif isinstance(a, ofmsg.SetQueue):
                            queue_id = a.queue_id
                        elif isinstance(a, ofmsg.SetField):
                            pkt[a.field] = a.value
                        elif isinstance(a, ofmsg.GroupAction):
                            actions[:0] = self._group_actions(sw, a.group_id, pkt)
                        elif isinstance(a, ofmsg.Resubmit):
                            actions[:0] = self._resubmit(sw, a.table_id, pkt)
                        elif isinstance(a, ofmsg.Learn):
                            self._learn(sw, a, pkt)
        pkt.pop("in_port", None)
        return out_port, queue_id, pkt, to_controller, meters

    def _resubmit(self, sw: FakeSwitch, table_id: int, pkt: dict[str, Any]) -> list:
        """OVS resubmit: the matching entry's actions run here (a miss runs
        nothing); its goto instructions are ignored."""
        entry = sw.lookup(table_id, pkt)
        if entry is None:
            return []
        entry.packets += 1
        entry.bytes += pkt.get("len", 0)
        return [a for ins in entry.flow.instructions if isinstance(ins, ofmsg.ApplyActions) for a in ins.actions]

    @staticmethod
    def _learn(sw: FakeSwitch, learn: ofmsg.Learn, pkt: dict[str, Any]) -> None:
        fields = {f: pkt[f] for f in learn.copy_fields if f in pkt}
        if len(fields) != len(learn.copy_fields):
            return
        match = ofmsg.Match.of(**fields, **dict(learn.fixed))
        key = (learn.table_id, learn.priority, match)
        if key not in sw.entries:
            sw.apply(ofmsg.FlowMod(learn.table_id, learn.priority, match, (), "add", learn.cookie,
                                   idle_timeout=learn.idle_timeout))

    def _group_actions(self, sw: FakeSwitch, gid: int, pkt: dict[str, Any]) -> list:
        group = sw.groups[gid]
        live = [b for b in group.buckets if self._bucket_live(sw, b)]
        if not live:
            return []
        if group.group_type == "select":
            return list(live[flow_hash(pkt) % len(live)].actions)
        if group.group_type in ("indirect", "ff"):
            return list(live[0].actions)
        return [a for b in live for a in b.actions]

    def _bucket_live(self, sw: FakeSwitch, bucket: ofmsg.Bucket) -> bool:
        """Live unless its watch port's link is down (OVS semantics: a bucket
        without a watch port is always live)."""
        if bucket.watch_port == ofmsg.OFPP_ANY:
            return True
        peer = self.view.peer(sw.name, bucket.watch_port)
        return peer is None or self.view.link_up(sw.name, peer)


def flow_hash(pkt: dict[str, Any]) -> int:
    """Symmetric 5-tuple hash, the same at every switch (OVS sym_l4, basis 0)."""
    ends = sorted([(pkt.get("ipv4_src", ""), pkt.get("tcp_src", pkt.get("udp_src", 0))),
                   (pkt.get("ipv4_dst", ""), pkt.get("tcp_dst", pkt.get("udp_dst", 0)))])
    key = f"{ends}|{pkt.get('ip_proto', 0)}".encode()
    h = zlib.crc32(key)
    # crc32's low bits are weak on near-identical inputs: finalise (murmur3 fmix32)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    h ^= h >> 16
    return h


def _value_matches(field_value: Any, want: Any) -> bool:
    if isinstance(want, tuple):
        value, mask = want
        if isinstance(value, str) and "." in value:
            fv = int(ipaddress.IPv4Address(field_value))
            return (fv & int(ipaddress.IPv4Address(mask))) == (int(ipaddress.IPv4Address(value))
                                                                & int(ipaddress.IPv4Address(mask)))
        return (field_value & mask) == (value & mask)
    return field_value == want


def _matches(match: ofmsg.Match, pkt: dict[str, Any]) -> bool:
    for name, want in match.fields:
        if name not in pkt or not _value_matches(pkt[name], want):
            return False
    return True


def _at_least_as_specific(entry_match: ofmsg.Match, filter_match: ofmsg.Match) -> bool:
    have = entry_match.as_dict()
    return all(have.get(k) == v for k, v in filter_match.fields)


def _output_ports(fm: ofmsg.FlowMod) -> set[int]:
    """The ports an entry's actions output to (OpenFlow's out_port filter)."""
    return {a.port for ins in fm.instructions if isinstance(ins, ofmsg.ApplyActions)
            for a in ins.actions if isinstance(a, ofmsg.Output)}


def _groups_used(fm: ofmsg.FlowMod) -> set[int]:
    return {a.group_id for ins in fm.instructions if isinstance(ins, ofmsg.ApplyActions)
            for a in ins.actions if isinstance(a, ofmsg.GroupAction)}
