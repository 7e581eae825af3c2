"""The host agent's configuration, as both sides of the channel read it
(pure): the controller composes a :class:`HostConfig` per VM and sends it;
the agent validates the same model before it plans anything
(:mod:`hostagent.plan`). Also the names an agent's reports use for its
queues (the tc class layout), so the controller reads them without
importing the agent."""

from __future__ import annotations

import ipaddress
from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from bwcommon.lrc import LrcParams
from bwcommon.policy import DEFAULT_BETA, PAPER_UNIT_MBPS, POLICIES, competition_level
from bwcommon.validate import IPv4Address, StrictModel, finite_number

NETNS_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"      # an `ip netns` name (the config's and the agent's)
# the tc class layout on a VM's interface (what an agent's status names)
TC_HANDLE = "1:"
CLASS_ROOT, CLASS_BG, CLASS_WC = "1:1", "1:10", "1:20"
CLASS_YOUNG = "1:21"             # with the marker: WC of flows in their first BG_PACE_AFTER_BYTES (bwf_mark)
PAIR_CLASS_BASE = 0x100          # pipe model: class 1:<0x100 + slot> per destination
MAX_PAIRS = 512                  # pair slots 0..511: prefs 10..521 stay below the hose filter's 1000
WC_PAIR_CLASS_BASE = 0x300       # LRC, combined mode: a pair's WC ceiling, class 1:<0x300 + slot>...
MAX_COMPETITION = 1e6            # A_l (bwf_alevel stores A_l x 1024 in 32 bits)
MAX_NIC_MBPS = 400_000           # 400 Gb/s; HTB keeps 64-bit rates, anything above is a typo
# a tenant's MPTCP congestion control: BG/WC (Reno on the first subflow, bwf_wc on the joins), or one of
# the coupled ones on every subflow (hostagent/bpf/bwf_coupled.bpf.c), or Reno on each (uncoupled)
MPTCP_CCS = ("bgwc", "lia", "mptcp_d", "lia_vm", "uncoupled")


def in_pair_slots(classid: str, base: int) -> bool:
    """A class 1:<base + slot> of the per-pair slots (``base``:
    PAIR_CLASS_BASE for BG, WC_PAIR_CLASS_BASE for LRC's WC ceilings)."""
    major, _, minor = classid.partition(":")
    try:
        return major == "1" and base <= int(minor, 16) < base + MAX_PAIRS
    except ValueError:
        return False


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
    # work-conserving); "ceiling" caps each pair's WC subflows with an HTB class (the first
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
