"""Two-priority BG/WC classification keyed on the IP ToS byte (pure logic).

Table 0 (TABLE_CLASSIFY) of every switch, before any routing app's table:

    prio 303  ip, udp, any dscp           -> dscp := 0 (BG), set_queue(BG), goto forwarding
    prio 302  ip, dscp 0 (ToS 0x00, BG)   -> set_queue(BG), goto forwarding
    prio 302  ip, dscp 8 (ToS 0x20, WC)   -> set_queue(WC), goto forwarding
    prio 301  ip, any other dscp          -> dscp := 8 (WC), set_queue(WC), goto forwarding
    prio 0    anything else (ARP...)      -> goto forwarding (pipeline default, queue 0 = BG)

So no marking lets a tenant into the high queue: only ToS 0x00 is BG (hosts
mark BG TCP subflows and UDP 0x00 and rate-limit that to the guarantee), an
unknown ToS is rewritten to WC at the first switch it meets (and at every
later one). ECN bits are not part of the match and are kept.

UDP counts as BG whatever its ToS (the paper's rule): it has no congestion
control, so in the WC queue it would not share the spare bandwidth but take
it, starving the WC subflows -- and, through MPTCP's in-order delivery, the
BG subflows of the same connections (measured: a host's BG fell to 0.57 of
its guarantee while an unmanaged host sent EF-marked UDP at the link rate).
As BG it falls under the sender's ToR meter below, i.e. its guarantee.

Beyond the paper, a second line of enforcement: for hosts with a configured
guarantee, the ToR meters BG arriving from the host's port (an OpenFlow
meter with a drop band at the guarantee; meter id = the port number), so a
host that ignores its agent cannot push more than its guarantee into the
high-priority queues:

    prio 311  in_port=<host>, ip, udp     -> meter(<port>), dscp := 0, set_queue(BG), goto forwarding
    prio 310  in_port=<host>, ip, dscp 0  -> meter(<port>), set_queue(BG), goto forwarding

``set_queue`` picks the OVSDB QoS queue on kernel-datapath OVS and on
Pica8; on userspace OVS it does not steer packets, and the tc back-end
(:mod:`mininet_topos.queues`) classifies the same ToS values at each
port's egress instead. Both back-ends use the queue numbers below.
"""

from __future__ import annotations

from bwcommon import contract
from controller import ofmsg
from bwcommon.contract import DSCP_BG, DSCP_WC, QUEUE_BG, QUEUE_WC, TOS_BG, TOS_WC  # noqa: F401 (re-exported)
from controller.network_view import NetworkView
from bwcommon.validate import finite_number
from controller.pipeline import APP_PRIO_QUEUES, PRIO_CLASSIFY, TABLE_CLASSIFY, TABLE_FORWARD, cookie, wipe_app

PRIO_UDP = PRIO_CLASSIFY + 203
PRIO_KNOWN = PRIO_CLASSIFY + 202
PRIO_REWRITE = PRIO_CLASSIFY + 201
PRIO_METERED = PRIO_CLASSIFY + 210
PRIO_METERED_UDP = PRIO_CLASSIFY + 211
# Meter burst (kilobits, as OpenFlow counts it for kb/s meters): the host
# marker's bucket (bwcommon.contract.bg_burst_bytes: 50 ms at the rate,
# never below two GSO super-packets), so that what a host lets out as BG
# passes its ToR's meter. A smaller bucket drops a host that keeps to its
# guarantee on average (seen: BG dips to half at 25 Mb/s with a 72 KB
# bucket); one smaller than a frame drops every frame of that size
# (userspace OVS does exactly that).
BURST_S = contract.BG_BURST_S
MIN_BURST_KBIT = contract.BG_BURST_MIN_BYTES * 8 // 1000


def classification_entries() -> list[ofmsg.Message]:
    ck = cookie(APP_PRIO_QUEUES)
    ip = dict(eth_type=ofmsg.ETH_TYPE_IP)
    return [
        ofmsg.flow_add(TABLE_CLASSIFY, PRIO_UDP, ofmsg.Match.of(**ip, ip_proto=ofmsg.IPPROTO_UDP),
                       [ofmsg.SetField("ip_dscp", DSCP_BG), ofmsg.SetQueue(QUEUE_BG)],
                       goto=TABLE_FORWARD, cookie=ck),
        ofmsg.flow_add(TABLE_CLASSIFY, PRIO_KNOWN, ofmsg.Match.of(**ip, ip_dscp=DSCP_BG),
                       [ofmsg.SetQueue(QUEUE_BG)], goto=TABLE_FORWARD, cookie=ck),
        ofmsg.flow_add(TABLE_CLASSIFY, PRIO_KNOWN, ofmsg.Match.of(**ip, ip_dscp=DSCP_WC),
                       [ofmsg.SetQueue(QUEUE_WC)], goto=TABLE_FORWARD, cookie=ck),
        ofmsg.flow_add(TABLE_CLASSIFY, PRIO_REWRITE, ofmsg.Match.of(**ip),
                       [ofmsg.SetField("ip_dscp", DSCP_WC), ofmsg.SetQueue(QUEUE_WC)],
                       goto=TABLE_FORWARD, cookie=ck),
    ]


