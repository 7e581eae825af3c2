"""What the host agent does, planned as data (pure): a host's BG/WC
configuration -> the sysctl, MPTCP, nftables, tc and BPF-map changes that
put it in force, and the ones that take them away. A thin executor
(:mod:`hostagent.executor`) applies a plan; applying one twice changes
nothing the second time.

The host's shape, per the paper:
- every TCP connection is MPTCP: its first subflow is BG, ``wc_subflows``
  more (MP_JOIN) subflows are WC. The joins go to this host's "signal"
  endpoints, one port each (upstream Linux has no ndiffports);
- nftables marks conntrack entries created by an MP_JOIN SYN and sets ToS
  0x20 (DSCP CS1) on them; everything else leaving the host -- BG subflows,
  UDP, all IP -- gets ToS 0x00 (CS0), so a host can't smuggle traffic into
  a class by its own marking (the switches enforce the same);
- HTB on the interface: ToS 0x00 (BG TCP and UDP) limited to the guarantee
  B_g (hose model) -- or per destination (pipe model: LRC's per-VM-pair
  rates) -- WC unlimited up to the NIC;
- the WC congestion control reads A_l for this VM from a BPF map keyed by
  the VM's IPv4 address (all Mininet hosts share one kernel);
- tcp_rmem's ceiling (per network namespace) holds Eq. 1's buffer, its
  initial size up to ``rcvbuf_initial_kb`` (3 MiB) of it.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from apps.lrc.model import LrcParams
from controller.contract import bg_burst_bytes
from controller.contract import NFT_DSCP_BG, NFT_DSCP_WC, TOS_BG, TOS_MASK, TOS_WC  # noqa: F401 (re-exported)
from controller.validate import IPv4Address, StrictModel, finite_number
from hostagent.netns import NAME_PATTERN as NETNS_NAME   # an `ip netns` name
from hostagent.policy import (DEFAULT_BETA, PAPER_UNIT_MBPS, POLICIES, competition_level, fixed_point,
                              receive_buffer_bytes)

NFT_TABLE = "bwfabric"
CT_MARK_WC = 0x20                 # conntrack mark of WC join subflows (any value would do)
MPTCP_ADD_ADDR = 3                # MPTCP option subtype
TC_HANDLE = "1:"
CLASS_ROOT, CLASS_BG, CLASS_WC = "1:1", "1:10", "1:20"
CLASS_YOUNG = "1:21"             # with the marker: WC of flows in their first BG_PACE_AFTER_BYTES (bwf_mark)
PAIR_CLASS_BASE = 0x100          # pipe model: class 1:<0x100 + slot> per destination
PAIR_PREF_BASE = 10              # ...and its u32 filter at pref 10 + slot (the hose filter is pref 1000)
MAX_PAIRS = 512                  # pair slots 0..511: prefs 10..521 stay below the hose filter's 1000
HOSE_PREF = 1000
WC_PAIR_CLASS_BASE = 0x300       # LRC, combined mode: a pair's WC ceiling, class 1:<0x300 + slot>...
WC_PAIR_PREF_BASE = 1100         # ...filter pref 1100 + slot (WC traffic never matches the hose filter)
MIN_CLASS_BPS = 8000             # HTB needs a positive rate: 8 kb/s stands for "nothing"
MAX_COMPETITION = 1e6            # A_l (bwf_alevel stores A_l x 1024 in 32 bits)
MAX_NIC_MBPS = 400_000           # 400 Gb/s; HTB keeps 64-bit rates, anything above is a typo
ENDPOINT_ID_BASE = 100           # our MPTCP endpoint ids: base+1 .. base+N
BPF_MAP = "bwf_alevel"           # pinned: key = IPv4 (network order u32), value = A_l * ALPHA_SCALE
BPF_PACE_MAP = "bwf_bgpace"      # pinned: key = IPv4, value = BG's pacing ceiling in bytes/s
BPF_CCSEL_MAP = "bwf_ccsel"      # pinned: key = IPv4, value (u32) = the index in MPTCP_CCS (no entry: bgwc)
BPF_CCCONF_MAP = "bwf_ccconf"    # pinned array: key = u32 index, value (u64) = a coupled control's parameter (0: default)
# the coupled controls' parameters a host's tuning sets (bwf_coupled.bpf.c's CONF_*): index, scale
CCCONF = {"ese_alpha": (1, 1000), "ese_beta": (2, 1000), "ese_candidates": (3, 1), "lia_vm_theta": (4, 1000),
          "lia_vm_delta_ms": (5, 1), "ese_confirm": (8, 1)}
CCCONF_ESE_OFF = 6               # 1: MPTCP-D without extra-subflow elimination (Tuning.ese false)
# a tenant's MPTCP congestion control: BG/WC (Reno on the first subflow, bwf_wc on the joins), or one of
# the coupled ones on every subflow (hostagent/bpf/bwf_coupled.bpf.c), or Reno on each (uncoupled)
MPTCP_CCS = ("bgwc", "lia", "mptcp_d", "lia_vm", "uncoupled")
# BG is paced at its guarantee, the rate of the VM's bucket (bwf_mark) that enforces it: the
# pacing rate tells MPTCP's scheduler what BG drains at. Not above it: paced at 1.05 x, the 5 %
# the bucket did not hold left as WC, seconds behind the subflow's other packets in the WC
# queues; the receiver saw holes, the sender retransmitted them (2.5 spurious retransmissions
# a second per analytics VM, traced) and its Reno halved to a window of 2-4 segments over a
# round trip inflated by those late samples (135-250 ms): at guarantees of 4 Mb/s on 5 Mb/s
# uplinks a VM's lowest 1 s fell to 0.82-0.92 of it in every run, 0.89-1.00 paced at 1.0.
# Nor at it: the pacer counts TCP bytes, the bucket whole frames (+0.4 % at 9000 B, +2.3 % at
# 1500 B) and the ACKs the VM returns for what it receives. Paced at 1.0 x the bucket ran dry
# and demoted one 2-frame skb every 2.5-3 s per VM (bucket counters), each one 2 retransmissions
# and a halved window 0.3 s later in the same subflow (traced: docs/results.md)
BG_PACE_HEADROOM = 0.98
# ...from a BG subflow's first this many bytes acknowledged on (bwf_sockops, compiled in): a
# short flow is not held to its VM's guarantee by its own pacing -- what goes beyond the VM's
# bucket is demoted to WC (bwf_mark) and takes spare capacity, as under best effort
BG_PACE_AFTER_BYTES = 1 << 20
# the host's marker of BG (hostagent/bpf/bwf_mark.bpf.c, tc clsact egress): its pinned program
# and its map of buckets (key: source, destination (0: the hose); value: bytes/s, depth in bytes)
MARK_PROG = "bwf_mark"
MARK_PREF = 1                    # its filter on the interface's egress
BPF_BUCKET_MAP = "bwf_bgrate"
BPF_BUCKET_STATE = "bwf_bgstate"  # tokens and counters per bucket (the program's own)
MAX_BUCKET_BPS = MAX_NIC_MBPS * 1_000_000
WC_CC = "bwf_wc"                 # the struct_ops congestion control of WC subflows
BG_CC = "reno"


class PlanError(ValueError):
    pass


_Strict = StrictModel


class Tuning(_Strict):
    """A host's tuning -- the same whatever tenant's VM it carries. The
    controller's ``agents.defaults`` and ``agents.hosts.<h>.tuning`` are this
    model (one schema for both sides of the channel)."""
    join_port_base: int = Field(10100, ge=1024, le=65000, description="first MPTCP join (signal) port")
    unit_mbps: float = Field(PAPER_UNIT_MBPS, ge=0.001, le=MAX_NIC_MBPS, description="U of the 'guarantee' "
                             "fairness policy: A_l = B / U")
    beta: float = Field(DEFAULT_BETA, gt=0, le=100, description="Eq. 1's buffer factor")
    rtt_hint_ms: float = Field(50.0, gt=0, le=10_000, description="Eq. 1's maxRTT until live subflows are "
                               "measured (ms)")
    # a connection's receive window when it opens (tcp_rmem[1], at most Eq. 1's
    # B; autotuning grows it to B): see sysctl_plan
    rcvbuf_initial_kb: float = Field(3072.0, ge=4, le=65536, description="a connection's receive window when "
                                     "it opens (KiB)")
    # MPTCP-level retransmission intervals a subflow may sit on unacknowledged
    # data before the kernel calls it stale and re-sends its data on the
    # others (net.mptcp.stale_loss_cnt; the kernel's default is 4)
    stale_loss_cnt: int = Field(4, ge=1, le=100, description="net.mptcp.stale_loss_cnt")
    # TCP's minimum retransmission timeout (net.ipv4.tcp_rto_min_us, kernels
    # >= 6.11); None leaves the kernel's 200 ms. A WC subflow in RTO holds its
    # connection's in-order delivery, BG included, for at least this long.
    rto_min_ms: float | None = Field(None, ge=1, le=1000, description="TCP's minimum RTO (kernels >= 6.11); "
                                     "absent: the kernel's 200 ms")
    # ...and its maximum (net.ipv4.tcp_rto_max_ms, kernels >= 6.15). A WC
    # subflow whose round trips swing with the WC queues gets RTOs of 3-7 s;
    # the packet it lost is a hole in its connection's data, and once the
    # receiver's window is full of what came after, BG waits for it too (the
    # main job: analytics' transfers stood still 1-2 s, BG with them)
    rto_max_ms: int | None = Field(None, ge=1000, le=120_000, description="TCP's maximum RTO (kernels >= 6.15); "
                                   "absent: the kernel's 120 s")
    # ECN on this host's TCP connections (net.ipv4.tcp_ecn=1): a switch's WC
    # queue then marks instead of dropping (mininet_topos.queues.aqm), and a WC
    # subflow backs off without leaving a hole in its connection's data
    ecn: bool = Field(True, description="ask for ECN on connections the host opens")
    # BG paced at most at the guarantee (bwf_sockops): MPTCP's scheduler
    # takes a subflow's pacing rate for its drain rate; unpaced, it keeps
    # picking a full BG and starves WC (see hostagent/bpf/bwf_sockops.bpf.c)
    pace_bg: bool = Field(True, description="pace BG subflows at the guarantee (bwf_sockops)")
    # BG beyond the VM's guarantee leaves at once as WC (UDP: dropped) instead of waiting at
    # the guarantee in one FIFO (bwf_mark, see marker_plan)
    demote_bg: bool = Field(True, description="BG beyond the guarantee's token bucket leaves as WC (TCP) or is "
                            "dropped (UDP) by bwf_mark, instead of queueing at the guarantee")
    # the coupled controls' parameters (docs/coupled.md), set in bwf_ccconf when a VM of the host uses
    # MPTCP-D or LIA-VM: the map is the kernel's, one per host
    ese: bool = Field(True, description="MPTCP-D closes subflows it finds sharing a bottleneck (extra-subflow "
                      "elimination); upstream MPTCP can deadlock on the data a closed subflow held (docs/coupled.md)")
    ese_alpha: float = Field(1.3, gt=1, le=10, description="MPTCP-D's ESE: a sample above this x the subflow's "
                             "least RTT counts as congested")
    ese_beta: float = Field(0.1, gt=0, le=10, description="MPTCP-D's ESE: two subflows' RTTs within this x the "
                            "base RTT share a bottleneck (a sub-ms fabric needs more than the paper's 0.1)")
    ese_candidates: int = Field(80, ge=1, le=100_000, description="MPTCP-D's ESE acts during a subflow's first "
                                "this many RTT samples")
    ese_confirm: int = Field(4, ge=1, le=1000, description="MPTCP-D's ESE: matching samples in a row before a "
                             "subflow is closed (the paper: 1)")
    lia_vm_theta: float = Field(10.0, gt=1, le=100_000, description="LIA-VM: a sample above this x the least RTT "
                                "is a descheduled period (must exceed the fabric's queueing delay over its base RTT)")
    lia_vm_delta_ms: float = Field(1000.0, ge=8, le=600_000, description="LIA-VM: after a descheduled period, "
                                   "alpha is the largest of this long")


VM_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}(/[A-Za-z0-9][A-Za-z0-9_.-]{0,31})?$"   # tenant/vm


class HostSettings(Tuning):
    """The VM's shape -- its host, interface, address, NIC rate -- and its
    tuning. A host that is its own VM leaves ``vm_id`` and ``netns`` out; a
    host of several VMs names each and gives each its network namespace
    (``ip netns`` name) and the VM's interface in it."""
    host: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    interface: str = Field(pattern=r"^[^/:\s]{1,15}$")
    address: IPv4Address
    nic_mbps: float = Field(gt=0, le=MAX_NIC_MBPS)
    vm_id: str | None = Field(None, pattern=VM_NAME)
    netns: str | None = Field(None, pattern=NETNS_NAME)
    nic: str | None = Field(None, pattern=r"^[^/:\s]{1,15}$")      # the host's NIC, for a VM in a netns

    @model_validator(mode="after")
    def _named_with_a_namespace(self) -> "HostSettings":
        if self.netns is not None and self.vm_id is None:
            raise ValueError("a VM in a network namespace of its own needs a name (vm_id)")
        if (self.nic is None) != (self.netns is None):
            raise ValueError("a VM in a network namespace of its own names its host's NIC (nic), and only it")
        return self


