"""OpenFlow 1.3 messages as plain, immutable objects (no datapath, no os-ken).

Apps return lists of these; :mod:`controller.ofsend` is the one place that
turns them into os-ken/Ryu parser objects and sends them, and
:mod:`bwtesting.fakenet` applies them to simulated switches in tests.
Match field names are the OXM names os-ken uses (``ipv4_dst``, ``arp_tpa``,
``ip_dscp``...); a masked value is a ``(value, mask)`` tuple.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

OFPP_IN_PORT = 0xFFFFFFF8
OFPP_CONTROLLER = 0xFFFFFFFD
OFPP_ANY = 0xFFFFFFFF
OFPG_ANY = 0xFFFFFFFF
OFPTT_ALL = 0xFF
OFPCML_NO_BUFFER = 0xFFFF

ETH_TYPE_IP = 0x0800
ETH_TYPE_ARP = 0x0806
IPPROTO_TCP = 6
IPPROTO_UDP = 17


@dataclass(frozen=True)
class Match:
    fields: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, **kwargs: Any) -> "Match":
        return cls(tuple(sorted(kwargs.items())))

    def as_dict(self) -> dict[str, Any]:
        return dict(self.fields)


# ---- actions ---------------------------------------------------------------
@dataclass(frozen=True)
class Output:
    port: int
    max_len: int = OFPCML_NO_BUFFER


@dataclass(frozen=True)
class GroupAction:
    group_id: int


@dataclass(frozen=True)
class SetQueue:
    queue_id: int


@dataclass(frozen=True)
class SetField:
    field: str
    value: Any


@dataclass(frozen=True)
class Resubmit:
    """Open vSwitch extension: look the packet up in ``table_id`` now, run
    what matches there, then carry on with this action list."""
    table_id: int


@dataclass(frozen=True)
class Learn:
    """Open vSwitch extension: add to ``table_id`` an entry matching this
    packet's values of ``copy_fields`` plus the ``fixed`` field values (the
    learned entry has no actions: it exists to count)."""
    table_id: int
    priority: int
    idle_timeout: int
    cookie: int
    copy_fields: tuple[str, ...]
    fixed: tuple[tuple[str, int], ...] = ()


Action = Output | GroupAction | SetQueue | SetField | Resubmit | Learn


# ---- instructions ----------------------------------------------------------
@dataclass(frozen=True)
class ApplyActions:
    actions: tuple[Action, ...]


@dataclass(frozen=True)
class GotoTable:
    table_id: int


@dataclass(frozen=True)
class MeterInstruction:
    meter_id: int


Instruction = ApplyActions | GotoTable | MeterInstruction


# ---- messages --------------------------------------------------------------
@dataclass(frozen=True)
class FlowMod:
    table_id: int
    priority: int
    match: Match
    instructions: tuple[Instruction, ...] = ()
    command: str = "add"  # add | modify | modify_strict | delete | delete_strict
    cookie: int = 0
    cookie_mask: int = 0
    idle_timeout: int = 0
    hard_timeout: int = 0
    send_flow_removed: bool = False
    out_port: int = OFPP_ANY
    out_group: int = OFPG_ANY


@dataclass(frozen=True)
class Bucket:
    actions: tuple[Action, ...]
    weight: int = 1
    watch_port: int = OFPP_ANY


@dataclass(frozen=True)
class GroupMod:
    command: str  # add | modify | delete
    group_type: str  # select | all | indirect | ff
    group_id: int
    buckets: tuple[Bucket, ...] = ()


@dataclass(frozen=True)
class MeterMod:
    """A meter with one drop band: traffic above ``rate_kbps`` (bucket of
    ``burst_kbit`` kilobits) is dropped."""
    command: str  # add | modify | delete
    meter_id: int
    rate_kbps: int = 0
    burst_kbit: int = 0


@dataclass(frozen=True)
class PacketOut:
    in_port: int
    actions: tuple[Action, ...]
    data: bytes = field(default=b"", repr=False)




# ---- builders --------------------------------------------------------------
def flow_add(table_id: int, priority: int, match: Match, actions: Iterable[Action] = (),
             goto: int | None = None, cookie: int = 0, idle_timeout: int = 0,
             hard_timeout: int = 0, send_flow_removed: bool = False) -> FlowMod:
    instructions: list[Instruction] = []
    actions = tuple(actions)
    if actions:
        instructions.append(ApplyActions(actions))
    if goto is not None:
        instructions.append(GotoTable(goto))
    return FlowMod(table_id, priority, match, tuple(instructions), "add", cookie, 0,
                   idle_timeout, hard_timeout, send_flow_removed)


def flow_delete(cookie: int, cookie_mask: int, table_id: int = OFPTT_ALL,
                match: Match = Match(), out_port: int = OFPP_ANY) -> FlowMod:
    """Delete (non-strict) every entry whose cookie matches under the mask
    (and, with ``out_port``, that outputs to that port)."""
    return FlowMod(table_id, 0, match, (), "delete", cookie, cookie_mask, out_port=out_port)


def flow_delete_strict(table_id: int, priority: int, match: Match, cookie: int = 0,
                       cookie_mask: int = 0) -> FlowMod:
    return FlowMod(table_id, priority, match, (), "delete_strict", cookie, cookie_mask)


def group_select(group_id: int, ports: Iterable[int], command: str = "add") -> GroupMod:
    """A SELECT group, one bucket per entry of ``ports``; each bucket watches
    its port so the switch stops hashing onto a dead link at once."""
    return GroupMod(command, "select", group_id,
                    tuple(Bucket((Output(p),), weight=1, watch_port=p) for p in ports))


def group_delete(group_id: int) -> GroupMod:
    return GroupMod("delete", "select", group_id)


def _rank(msg: Message) -> int:
    if isinstance(msg, FlowMod) and msg.command.startswith("delete"):
        return 0
    if isinstance(msg, (GroupMod, MeterMod)):
        return 1 if msg.command == "delete" else 2
    if isinstance(msg, FlowMod):
        return 3
    return 4


def ordered(msgs: Iterable[Message]) -> list[Message]:
    """Deduplicate and order: flow deletes, group/meter deletes, group/meter
    adds/mods, flow adds/mods, then packet-outs (groups and meters exist
    before flows use them)."""
    seen: set[Message] = set()
    unique = []
    for m in msgs:
        if m not in seen:
            seen.add(m)
            unique.append(m)
    return sorted(unique, key=_rank)  # stable: keeps the callers' order within a rank


@dataclass(frozen=True)
class PortDescRequest:
    """Ask a switch for its ports (reply: EventOFPPortDescStatsReply)."""


@dataclass(frozen=True)
class FlowStatsRequest:
    """Ask for the entries (and counters) of one table, optionally only those
    whose cookie matches under the mask (reply: EventOFPFlowStatsReply)."""
    table_id: int
    cookie: int = 0
    cookie_mask: int = 0


@dataclass(frozen=True)
class RoleRequest:
    """This controller's role on a switch (OpenFlow 1.3 multiple controllers):
    "master" or "slave", with the election's generation -- the switch
    refuses a request whose generation is older than one it has seen."""
    role: str
    generation_id: int


@dataclass(frozen=True)
class GroupDescRequest:
    """Ask for every group and its buckets (reply: EventOFPGroupDescStatsReply)."""


@dataclass(frozen=True)
class MeterConfigRequest:
    """Ask for every meter's configuration (reply: EventOFPMeterConfigStatsReply)."""


