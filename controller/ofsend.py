"""The one exit to switches: plain messages -> os-ken/Ryu parser objects -> wire.

``to_parser`` needs only an object with ``ofproto`` and ``ofproto_parser``
(a real Datapath, or ``ProtocolDesc`` in tests), so the translation is tested
by serialising, without a switch.
"""

from __future__ import annotations

from typing import Any, Iterable

from controller import ofmsg

_FLOW_COMMANDS = {"add": "OFPFC_ADD", "modify": "OFPFC_MODIFY", "modify_strict": "OFPFC_MODIFY_STRICT",
                  "delete": "OFPFC_DELETE", "delete_strict": "OFPFC_DELETE_STRICT"}
_GROUP_COMMANDS = {"add": "OFPGC_ADD", "modify": "OFPGC_MODIFY", "delete": "OFPGC_DELETE"}
_GROUP_TYPES = {"select": "OFPGT_SELECT", "all": "OFPGT_ALL", "indirect": "OFPGT_INDIRECT",
                "ff": "OFPGT_FF"}


# OXM field -> (NXM field as os-ken names it, bit width), for learn specs.
_NXM = {"in_port": ("in_port_nxm", 16), "eth_type": ("eth_type_nxm", 16), "ip_proto": ("ip_proto_nxm", 8),
        "ipv4_src": ("ipv4_src_nxm", 32), "ipv4_dst": ("ipv4_dst_nxm", 32),
        "tcp_src": ("tcp_src_nxm", 16), "tcp_dst": ("tcp_dst_nxm", 16),
        "udp_src": ("udp_src_nxm", 16), "udp_dst": ("udp_dst_nxm", 16)}
_NX_IN_PORT = 0xFFF8


def _learn(dp: Any, a: ofmsg.Learn) -> Any:
    p = dp.ofproto_parser
    specs = []
    for name, value in a.fixed:
        nxm, bits = _NXM[name]
        specs.append(p.NXFlowSpecMatch(src=value, dst=(nxm, 0), n_bits=bits))
    for name in a.copy_fields:
        nxm, bits = _NXM[name]
        specs.append(p.NXFlowSpecMatch(src=(nxm, 0), dst=(nxm, 0), n_bits=bits))
    return p.NXActionLearn(table_id=a.table_id, specs=specs, idle_timeout=a.idle_timeout,
                           priority=a.priority, cookie=a.cookie)


def _action(dp: Any, a: ofmsg.Action) -> Any:
    p = dp.ofproto_parser
    if isinstance(a, ofmsg.Resubmit):
        return p.NXActionResubmitTable(in_port=_NX_IN_PORT, table_id=a.table_id)
    if isinstance(a, ofmsg.Learn):
        return _learn(dp, a)
    if isinstance(a, ofmsg.Output):
        return p.OFPActionOutput(a.port, a.max_len)
    if isinstance(a, ofmsg.GroupAction):
        return p.OFPActionGroup(a.group_id)
    if isinstance(a, ofmsg.SetQueue):
        return p.OFPActionSetQueue(a.queue_id)
    if isinstance(a, ofmsg.SetField):
        return p.OFPActionSetField(**{a.field: a.value})
    raise TypeError(f"unknown action {a!r}")


def _instruction(dp: Any, ins: ofmsg.Instruction) -> Any:
    p, ofp = dp.ofproto_parser, dp.ofproto
    if isinstance(ins, ofmsg.ApplyActions):
        return p.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, [_action(dp, a) for a in ins.actions])
    if isinstance(ins, ofmsg.GotoTable):
        return p.OFPInstructionGotoTable(ins.table_id)
    if isinstance(ins, ofmsg.MeterInstruction):
        return p.OFPInstructionMeter(ins.meter_id, ofp.OFPIT_METER)
    raise TypeError(f"unknown instruction {ins!r}")