class LrcPeer(_Strict):
    """Another VM of the tenant, as LRC at this host needs it: Algorithm 1's
    sender half weighs the receivers."""
    weight: float = Field(gt=0, le=1e6)
    guarantee_mbps: float = Field(ge=0, le=MAX_NIC_MBPS)


class LrcPolicy(_Strict):
    """LRC at this host (``vm.lrc``): the VM's weight, its tenant's other VMs
    by address, the mode and the parameters. ``combined``: per VM-pair, BG
    limited to B_i and WC to max(B_i, v_i) − B_i; ``paper``: the pair's one
    subflow limited to max(B_i, v_i)."""
    mode: Literal["combined", "paper"] = "combined"
    # combined mode, how the WC subflows get max(B_i, v_i) - B_i: "competition" sets the VM's WC
    # competition level A_l to the pairs' excess over U (bwf_wc shares the spare in that proportion,
    # work-conserving); "ceiling" caps each pair's WC subflows with an HTB class (the issue's first
    # design: measured to stall MPTCP connections whose ceiling nears 0, see docs/lrc.md)
    wc: Literal["competition", "ceiling"] = "competition"
    weight: float = Field(1.0, gt=0, le=1e6)
    peers: dict[str, LrcPeer] = Field(default_factory=dict, max_length=MAX_PAIRS)
    params: LrcParams = Field(default_factory=LrcParams)

    @field_validator("peers")
    @classmethod
    def _addresses(cls, v: dict) -> dict:
        bad = []
        for ip in v:
            try:
                if str(ipaddress.IPv4Address(ip)) != ip:
                    raise ValueError
            except ValueError:
                bad.append(f"{ip!r} is not an IPv4 address (dotted quad)")
        if bad:
            raise ValueError("; ".join(bad))
        return v