@dataclass
class Held:
    """What a switch holds, read back when it (re)connects, so that the
    controller brings it to the current view without wiping what works
    (``switch_reconciled``).

    ``flows``: each entry's (table, priority, match) -> its cookie.
    ``groups``: group id -> the output port of each bucket in order, for a
    select group whose every bucket is one output (what routing installs);
    None for any other group. ``meters``: the meter ids. ``outputs``: the
    port of each entry whose actions output to exactly one port (absent:
    none or several) -- where an adopted entry sends its flow."""
    flows: dict[tuple[int, int, Match], int] = field(default_factory=dict)
    groups: dict[int, tuple[int, ...] | None] = field(default_factory=dict)
    meters: set[int] = field(default_factory=set)
    outputs: dict[tuple[int, int, Match], int] = field(default_factory=dict)

    def owned(self, app_cookie: int) -> list[tuple[int, int, Match]]:
        """The keys of the entries whose cookie is an app's (top 16 bits), in order."""
        top = app_cookie >> 48
        return sorted((k for k, c in self.flows.items() if c >> 48 == top), key=_key_order)


def _key_order(key: tuple[int, int, Match]) -> tuple:
    return (key[0], key[1], repr(key[2].fields))


@dataclass(frozen=True)
class EchoRequest:
    """OpenFlow echo; the reply carries ``data`` back (used to time RTTs)."""
    data: bytes = b""


@dataclass(frozen=True)
class PortStatsRequest:
    """Ask for every port's counters (reply: EventOFPPortStatsReply)."""


Message = (FlowMod | GroupMod | MeterMod | PacketOut | PortDescRequest | FlowStatsRequest | EchoRequest
           | PortStatsRequest | GroupDescRequest | MeterConfigRequest | RoleRequest)
