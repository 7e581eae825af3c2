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

PRIO_DEFAULT = 0
PRIO_ROUTE = 100
PRIO_CLASSIFY = 100
PRIO_EXACT_FLOW = 1000

APP_PIPELINE = 1
APP_ROUTING = 2
APP_PRIO_QUEUES = 3
APP_LESSOR = 4

COOKIE_APP_MASK = 0xFFFF << 48


def cookie(app_id: int, detail: int = 0) -> int:
    return (app_id << 48) | (detail & ((1 << 48) - 1))


def pipeline_defaults() -> list[ofmsg.Message]:
    """Table 0's default: hand every packet to the forwarding table."""
    return [ofmsg.flow_add(TABLE_CLASSIFY, PRIO_DEFAULT, ofmsg.Match(),
                           goto=TABLE_FORWARD, cookie=cookie(APP_PIPELINE))]


def wipe_app(app_id: int) -> ofmsg.FlowMod:
    return ofmsg.flow_delete(cookie(app_id), COOKIE_APP_MASK)