class VmPolicy(_Strict):
    """What the VM's tenant declared (``tenants`` in the controller's
    configuration): its hose guarantee, fairness policy and WC subflows;
    ``pair_limits_mbps`` is the pipe model's per-destination BG (static);
    ``lrc`` turns on LRC's per-pair limits, which the agent moves itself."""
    guarantee_mbps: float = Field(ge=0, le=MAX_NIC_MBPS)
    wc_subflows: int = Field(1, ge=0, le=8)
    mptcp_cc: Literal[MPTCP_CCS] = "bgwc"
    policy: Literal[POLICIES] = "guarantee"
    competition: float | None = Field(None, ge=0, le=1e6)
    pair_limits_mbps: dict[str, float] = Field(default_factory=dict, max_length=MAX_PAIRS)
    lrc: LrcPolicy | None = None

    @field_validator("pair_limits_mbps")
    @classmethod
    def _pairs(cls, v: dict[str, float]) -> dict[str, float]:
        bad = []
        for dst, mbps in v.items():
            try:
                if str(ipaddress.IPv4Address(dst)) != dst:
                    raise ValueError
            except ValueError:
                bad.append(f"{dst!r} is not an IPv4 address (dotted quad)")
            if not mbps > 0:
                bad.append(f"[{dst}] {mbps!r} must be > 0")
        if bad:
            raise ValueError("; ".join(bad))
        return v

    @model_validator(mode="after")
    def _explicit(self) -> "VmPolicy":
        if self.policy == "explicit" and self.competition is None:
            raise ValueError("policy 'explicit' needs competition in [0, 1e6]")
        if self.lrc is not None and self.pair_limits_mbps:
            raise ValueError("lrc and pair_limits_mbps exclude each other (LRC sets the pairs' limits)")
        if self.lrc is not None and self.lrc.mode == "paper" and self.wc_subflows:
            raise ValueError("lrc mode 'paper' has no WC subflows: wc_subflows must be 0")
        return self