def to_parser(dp: Any, msg: ofmsg.Message) -> Any:
    p, ofp = dp.ofproto_parser, dp.ofproto
    if isinstance(msg, ofmsg.FlowMod):
        flags = ofp.OFPFF_SEND_FLOW_REM if msg.send_flow_removed else 0
        return p.OFPFlowMod(
            dp, cookie=msg.cookie, cookie_mask=msg.cookie_mask, table_id=msg.table_id,
            command=getattr(ofp, _FLOW_COMMANDS[msg.command]), idle_timeout=msg.idle_timeout,
            hard_timeout=msg.hard_timeout, priority=msg.priority, buffer_id=ofp.OFP_NO_BUFFER,
            out_port=msg.out_port, out_group=msg.out_group, flags=flags,
            match=p.OFPMatch(**msg.match.as_dict()),
            instructions=[_instruction(dp, i) for i in msg.instructions])
    if isinstance(msg, ofmsg.GroupMod):
        buckets = [p.OFPBucket(weight=b.weight if msg.group_type == "select" else 0,
                               watch_port=b.watch_port, watch_group=ofp.OFPG_ANY,
                               actions=[_action(dp, a) for a in b.actions]) for b in msg.buckets]
        return p.OFPGroupMod(dp, getattr(ofp, _GROUP_COMMANDS[msg.command]),
                             getattr(ofp, _GROUP_TYPES[msg.group_type]), msg.group_id, buckets)
    if isinstance(msg, ofmsg.MeterMod):
        command = {"add": ofp.OFPMC_ADD, "modify": ofp.OFPMC_MODIFY, "delete": ofp.OFPMC_DELETE}[msg.command]
        bands = [] if msg.command == "delete" else [p.OFPMeterBandDrop(rate=msg.rate_kbps, burst_size=msg.burst_kbit)]
        return p.OFPMeterMod(dp, command=command, flags=ofp.OFPMF_KBPS | ofp.OFPMF_BURST,
                             meter_id=msg.meter_id, bands=bands)
    if isinstance(msg, ofmsg.PacketOut):
        return p.OFPPacketOut(dp, buffer_id=ofp.OFP_NO_BUFFER, in_port=msg.in_port,
                              actions=[_action(dp, a) for a in msg.actions], data=msg.data)
    if isinstance(msg, ofmsg.PortDescRequest):
        return p.OFPPortDescStatsRequest(dp, 0)
    if isinstance(msg, ofmsg.EchoRequest):
        return p.OFPEchoRequest(dp, msg.data)
    if isinstance(msg, ofmsg.PortStatsRequest):
        return p.OFPPortStatsRequest(dp, 0, ofp.OFPP_ANY)
    if isinstance(msg, ofmsg.FlowStatsRequest):
        return p.OFPFlowStatsRequest(dp, 0, msg.table_id, ofp.OFPP_ANY, ofp.OFPG_ANY,
                                     msg.cookie, msg.cookie_mask, p.OFPMatch())
    if isinstance(msg, ofmsg.RoleRequest):
        role = {"master": ofp.OFPCR_ROLE_MASTER, "slave": ofp.OFPCR_ROLE_SLAVE}[msg.role]
        return p.OFPRoleRequest(dp, role, msg.generation_id & 0xFFFFFFFFFFFFFFFF)
    if isinstance(msg, ofmsg.GroupDescRequest):
        return p.OFPGroupDescStatsRequest(dp, 0)
    if isinstance(msg, ofmsg.MeterConfigRequest):
        return p.OFPMeterConfigStatsRequest(dp, 0, ofp.OFPM_ALL)
    raise TypeError(f"unknown message {msg!r}")


def send(dp: Any, msgs: Iterable[ofmsg.Message]) -> int:
    """Translate and send, in the given order; returns how many were sent."""
    n = 0
    for msg in msgs:
        dp.send_msg(to_parser(dp, msg))
        n += 1
    return n


def send_request(dp: Any, msg: ofmsg.Message) -> int:
    """Translate and send one request; returns its xid (its reply carries it)."""
    parsed = to_parser(dp, msg)
    xid = dp.set_xid(parsed)
    dp.send_msg(parsed)
    return xid
