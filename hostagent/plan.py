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


from bwcommon.contract import bg_burst_bytes
from bwcommon.contract import NFT_DSCP_BG, NFT_DSCP_WC, TOS_BG, TOS_MASK, TOS_WC  # noqa: F401 (re-exported)
from bwcommon.hostconfig import (CLASS_BG, CLASS_ROOT, CLASS_WC, CLASS_YOUNG, MAX_COMPETITION,  # noqa: F401
                                 MAX_NIC_MBPS, MAX_PAIRS, MPTCP_CCS, NETNS_NAME, PAIR_CLASS_BASE, POLICY_FIELDS,
                                 SETTINGS_FIELDS, TC_HANDLE, VM_NAME, WC_PAIR_CLASS_BASE, HostConfig,
                                 HostSettings, LrcPeer, LrcPolicy, PlanError, Tuning, VmPolicy, in_pair_slots)
from bwcommon.policy import (DEFAULT_BETA, PAPER_UNIT_MBPS, POLICIES, competition_level, fixed_point,  # noqa: F401
                             receive_buffer_bytes)

NFT_TABLE = "bwfabric"
CT_MARK_WC = 0x20                 # conntrack mark of WC join subflows (any value would do)
MPTCP_ADD_ADDR = 3                # MPTCP option subtype
PAIR_PREF_BASE = 10              # ...and its u32 filter at pref 10 + slot (the hose filter is pref 1000)
HOSE_PREF = 1000
WC_PAIR_PREF_BASE = 1100         # ...filter pref 1100 + slot (WC traffic never matches the hose filter)
MIN_CLASS_BPS = 8000             # HTB needs a positive rate: 8 kb/s stands for "nothing"
ENDPOINT_ID_BASE = 100           # our MPTCP endpoint ids: base+1 .. base+N
BPF_MAP = "bwf_alevel"           # pinned: key = IPv4 (network order u32), value = A_l * ALPHA_SCALE
BPF_PACE_MAP = "bwf_bgpace"      # pinned: key = IPv4, value = BG's pacing ceiling in bytes/s
BPF_CCSEL_MAP = "bwf_ccsel"      # pinned: key = IPv4, value (u32) = the index in MPTCP_CCS (no entry: bgwc)
BPF_CCCONF_MAP = "bwf_ccconf"    # pinned array: key = u32 index, value (u64) = a coupled control's parameter (0: default)
# the coupled controls' parameters a host's tuning sets (bwf_coupled.bpf.c's CONF_*): index, scale
CCCONF = {"ese_alpha": (1, 1000), "ese_beta": (2, 1000), "ese_candidates": (3, 1), "lia_vm_theta": (4, 1000),
          "lia_vm_delta_ms": (5, 1), "ese_confirm": (8, 1)}
CCCONF_ESE_OFF = 6               # 1: MPTCP-D without extra-subflow elimination (Tuning.ese false)
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
    ToR meter's burst (bwcommon.contract.bg_burst_bytes). A pair's BG
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