SETTINGS_FIELDS = tuple(HostSettings.model_fields)
POLICY_FIELDS = tuple(VmPolicy.model_fields)


class HostConfig(_Strict):
    """An agent's whole configuration: the host's settings and its VM's
    policy, checked on construction (a bad one never exists). Reads of
    either part's fields work on the whole (``cfg.guarantee_mbps``,
    ``cfg.nic_mbps``). On the wire it is ``{"settings": {...}, "vm":
    {...}}``; the flat form of every field in one object is accepted too
    (manual use)."""
    settings: HostSettings
    vm: VmPolicy

    FIELDS: ClassVar[tuple[str, ...]] = SETTINGS_FIELDS + POLICY_FIELDS     # the flat form's keys

    @model_validator(mode="after")
    def _within_the_nic(self) -> "HostConfig":
        nic = self.settings.nic_mbps
        bad = [f"vm.guarantee_mbps {self.vm.guarantee_mbps!r} must be within 0..nic_mbps ({nic:g})"] \
            if self.vm.guarantee_mbps > nic else []
        bad += [f"vm.pair_limits_mbps[{d}] {m!r} must be within (0, nic_mbps]"
                for d, m in self.vm.pair_limits_mbps.items() if m > nic]
        if self.vm.policy == "guarantee" and self.vm.guarantee_mbps / self.settings.unit_mbps > MAX_COMPETITION:
            bad.append(f"the competition level B/U = {self.vm.guarantee_mbps:g}/{self.settings.unit_mbps:g} "
                       f"exceeds {MAX_COMPETITION:g} (raise unit_mbps)")
        if bad:
            raise ValueError("; ".join(bad))
        return self

    @classmethod
    def of(cls, **flat) -> "HostConfig":
        """From every field in one mapping (PlanError naming each problem)."""
        unknown = sorted(set(flat) - set(cls.FIELDS))
        if unknown:
            raise PlanError(f"unknown configuration keys {unknown}; valid: {', '.join(cls.FIELDS)}")
        return cls.from_dict({"settings": {k: v for k, v in flat.items() if k in SETTINGS_FIELDS},
                              "vm": {k: v for k, v in flat.items() if k in POLICY_FIELDS}})

    @classmethod
    def from_dict(cls, data: Any) -> "HostConfig":
        """Validate a configuration message body; every problem is named."""
        if not isinstance(data, dict):
            raise PlanError("host configuration must be an object")
        if "settings" not in data and "vm" not in data:          # the flat form
            missing = [k for k in ("host", "interface", "address", "nic_mbps", "guarantee_mbps") if k not in data]
            if missing and not set(data) - set(cls.FIELDS):
                raise PlanError(f"configuration lacks {', '.join(missing)}")
            return cls.of(**data)
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            settings = data.get("settings") if isinstance(data.get("settings"), dict) else {}
            vm = data.get("vm") if isinstance(data.get("vm"), dict) else {}
            problems = [_problem(e) for e in exc.errors(include_url=False)]
            # the cross-field rule pydantic skips while fields are wrong: all problems at once
            nic, g = settings.get("nic_mbps"), vm.get("guarantee_mbps")
            if finite_number(nic) and finite_number(g) and g > nic and not any("nic_mbps (" in p for p in problems):
                problems.append(f"vm.guarantee_mbps {g!r} must be within 0..nic_mbps ({nic:g})")
            raise PlanError(f"host {settings.get('host')}: " + "; ".join(problems)) from None

    def __getattr__(self, name: str):
        if name in POLICY_FIELDS:
            return getattr(self.vm, name)
        if name in SETTINGS_FIELDS:
            return getattr(self.settings, name)
        return super().__getattr__(name)

    @property
    def vm_name(self) -> str:
        """The VM's name at its agent: ``vm_id``, or the host's for a host that is its own VM."""
        return self.settings.vm_id or self.settings.host

    @property
    def a_l(self) -> float:
        return competition_level(self.policy, self.guarantee_mbps, self.unit_mbps, self.competition)


def _problem(err: dict) -> str:
    """One pydantic error as "<field> <value>: <why>"; wrong keys by name."""
    loc = [p for p in err["loc"] if not str(p).startswith(("function-", "literal[", "[key]"))]
    # the field by name, then any keys inside it: pair_limits_mbps['10.0.0.1']
    named = [str(p) for p in loc if p not in ("settings", "vm")]
    field_ = (named[0] + "".join(f"[{k!r}]" for k in named[1:])) if named else "configuration"
    loc = [str(p) for p in loc]
    if err["type"] == "extra_forbidden":
        return f"unknown key {'.'.join(loc)}"
    if err["type"] == "missing":
        return f"{'.'.join(loc)} is required"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "value_error" and len(loc) <= 1:
        return msg
    return f"{field_} {err.get('input')!r}: {msg}"


# ---- steps ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sysctl:
    key: str       # e.g. net.mptcp.enabled
    value: str


@dataclass(frozen=True)
class MptcpLimits:
    subflows: int
    add_addr_accepted: int


@dataclass(frozen=True)
class MptcpEndpoint:
    id: int
    address: str
    dev: str
    port: int
    flags: str = "signal"


