"""The shared OpenFlow table pipeline and cookie ownership.

Table 0 classifies (QoS: the priority-queue app adds ToS rules here); its
default sends everything on to table 1. Table 1 forwards: routing apps install
per-destination defaults, traffic engineering (LESSOR) installs exact-match
long-flow entries above them. A miss in table 1 drops: nothing floods, so
fabrics with loops are safe.

Each app owns the cookies whose top 16 bits are its ``APP_*`` id, so it can
wipe and reinstall its own entries without touching another app's.
"""

from __future__ import annotations

from controller import ofmsg

TABLE_CLASSIFY = 0
TABLE_FORWARD = 1
# Per-flow byte counters at edge switches (Open vSwitch extensions): the
# forwarding entries resubmit every packet here; a TCP/UDP packet arriving
# from a host port that matches no counter yet *learns* one (5-tuple + in
# port, idle timeout) and goes on being forwarded at once -- no PacketIn, no
# controller round trip. Traffic-engineering apps poll this table.
TABLE_ACCOUNT = 3
PRIO_ACCOUNT_LEARN = 1
PRIO_ACCOUNT_FLOW = 100
ACCOUNT_IDLE_S = 10

PRIO_DEFAULT = 0
PRIO_ROUTE = 100
# a VM's BG on its up-path (apps.lessor.bg_routes), and above it the
# destinations below that switch (they never go up)
PRIO_BG_UP = 200
PRIO_BG_BELOW = 300
PRIO_CLASSIFY = 100
PRIO_EXACT_FLOW = 1000

APP_PIPELINE = 1
APP_ROUTING = 2
APP_PRIO_QUEUES = 3
APP_LESSOR = 4
APP_ACCOUNT = 5  # the learned per-flow counters

COOKIE_APP_MASK = 0xFFFF << 48

# Meter ids, owned as cookies are: prio_queues meters a host's BG with the
# id of the host's port (below METER_LESSOR_BASE on every switch we know);
# LESSOR's receiver fairness polices long flows with ids from the base on.
METER_LESSOR_BASE = 1024
METER_LESSOR_SLOTS = 1024


def cookie(app_id: int, detail: int = 0) -> int:
    return (app_id << 48) | (detail & ((1 << 48) - 1))


def pipeline_defaults() -> list[ofmsg.Message]:
    """Table 0's default: hand every packet to the forwarding table."""
    return [ofmsg.flow_add(TABLE_CLASSIFY, PRIO_DEFAULT, ofmsg.Match(),
                           goto=TABLE_FORWARD, cookie=cookie(APP_PIPELINE))]


def wipe_app(app_id: int) -> ofmsg.FlowMod:
    return ofmsg.flow_delete(cookie(app_id), COOKIE_APP_MASK)


def accounting_entries(host_ports: list[int], owner_cookie: int) -> list[ofmsg.Message]:
    """Table-3 entries of an edge switch: learn a counter per TCP/UDP flow
    entering from each host port."""
    msgs: list[ofmsg.Message] = []
    for port in sorted(host_ports):
        for proto, l4 in ((ofmsg.IPPROTO_TCP, "tcp"), (ofmsg.IPPROTO_UDP, "udp")):
            learn = ofmsg.Learn(TABLE_ACCOUNT, PRIO_ACCOUNT_FLOW, ACCOUNT_IDLE_S, cookie(APP_ACCOUNT),
                                ("in_port", "ipv4_src", "ipv4_dst", f"{l4}_src", f"{l4}_dst"),
                                (("eth_type", ofmsg.ETH_TYPE_IP), ("ip_proto", proto)))
            match = ofmsg.Match.of(in_port=port, eth_type=ofmsg.ETH_TYPE_IP, ip_proto=proto)
            msgs.append(ofmsg.flow_add(TABLE_ACCOUNT, PRIO_ACCOUNT_LEARN, match, [learn], cookie=owner_cookie))
    return msgs