class PrioQueuesLogic:
    """Installs the classification table on every switch that connects; it
    composes with whichever routing app owns table 1. ``guarantees_mbps``
    (host -> Mb/s) adds the ToR meters."""

    def __init__(self, view: NetworkView | None = None, guarantees_mbps: dict[str, float] | None = None,
                 burst_kbit: int | None = None):
        guarantees_mbps = guarantees_mbps or {}
        if guarantees_mbps and view is None:
            raise ValueError("prio_queues: guarantees need the network view")
        problems = []
        for host, mbps in sorted(guarantees_mbps.items()):
            if view is not None and (host not in view.graph or not view.is_host(host)):
                problems.append(f"{host!r} is not a host of the topology")
            elif not finite_number(mbps) or mbps <= 0:
                problems.append(f"{host}: guarantee {mbps!r} must be a positive number of Mb/s")
            elif mbps > view.capacity(host, view.host_switch(host)[0]) / 1e6:
                problems.append(f"{host}: guarantee {mbps} Mb/s exceeds its link")
        if burst_kbit is not None and (not isinstance(burst_kbit, int) or isinstance(burst_kbit, bool)
                                       or not 0 < burst_kbit < 2**32):
            problems.append(f"burst_kbit {burst_kbit!r} must be a positive integer (kilobits) below 2^32")
        if problems:
            raise ValueError("prio_queues: " + "; ".join(problems))
        self.view = view
        self.guarantees = dict(guarantees_mbps)
        self.burst_kbit = burst_kbit

    def switch_connected(self, switch: str) -> list[ofmsg.Message]:
        msgs: list[ofmsg.Message] = [wipe_app(APP_PRIO_QUEUES), *classification_entries()]
        # meters are ours by id (= host port): delete every host port's, so a
        # guarantee removed while the switch kept its tables leaves no meter behind
        if self.view is not None:
            ports = sorted({self.view.port(switch, h) for h in self.view.graph.successors(switch)
                            if self.view.is_host(h)})
            msgs.extend(ofmsg.MeterMod("delete", port) for port in ports)
        for host, mbps in sorted(self.guarantees.items()):
            sw, _ = self.view.host_switch(host)
            if sw == switch:
                msgs.extend(self._meter_entries(host, mbps, "add"))
        return ofmsg.ordered(msgs)

    def _meter_match(self, port: int, prio: int) -> ofmsg.Match:
        fields = dict(ip_dscp=DSCP_BG) if prio == PRIO_METERED else dict(ip_proto=ofmsg.IPPROTO_UDP)
        return ofmsg.Match.of(in_port=port, eth_type=ofmsg.ETH_TYPE_IP, **fields)

    def _meter_entries(self, host: str, mbps: float, command: str) -> list[ofmsg.Message]:
        """A host's meter and its two metered entries (``add``), the meter
        alone (``modify``: a new rate), or the entries and then the meter
        (``delete``)."""
        if command not in ("add", "modify", "delete"):
            raise ValueError(f"prio_queues: meter command {command!r} (add, modify, delete)")
        _, port = self.view.host_switch(host)
        rate = int(mbps * 1000)
        if command == "modify":
            return [ofmsg.MeterMod("modify", port, rate, self.burst_kbit or contract.meter_burst_kbit(rate))]
        if command == "delete":
            return [*(ofmsg.flow_delete_strict(TABLE_CLASSIFY, prio, self._meter_match(port, prio),
                                               cookie=cookie(APP_PRIO_QUEUES))
                      for prio in (PRIO_METERED, PRIO_METERED_UDP)), ofmsg.MeterMod("delete", port)]
        msgs: list[ofmsg.Message] = [ofmsg.MeterMod("add", port, rate, self.burst_kbit or contract.meter_burst_kbit(rate))]
        for prio, actions in ((PRIO_METERED, (ofmsg.SetQueue(QUEUE_BG),)),
                              (PRIO_METERED_UDP, (ofmsg.SetField("ip_dscp", DSCP_BG), ofmsg.SetQueue(QUEUE_BG)))):
            msgs.append(ofmsg.FlowMod(TABLE_CLASSIFY, prio, self._meter_match(port, prio),
                                      (ofmsg.MeterInstruction(port), ofmsg.ApplyActions(actions),
                                       ofmsg.GotoTable(TABLE_FORWARD)), cookie=cookie(APP_PRIO_QUEUES)))
        return msgs

    def update(self, guarantees_mbps: dict[str, float], burst_kbit: int | None = None) -> dict[str, list[ofmsg.Message]]:
        """A new set of metered guarantees (a reload, an API change): the
        messages per ToR that change only the hosts whose guarantee moved --
        every other host's meter and entries stay untouched. Checked as at
        start; a refused set changes nothing."""
        new = PrioQueuesLogic(self.view, guarantees_mbps, burst_kbit)
        out: dict[str, list[ofmsg.Message]] = {}
        burst_changed = burst_kbit != self.burst_kbit
        self.burst_kbit = burst_kbit
        for host in sorted(set(self.guarantees) | set(new.guarantees)):
            old_rate, new_rate = self.guarantees.get(host), new.guarantees.get(host)
            if old_rate == new_rate and not (burst_changed and new_rate is not None):
                continue
            command = "add" if old_rate is None else "delete" if new_rate is None else "modify"
            sw, _ = self.view.host_switch(host)
            out.setdefault(sw, []).extend(self._meter_entries(host, new_rate or old_rate, command))
        self.guarantees = dict(new.guarantees)
        return {sw: ofmsg.ordered(msgs) for sw, msgs in out.items()}
