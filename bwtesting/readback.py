"""A switch's side of the read-back at connection (tests and benchmarks).

A forwarding app reads a (re)connected switch before writing it
(:meth:`controller.app_base.ForwardingApp._switch_features_round`): it asks
for the groups, the meters and every entry. Here the switch answers, with
os-ken's own reply classes holding what :class:`controller.ofmsg.Held`
says -- as a switch connection hands them to the app, without a switch.
"""

from __future__ import annotations

from os_ken.controller import ofp_event
from os_ken.ofproto import ofproto_v1_3 as ofp, ofproto_v1_3_parser as parser

from controller import ofmsg

READ_BACK = ("OFPGroupDescStatsRequest", "OFPMeterConfigStatsRequest", "OFPFlowStatsRequest")


class Msg:
    """An os-ken message as handlers see it: its datapath and fields."""
    xid = None
    flags = 0

    def __init__(self, datapath, **kw):
        self.datapath = datapath
        self.__dict__.update(kw)


def bodies(held: ofmsg.Held) -> dict[str, tuple[type, list]]:
    """Request class name -> (reply event class, reply body) for what ``held`` says."""
    flows = [parser.OFPFlowStats(table_id=t, duration_sec=0, duration_nsec=0, priority=p, idle_timeout=0,
                                 hard_timeout=0, flags=0, cookie=c, packet_count=0, byte_count=0,
                                 match=parser.OFPMatch(**m.as_dict()),
                                 instructions=[] if (t, p, m) not in held.outputs else [
                                     parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS,
                                                                  [parser.OFPActionOutput(held.outputs[(t, p, m)])])])
             for (t, p, m), c in held.flows.items()]
    groups = [parser.OFPGroupDescStats(ofp.OFPGT_SELECT if layout is not None else ofp.OFPGT_ALL, gid,
                                       [parser.OFPBucket(1, port, ofp.OFPG_ANY, [parser.OFPActionOutput(port)])
                                        for port in (layout or ())])
              for gid, layout in held.groups.items()]
    meters = [parser.OFPMeterConfigStats(ofp.OFPMF_KBPS, mid, []) for mid in sorted(held.meters)]
    return {"OFPFlowStatsRequest": (ofp_event.EventOFPFlowStatsReply, flows),
            "OFPGroupDescStatsRequest": (ofp_event.EventOFPGroupDescStatsReply, groups),
            "OFPMeterConfigStatsRequest": (ofp_event.EventOFPMeterConfigStatsReply, meters)}


def answer(app, dp, requests, held: ofmsg.Held | None) -> None:
    """Answer the read-back requests among ``requests`` (parser messages the
    app sent to ``dp``) with what ``held`` says (None: nothing, a switch that
    starts empty); each reply in one part."""
    got = bodies(held if held is not None else ofmsg.Held())
    handlers = {"OFPFlowStatsRequest": app._flow_stats, "OFPGroupDescStatsRequest": app._group_desc,
                "OFPMeterConfigStatsRequest": app._meter_config}
    for req in requests:
        kind = type(req).__name__
        if kind in READ_BACK:
            event, body = got[kind]
            handlers[kind](event(Msg(dp, xid=req.xid, flags=0, body=body)))


def connect(app, dp, held: ofmsg.Held | None = None) -> list:
    """A switch connects (``dp`` records what it is sent in ``dp.sent``):
    features, then its answers to the read-back. Returns the messages the
    app sent after the read-back's requests."""
    start = len(dp.sent)
    app._switch_features(ofp_event.EventOFPSwitchFeatures(Msg(dp)))
    requests = dp.sent[start:]
    mark = len(dp.sent)
    if hasattr(app, "_group_desc"):          # a forwarding app reads back; others install at once
        answer(app, dp, requests, held)
    return dp.sent[mark:]
