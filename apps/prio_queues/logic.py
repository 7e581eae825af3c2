"""Two-priority BG/WC classification keyed on the IP ToS byte (pure logic).

Table 0 (TABLE_CLASSIFY) of every switch, before any routing app's table:

    prio 302  ip, dscp 0 (ToS 0x00, BG)   -> set_queue(BG), goto forwarding
    prio 302  ip, dscp 8 (ToS 0x20, WC)   -> set_queue(WC), goto forwarding
    prio 301  ip, any other dscp          -> dscp := 8 (WC), set_queue(WC), goto forwarding
    prio 0    anything else (ARP...)      -> goto forwarding (pipeline default, queue 0 = BG)

So no marking lets a tenant into the high queue: only ToS 0x00 is BG (hosts
mark BG TCP subflows and UDP 0x00 and rate-limit that to the guarantee), an
unknown ToS is rewritten to WC at the first switch it meets (and at every
later one). ECN bits are not part of the match and are kept.

``set_queue`` picks the OVSDB QoS queue on kernel-datapath OVS and on
Pica8; on userspace OVS it does not steer packets, and the tc back-end
(:mod:`apps.prio_queues.backends`) classifies the same ToS values at each
port's egress instead. Both back-ends use the queue numbers below.
"""

from __future__ import annotations

from controller import ofmsg
from controller.pipeline import APP_PRIO_QUEUES, PRIO_CLASSIFY, TABLE_CLASSIFY, TABLE_FORWARD, cookie

TOS_BG = 0x00
TOS_WC = 0x20
DSCP_BG = TOS_BG >> 2
DSCP_WC = TOS_WC >> 2
QUEUE_BG = 0  # also where unclassified (non-IP) packets go
QUEUE_WC = 1
PRIO_KNOWN = PRIO_CLASSIFY + 202
PRIO_REWRITE = PRIO_CLASSIFY + 201


def classification_entries() -> list[ofmsg.Message]:
    ck = cookie(APP_PRIO_QUEUES)
    ip = dict(eth_type=ofmsg.ETH_TYPE_IP)
    return [
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
    composes with whichever routing app owns table 1."""

    def switch_connected(self, switch: str) -> list[ofmsg.Message]:
        from controller.pipeline import wipe_app
        return [wipe_app(APP_PRIO_QUEUES), *classification_entries()]
