"""The way back from switches: os-ken/Ryu reply objects -> plain contents.

A switch that (re)connects is read before it is written
(:class:`controller.ofmsg.Held`): its entries' keys and cookies, its groups'
buckets and its meter ids, from the bodies of the multipart replies to
``FlowStatsRequest(OFPTT_ALL)``, ``GroupDescRequest`` and
``MeterConfigRequest``. The apps then reconcile it make-before-break
instead of wiping it (``switch_reconciled``). Matches come back in the form
:class:`controller.ofmsg.Match` uses (os-ken's OXM names, a masked value as
``(value, mask)``), so a held entry and the one an app would install compare
equal.
"""

from __future__ import annotations

from typing import Any, Iterable

from controller import ofmsg

OFPGT_SELECT = 1   # ofproto_v1_3.OFPGT_SELECT
OFPAT_OUTPUT = 0   # ofproto_v1_3.OFPAT_OUTPUT


def match_of(parsed: Any) -> ofmsg.Match:
    """An os-ken OFPMatch as :class:`ofmsg.Match` (masked fields as tuples)."""
    return ofmsg.Match(tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in parsed.items())))


def flows(bodies: Iterable[Any]) -> dict[tuple[int, int, ofmsg.Match], int]:
    """(table, priority, match) -> cookie of every entry in flow-stats bodies."""
    return {(s.table_id, s.priority, match_of(s.match)): s.cookie for s in bodies}


def outputs(bodies: Iterable[Any]) -> dict[tuple[int, int, ofmsg.Match], int]:
    """(table, priority, match) -> the output port of every entry whose
    instructions' actions output to exactly one port."""
    out = {}
    for s in bodies:
        ports = [a.port for ins in (s.instructions or ()) for a in (getattr(ins, "actions", None) or ())
                 if getattr(a, "type", None) == OFPAT_OUTPUT]
        if len(ports) == 1:
            out[(s.table_id, s.priority, match_of(s.match))] = ports[0]
    return out


def layout(group: Any) -> tuple[int, ...] | None:
    """A select group's output port per bucket, or None if it is any other
    group (another type, or a bucket that is not exactly one output)."""
    if group.type != OFPGT_SELECT:
        return None
    ports = []
    for bucket in group.buckets:
        acts = list(bucket.actions)
        if len(acts) != 1 or getattr(acts[0], "type", None) != OFPAT_OUTPUT:
            return None
        ports.append(acts[0].port)
    return tuple(ports)


def groups(bodies: Iterable[Any]) -> dict[int, tuple[int, ...] | None]:
    return {g.group_id: layout(g) for g in bodies}


def meters(bodies: Iterable[Any]) -> set[int]:
    return {m.meter_id for m in bodies}