@dataclass(frozen=True)
class NftTable:
    name: str
    text: str      # the whole table; applied atomically, replacing any earlier version


@dataclass(frozen=True)
class TcQdisc:
    dev: str
    handle: str
    default_class: str


@dataclass(frozen=True)
class TcClass:
    dev: str
    classid: str
    parent: str
    rate_bps: int
    ceil_bps: int
    prio: int


@dataclass(frozen=True)
class TcLeaf:
    """A byte-limited FIFO under a leaf class (HTB's default pfifo holds
    1000 packets: seconds of queueing at a guarantee's rate, which inflates
    the BG subflow's RTT and with it MPTCP's reordering)."""
    dev: str
    parent: str
    handle: str
    limit_bytes: int


@dataclass(frozen=True)
class TcFilter:
    """u32 on the IPv4 header: (value, mask) on the TOS byte, optionally on
    the destination address; lower ``pref`` is tried first."""
    dev: str
    pref: int
    tos: tuple[int, int]
    target: str
    dst: str | None = None


@dataclass(frozen=True)
class BpfMapSet:
    map: str
    key_ipv4: str
    value: int
    width: int = 8          # the value's bytes


@dataclass(frozen=True)
class BpfMapAbsent:
    """No entry for this VM's address in a pinned map it owns the key of
    (machine-wide maps outlive agents: an entry another run or an earlier
    configuration of this address left -- a BG pacing ceiling of 0.26
    Mb/s -- would act on this VM's sockets)."""
    map: str
    key_ipv4: str


@dataclass(frozen=True)
class BpfConf:
    """An entry of a pinned BPF array of u64 parameters (0: the program's default)."""
    map: str
    index: int
    value: int


@dataclass(frozen=True)
class TcMarker:
    """bwf_mark on ``dev``'s egress (tc clsact, filter pref MARK_PREF,
    direct action): BG past its bucket demoted to WC, UDP past it dropped."""
    dev: str


@dataclass(frozen=True)
class BgBucket:
    """A token bucket of bwf_mark: BG from ``src`` (to ``dst``; None: the
    VM's whole hose) conforms up to ``rate_Bps`` bytes/s with
    ``depth_bytes`` of burst (frame bytes, as the ToR meter counts)."""
    src: str
    dst: str | None
    rate_Bps: int
    depth_bytes: int

    def key(self) -> bytes:
        return ipaddress.IPv4Address(self.src).packed + \
            (ipaddress.IPv4Address(self.dst).packed if self.dst else bytes(4))

    def value(self) -> bytes:
        return self.rate_Bps.to_bytes(8, "little") + self.depth_bytes.to_bytes(8, "little")


Step = Sysctl | MptcpLimits | MptcpEndpoint | NftTable | TcQdisc | TcClass | TcLeaf | TcFilter | BpfMapSet | BpfConf \
    | BpfMapAbsent \
    | TcMarker | BgBucket


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]

    def of(self, kind: type) -> list:
        return [s for s in self.steps if isinstance(s, kind)]


# ---- planners ---------------------------------------------------------------------------------
NIC_WC_FLOOR = 0.01     # WC's guaranteed share of a NIC or port carrying both classes (HTB needs some rate)


def nic_plan(dev: str, rate_bps: float, queue_bytes: int, wc_floor_fraction: float = NIC_WC_FLOOR) -> list:
    """BG before WC on a link that carries both, keyed on the ToS the
    senders set (0x20 WC; the rest, and non-IP, BG): 1:10 BG (prio 0) holds
    the rate less WC's floor, 1:20 WC (prio 1) borrows what BG leaves. For a
    switch port (the emulator's tc back-end) and for a server's NIC in
    front of its VMs (issue #32 §4: one VM's WC must not queue another's
    BG)."""
    rate = int(rate_bps)
    floor = max(8000, int(rate * wc_floor_fraction))
    if rate <= floor * 2 or queue_bytes <= 0 or not 0 < wc_floor_fraction < 0.5:
        raise PlanError(f"{dev}: need a rate above twice WC's floor, queue_bytes > 0, 0 < floor fraction < 0.5")
    return [
        TcQdisc(dev, TC_HANDLE, CLASS_BG),             # unmatched (ToS 0x00, non-IP): BG
        TcClass(dev, CLASS_ROOT, TC_HANDLE, rate, rate, 0),
        TcClass(dev, CLASS_BG, CLASS_ROOT, rate - floor, rate, 0),
        TcLeaf(dev, CLASS_BG, "1010:", queue_bytes),
        TcClass(dev, CLASS_WC, CLASS_ROOT, floor, rate, 1),
        TcLeaf(dev, CLASS_WC, "1020:", queue_bytes),
        TcFilter(dev, 1, (TOS_WC, TOS_MASK), CLASS_WC),
    ]


def nic_queue_bytes(rate_bps: float) -> int:
    """A NIC class's FIFO: 20 ms at its rate, at least 150 frames of 1500 B."""
    return max(150 * 1500, int(rate_bps * 0.02 / 8))


def sysctl_plan(cfg: HostConfig, rcvbuf_bytes: int | None = None) -> list[Sysctl]:
    """MPTCP on; BG subflows' default congestion control; Eq. 1's buffer as
    tcp_rmem's ceiling (and its initial size, up to ``rcvbuf_initial_kb``)
    and as tcp_wmem's floor, initial size and ceiling. Until the agent has live RTTs (see
    hostagent.observe), the buffer is planned for ``rtt_hint_ms`` at the NIC
    rate: WC subflows queue behind BG, so their RTT is the low queue's delay,
    far above the fabric's base RTT."""
    buf = rcvbuf_bytes if rcvbuf_bytes is not None else receive_buffer_bytes(cfg.rtt_hint_ms / 1e3, cfg.nic_mbps * 1e6, cfg.beta)
    return [Sysctl("net.mptcp.enabled", "1"),
            # a WC subflow stuck in loss recovery holds the connection's in-order
            # delivery; once stale, its data goes out again on BG
            Sysctl("net.mptcp.stale_loss_cnt", str(cfg.stale_loss_cnt)),
            Sysctl("net.ipv4.tcp_congestion_control", BG_CC),
            # 1: ask for ECN on connections this host opens (and accept it);
            # 2, the kernel's default: accept it only
            Sysctl("net.ipv4.tcp_ecn", "1" if cfg.ecn else "2"),
            # a connection's receive window opens at rcvbuf_initial_kb (3 MiB): WC's
            # slow start overshoots its queue, and BG's data behind a WC hole waits
            # in the connection's out-of-order queue for at least one WC round trip
            # (a full WC queue: 200-400 ms on the 60 Mb/s testbed). With the kernel's
            # 128 KiB (autotuning grows it a round trip at a time) that filled the
            # window and stalled BG: fig12's first seconds 0.90-0.99 of the
            # guarantee, fig13's restart back in 1.3-3.8 s. At 60 Mb/s: 1 MiB
            # brought S2 back within 2 s in 2 of 4 fig13 runs, 3 MiB in 8 of 8;
            # all of B (6+ MB at beta 10) too, but Table 3's WC shares then strayed
            # to 0.18 max relative error per row (0.137 at 3 MiB, 0.148 at 1 MiB):
            # the large windows let the most aggressive WC subflows queue more
            Sysctl("net.ipv4.tcp_rmem", f"4096 {min(buf, round(cfg.rcvbuf_initial_kb * 1024))} {buf}"),
            # the sender holds as much, always: an MPTCP connection's data is freed
            # only by in-order DATA_ACKs, so it must hold everything sent in the
            # slowest subflow's round trip on all of them (Eq. 1 at the sender).
            # Its send buffer is tcp_wmem[0] plus its subflows' -- which
            # bwf_sockops keeps to what each carries in a round trip, so that the
            # scheduler cannot park data on one of them: tcp_wmem[0] is the
            # connection's own share (with it at 4 KiB, WC subflows had nothing
            # to send 30-77 % of their busy time)
            # A VM on a coupled control (mptcp_cc) gets none of bwf_sockops's
            # per-subflow clamps, so there every subflow's send buffer would be at
            # least B: the scheduler parks data on each, and when ESE closes one,
            # what it held is sent again behind megabytes on another while the
            # receiver's buffer fills with what came after -- the connection
            # deadlocks (8 subflows, B = 8 MB: 5 of 5 runs; docs/coupled.md). There
            # the kernel's own shape, B the ceiling: 0 of 5
            Sysctl("net.ipv4.tcp_wmem", f"{buf} {buf} {buf}" if cfg.mptcp_cc == "bgwc"
                   else f"4096 16384 {max(buf, 16384)}"),
            *([Sysctl("net.ipv4.tcp_rto_min_us", str(round(cfg.rto_min_ms * 1000)))]
              if cfg.rto_min_ms is not None else []),
            *([Sysctl("net.ipv4.tcp_rto_max_ms", str(cfg.rto_max_ms))] if cfg.rto_max_ms is not None else []),
            # LRC: conntrack counts bytes per direction, so a pair is one this VM sends on (not its ACKs)
            *([Sysctl("net.netfilter.nf_conntrack_acct", "1")] if cfg.vm.lrc is not None else [])]


def mptcp_plan(cfg: HostConfig) -> list[MptcpLimits | MptcpEndpoint]:
    n = cfg.wc_subflows
    steps: list[MptcpLimits | MptcpEndpoint] = [MptcpLimits(subflows=n, add_addr_accepted=n)]
    steps += [MptcpEndpoint(ENDPOINT_ID_BASE + i, cfg.address, cfg.interface, cfg.join_port_base + i)
              for i in range(1, n + 1)]
    return steps


def nft_plan(cfg: HostConfig) -> NftTable:
    """Join subflows marked in conntrack (both directions: our SYN out, the
    peer's SYN in), then every IPv4 packet out gets exactly one of the two
    ToS values.

    Only the side that opened a connection joins: ADD_ADDR (MPTCP subtype 3)
    from the peer of a connection this host accepted (conntrack direction
    original) is dropped. Every host announces its join port (it serves
    too), and the in-kernel path manager answers any announcement with a
    join; with both ends doing so at once each refuses the other's join once
    its own has taken the subflow limit, and the connection is left with no
    WC subflow (seen on the testbed). ADD_ADDR travels on pure ACKs only
    (with the port and HMAC it does not fit beside a data mapping), so no
    data is lost; the peer retries its announcement a few times, harmlessly."""
    join = f"tcp flags syn tcp option mptcp subtype 1 ct mark set {CT_MARK_WC:#x}"
    text = "\n".join([
        f"table ip {NFT_TABLE} {{",
        "  chain pre {",
        "    type filter hook prerouting priority mangle; policy accept;",
        f"    {join}",
        f"    ct direction original tcp option mptcp subtype {MPTCP_ADD_ADDR} drop",
        "  }",
        "  chain out {",
        "    type route hook output priority mangle; policy accept;",
        f"    {join}",
        f"    ct mark {CT_MARK_WC:#x} ip dscp set {NFT_DSCP_WC}",
        f"    ct mark != {CT_MARK_WC:#x} ip dscp set {NFT_DSCP_BG}",
        "  }",
        "}",
    ])
    return NftTable(NFT_TABLE, text)


LEAF_QUEUE_S = 0.005      # leaf FIFOs hold ~5 ms at their class rate...
# ...and at least four GSO super-packets: the host's own qdisc sees TCP's
# segments before segmentation (up to 64 KiB each); a FIFO shorter than one
# drops every such send, and TCP takes a local drop as congestion (a BG
# subflow at 35 Mb/s with a 27 KB FIFO stalled in RTO backoff). TCP small
# queues keep each socket's share of this queue to ~1 ms anyway.
LEAF_QUEUE_MIN = 4 * 65536


def _leaf(dev: str, classid: str, rate_bps: int) -> TcLeaf:
    minor = int(classid.split(":")[1], 16)
    return TcLeaf(dev, classid, f"{minor + 0x1000:x}:", max(LEAF_QUEUE_MIN, int(rate_bps * LEAF_QUEUE_S / 8)))


def in_pair_slots(classid: str, base: int) -> bool:
    """A class 1:<base + slot> of the per-pair slots (``base``:
    PAIR_CLASS_BASE for BG, WC_PAIR_CLASS_BASE for LRC's WC ceilings)."""
    major, _, minor = classid.partition(":")
    try:
        return major == "1" and base <= int(minor, 16) < base + MAX_PAIRS
    except ValueError:
        return False


def pair_slots(destinations, previous: dict[str, int] | None = None) -> dict[str, int]:
    """A slot (0..MAX_PAIRS-1) per pipe-model destination that stays the
    same while the destination stays: adding or removing one destination
    never renumbers another's class or filter (LRC changes pairs all the
    time; a renumbered class would leave a gap in enforcement). Kept slots
    come from ``previous`` (what the kernel has, read back by the
    executor); new destinations take the lowest free slots, in address
    order."""
    previous = previous or {}
    dsts = sorted(set(destinations), key=lambda d: ipaddress.IPv4Address(d))
    if len(dsts) > MAX_PAIRS:
        raise PlanError(f"{len(dsts)} pair destinations, at most {MAX_PAIRS}")
    out = {d: previous[d] for d in dsts if d in previous and 0 <= previous[d] < MAX_PAIRS}
    if len(set(out.values())) != len(out):     # a corrupt read-back: start afresh
        out = {}
    free = (i for i in range(MAX_PAIRS) if i not in set(out.values()))
    for d in dsts:
        if d not in out:
            out[d] = next(free)
    return out


@dataclass(frozen=True)
class PairLimit:
    """LRC's limits of one VM-pair at this host (Mb/s): BG, and the WC
    ceiling in combined mode (None in paper mode)."""
    bg_mbps: float
    wc_mbps: float | None = None


def tc_plan(cfg: HostConfig, slots: dict[str, int] | None = None,
            lrc_limits: dict[str, PairLimit] | None = None) -> list[TcQdisc | TcClass | TcLeaf | TcFilter]:
    """HTB: BG (ToS 0x00) at the guarantee -- or per destination, pipe
    model, in the stable slots of :func:`pair_slots` -- and WC (everything
    else, non-IP included) up to the NIC rate. With LRC (``lrc_limits``,
    the pairs open now) each pair has its BG class and, in combined mode,
    a WC class with the pair's ceiling; their leaf queues are sized by the
    NIC rate, so the limits LRC moves every τ_v change class rates only."""
    nic = int(cfg.nic_mbps * 1e6)
    bg = int(cfg.guarantee_mbps * 1e6)
    dev = cfg.interface
    wc_rate = max(nic - bg, nic // 100)
    steps: list[TcQdisc | TcClass | TcFilter] = [
        TcQdisc(dev, TC_HANDLE, CLASS_WC),
        TcClass(dev, CLASS_ROOT, TC_HANDLE, nic, nic, 0),
    ]
    if marking(cfg):
        # bwf_mark steers young flows' WC here (skb->priority): WC's share is theirs first, the old
        # WC class keeps a floor of 1 % and borrows the rest (HTB serves classes within their rate first)
        steps += [TcClass(dev, CLASS_YOUNG, CLASS_ROOT, wc_rate, nic, 1), _leaf(dev, CLASS_YOUNG, nic),
                  TcClass(dev, CLASS_WC, CLASS_ROOT, max(nic // 100, MIN_CLASS_BPS), nic, 1)]
    else:
        steps.append(TcClass(dev, CLASS_WC, CLASS_ROOT, wc_rate, nic, 1))
    steps.append(_leaf(dev, CLASS_WC, nic))
    bg_mask = (TOS_BG, TOS_MASK)
    wc_mask = (TOS_WC, TOS_MASK)
    pairs = _pairs(cfg, lrc_limits)
    mark = marking(cfg)
    if pairs:
        slot_of = pair_slots(pairs, slots)
        for dst, lim in sorted(pairs.items(), key=lambda kv: slot_of[kv[0]]):
            slot = slot_of[dst]
            if not mark:        # with the marker a pair's BG is its bucket (marker_plan), not a class
                classid = f"1:{PAIR_CLASS_BASE + slot:x}"
                rate = max(int(lim.bg_mbps * 1e6), MIN_CLASS_BPS)
                steps.append(TcClass(dev, classid, CLASS_ROOT, rate, rate, 0))
                steps.append(_leaf(dev, classid, nic if lrc_limits is not None else rate))
                steps.append(TcFilter(dev, PAIR_PREF_BASE + slot, bg_mask, classid, dst=dst))
            if lim.wc_mbps is not None:
                wc_id = f"1:{WC_PAIR_CLASS_BASE + slot:x}"
                wc = max(int(lim.wc_mbps * 1e6), MIN_CLASS_BPS)
                steps.append(TcClass(dev, wc_id, CLASS_ROOT, wc, wc, 1))
                steps.append(_leaf(dev, wc_id, nic))
                steps.append(TcFilter(dev, WC_PAIR_PREF_BASE + slot, wc_mask, wc_id, dst=dst))
    # the hose limit: all BG of this VM (and BG to unlisted destinations in the pipe model).
    # With the marker, what reaches the class conforms already: it may borrow up to the NIC,
    # so that BG waits behind nothing but its own burst
    hose = max(bg, MIN_CLASS_BPS)
    steps.append(TcClass(dev, CLASS_BG, CLASS_ROOT, hose, max(nic, hose) if mark else hose, 0))
    steps.append(_leaf(dev, CLASS_BG, bg))
    steps.append(TcFilter(dev, HOSE_PREF, bg_mask, CLASS_BG))
    return steps


def _pairs(cfg: HostConfig, lrc_limits: dict[str, PairLimit] | None) -> dict[str, PairLimit]:
    """The VM-pairs with their own BG limit: LRC's open pairs, or the pipe model's."""
    if lrc_limits is not None:
        return lrc_limits
    return {d: PairLimit(m) for d, m in cfg.pair_limits_mbps.items()}


def marking(cfg: HostConfig) -> bool:
    """Whether the VM's BG is held by bwf_mark (``demote_bg``): its hose
    and each VM-pair's limit (the pipe model's, LRC's) are token buckets;
    without it, HTB classes at those rates."""
    return cfg.demote_bg


def _bucket(src: str, dst: str | None, mbps: float) -> "BgBucket":
    rate = max(int(mbps * 1e6), MIN_CLASS_BPS) // 8
    return BgBucket(src, dst, rate, bg_burst_bytes(rate))


def marker_plan(cfg: HostConfig, lrc_limits: dict[str, PairLimit] | None = None) -> list[TcMarker | BgBucket]:
    """bwf_mark on the VM's interface, its hose bucket and a bucket per
    VM-pair with a BG limit (``lrc_limits``: LRC's now; else the pipe
    model's): the rate (at least MIN_CLASS_BPS) in bytes/s, as deep as the
    ToR meter's burst (controller.contract.bg_burst_bytes). A pair's BG
    takes its own bucket's tokens only (bwf_mark: the pair entry first)."""
    if not marking(cfg):
        return []
    pairs = _pairs(cfg, lrc_limits)
    return [_bucket(cfg.address, None, cfg.guarantee_mbps),
            *(_bucket(cfg.address, d, pairs[d].bg_mbps) for d in sorted(pairs, key=ipaddress.IPv4Address)),
            TcMarker(cfg.interface)]


def bpf_plan(cfg: HostConfig, a_l: float | None = None) -> list[BpfMapSet | BpfMapAbsent]:
    """A_l for bwf_wc (``a_l``: LRC's, in place of the policy's); BG's
    pacing ceiling for bwf_sockops (none without a guarantee, or with
    ``pace_bg`` off)."""
    steps: list[BpfMapSet | BpfMapAbsent] = [BpfMapSet(BPF_MAP, cfg.address,
                                                       fixed_point(cfg.a_l if a_l is None else a_l))]
    if cfg.mptcp_cc != "bgwc":      # no entry: BG/WC
        steps.append(BpfMapSet(BPF_CCSEL_MAP, cfg.address, MPTCP_CCS.index(cfg.mptcp_cc), width=4))
    else:
        steps.append(BpfMapAbsent(BPF_CCSEL_MAP, cfg.address))
    if cfg.pace_bg and cfg.guarantee_mbps > 0:
        steps.append(BpfMapSet(BPF_PACE_MAP, cfg.address, round(cfg.guarantee_mbps * 1e6 / 8 * BG_PACE_HEADROOM)))
    else:
        steps.append(BpfMapAbsent(BPF_PACE_MAP, cfg.address))
    return steps


def ccconf_plan(cfg: HostConfig) -> list[BpfConf]:
    """The coupled controls' parameters, for a VM on MPTCP-D or LIA-VM (the
    others read none; a host whose kernel cannot load the coupled controls
    is never asked to write them)."""
    if cfg.mptcp_cc not in ("mptcp_d", "lia_vm"):
        return []
    return [*(BpfConf(BPF_CCCONF_MAP, index, round(getattr(cfg, name) * scale))
              for name, (index, scale) in CCCONF.items()),
            BpfConf(BPF_CCCONF_MAP, CCCONF_ESE_OFF, 0 if cfg.ese else 1)]


def host_plan(cfg: HostConfig, rcvbuf_bytes: int | None = None, slots: dict[str, int] | None = None,
              lrc_limits: dict[str, PairLimit] | None = None, lrc_a_l: float | None = None) -> Plan:
    """``slots``: the pair slots in force (read back from the kernel), so
    that a new plan keeps every remaining destination's class and filter;
    ``lrc_limits``: LRC's pairs and their limits now (see :func:`tc_plan`)."""
    return Plan(tuple([*sysctl_plan(cfg, rcvbuf_bytes), *mptcp_plan(cfg), nft_plan(cfg),
                       *marker_plan(cfg, lrc_limits), *tc_plan(cfg, slots, lrc_limits), *bpf_plan(cfg, lrc_a_l),
                       *ccconf_plan(cfg)]))
