"""LRC at the host: which VM-pairs are open, their guarantees, v and limits.

- A pair (this VM -> a peer of its tenant) is open while this VM has sent
  on a connection or UDP flow to that peer within ``pair_idle_s`` --
  sent data, not only ACKs: with LRC the agent turns on conntrack's byte
  counters (nf_conntrack_acct), and a round counts when this VM sent at
  least 1500 bytes and a tenth of what the peer sent.
  The kernel says so: a conntrack entry's remaining timeout is refreshed on
  every packet, so "full timeout − remaining" is how long it has been idle
  (:func:`active_peers`; ESTABLISHED TCP and UDP, either direction). An
  ESTABLISHED entry with data in flight is refreshed to the
  "unacknowledged" timeout (300 s), not the established one (5 days): a
  remaining timeout at or below the former is read against it.
- Algorithm 1 (:func:`bwcommon.lrc.sender_halves`): the sender half
  B_x·w_y/Σ_{X^r} w of every open pair, recomputed whenever the open set
  changes; until the controller's B_i (both halves of Eq. 2) arrives, and
  whenever it is older than ``fallback_s``, a pair's guarantee is its
  sender half; otherwise min(sender half, controller's B_i).
- v by Eq. 27 from the controller's latest (r̃_i, w_i) every τ_v
  (:class:`hostagent.pair_rates.PairRates`: held when factors stop for
  ``hold_s``, B_i after ``fallback_s``).
- Limits: paper mode one limit max(B_i, v_i) per pair; combined mode BG =
  B_i per pair and the rest, max(B_i, v_i) − B_i, to the WC subflows --
  as the VM's WC competition level A_l = Σ excess / U (``wc:
  competition``, the default: bwf_wc shares the spare in proportion, no
  cap at the host) or as an HTB ceiling per pair (``wc: ceiling``)
  (:class:`hostagent.plan.PairLimit`).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from bwcommon import lrc as M
from hostagent.pair_rates import PairRates
from hostagent.plan import LrcPolicy, PairLimit

TCP, UDP = 6, 17
IPS_ASSURED = 1 << 2


@dataclass(frozen=True)
class Entry:
    """One conntrack entry, as much of it as LRC reads (bytes per direction
    only with nf_conntrack_acct)."""
    saddr: str
    daddr: str
    proto: int
    tcp_established: bool
    assured: bool
    timeout_s: int
    sport: int = 0
    dport: int = 0
    orig_bytes: int | None = None
    reply_bytes: int | None = None

    @property
    def key(self) -> tuple:
        return (self.proto, self.saddr, self.sport, self.daddr, self.dport)


SENDING_MIN_BYTES = 1500       # per round, at least this much of our own...
SENDING_SHARE = 0.1            # ...and a tenth of what the peer sent: ACKs alone (~3 %) do not make a pair


@dataclass(frozen=True)
class Timeouts:
    tcp_established: int = 432000
    udp: int = 30
    udp_stream: int = 120
    # an ESTABLISHED entry with data in flight is refreshed to this instead (a sender's always is)
    tcp_unacknowledged: int = 300

    @classmethod
    def read(cls, root: Path = Path("/proc/sys/net/netfilter")) -> "Timeouts":
        def one(name: str, default: int) -> int:
            try:
                return int((root / name).read_text())
            except (OSError, ValueError):
                return default
        return cls(one("nf_conntrack_tcp_timeout_established", 432000), one("nf_conntrack_udp_timeout", 30),
                   one("nf_conntrack_udp_timeout_stream", 120), one("nf_conntrack_tcp_timeout_unacknowledged", 300))


def active_peers(entries, address: str, peers, idle_s: float, timeouts: Timeouts,
                 seen: dict | None = None) -> set[str]:
    """Peers this VM sends to: an entry to or from ``address`` idle for at
    most ``idle_s`` -- and, when the kernel counts bytes (``seen`` keeps
    each entry's last counts between calls), one on which this VM sent at
    least ``SENDING_MIN_BYTES`` and a tenth of what the peer sent since the
    last call (a receiver's ACKs are about 3 % of the data: not a pair)."""
    peers = set(peers)
    out = set()
    counted: dict = {}
    for e in entries:
        if e.saddr == address:
            other, mine, theirs = e.daddr, e.orig_bytes, e.reply_bytes
        elif e.daddr == address:
            other, mine, theirs = e.saddr, e.reply_bytes, e.orig_bytes
        else:
            continue
        if other not in peers:
            continue
        if seen is not None and mine is not None and theirs is not None:
            counted[e.key] = (mine, theirs)
            before = seen.get(e.key)
            if before is None:
                continue                    # first sight: no delta yet
            d_mine, d_theirs = mine - before[0], theirs - before[1]
            if d_mine < max(SENDING_MIN_BYTES, SENDING_SHARE * d_theirs):
                continue
        if e.proto == TCP and e.tcp_established:
            # refreshed to the established timeout, or to the unacknowledged one while data is in flight
            full = timeouts.tcp_unacknowledged if e.timeout_s <= timeouts.tcp_unacknowledged \
                else timeouts.tcp_established
        elif e.proto == UDP:
            full = timeouts.udp_stream if e.assured else timeouts.udp
        else:
            continue
        if full - e.timeout_s <= idle_s:
            out.add(other)
    if seen is not None:
        seen.clear()
        seen.update(counted)
    return out


PROC_CONNTRACK = Path("/proc/net/nf_conntrack")


def parse_proc_conntrack(text: str) -> list[Entry]:
    """The kernel's own text of the table (``/proc/net/nf_conntrack``,
    CONFIG_NF_CONNTRACK_PROCFS): per line the family, the protocol name and
    number, the remaining timeout (s), for TCP the state, then the original
    tuple (``src=`` ``dst=`` ...), flags such as ``[ASSURED]``. Lines that
    do not parse are skipped."""
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) < 6 or f[0] != "ipv4":
            continue
        try:
            proto, timeout = int(f[3]), int(f[4])
        except ValueError:
            continue
        src = next((x[4:] for x in f if x.startswith("src=")), None)
        dst = next((x[4:] for x in f if x.startswith("dst=")), None)
        if src is None or dst is None:
            continue
        ports = [int(x[6:]) for x in f if x.startswith(("sport=", "dport=")) and x[6:].isdigit()]
        counts = [int(x[6:]) for x in f if x.startswith("bytes=") and x[6:].isdigit()]
        out.append(Entry(src, dst, proto, proto == TCP and f[5] == "ESTABLISHED", "[ASSURED]" in f, timeout,
                         *(ports[:2] if len(ports) >= 2 else (0, 0)),
                         *(counts[:2] if len(counts) >= 2 else (None, None))))
    return out


def read_conntrack() -> list[Entry]:
    """This network namespace's conntrack table: the kernel's text when it
    offers one (0.15 ms), else pyroute2's netlink dump (about 10 ms of CPU
    per dump in pyroute2 0.9.7, even of an empty table -- 20 % of a core
    at τ_v = 50 ms, which is why the text comes first)."""
    try:
        return parse_proc_conntrack(PROC_CONNTRACK.read_text())
    except OSError:
        pass
    from pyroute2 import Conntrack

    out = []
    with Conntrack() as ct:
        for e in ct.dump_entries():
            t = e.tuple_orig
            if t is None or t.saddr is None:
                continue
            state = getattr(getattr(e, "protoinfo", None), "state", None)
            out.append(Entry(str(t.saddr), str(t.daddr), int(t.proto or 0),
                             state is not None and getattr(state, "name", str(state)) == "ESTABLISHED",
                             bool((e.status or 0) & IPS_ASSURED), int(e.timeout or 0)))
    return out


@dataclass
class LrcHost:
    address: str
    nic_mbps: float
    guarantee_mbps: float
    policy: LrcPolicy
    rates: PairRates = field(init=False)
    last_active: dict = field(default_factory=dict)     # peer -> when last seen active
    controller_b: dict = field(default_factory=dict)    # peer -> (B_i, received at)
    terms_received: int = 0
    terms_refused: int = 0

    def __post_init__(self) -> None:
        self.rates = PairRates(self.policy.params, self.nic_mbps)

    def compatible(self, address: str, nic_mbps: float, policy: LrcPolicy) -> bool:
        """Can this state carry on under a new configuration (v kept)? A new
        guarantee does not stop it: :meth:`reconfigure` takes it."""
        return (address, nic_mbps, policy.mode, policy.params) == (self.address, self.nic_mbps, self.policy.mode,
                                                                   self.policy.params)

    def reconfigure(self, guarantee_mbps: float, policy: LrcPolicy) -> None:
        self.guarantee_mbps, self.policy = guarantee_mbps, policy
        for peer in [p for p in self.rates.pairs if p not in policy.peers]:
            self.rates.forget(peer)
            self.last_active.pop(peer, None)

    @property
    def open(self) -> list[str]:
        return sorted(self.rates.pairs, key=ipaddress.IPv4Address)

    def observe(self, active: set[str], now: float) -> bool:
        """The peers active now; returns whether the open set changed."""
        for peer in active:
            if peer in self.policy.peers:
                self.last_active[peer] = now
        idle = self.policy.params.pair_idle_s
        want = {p for p, t in self.last_active.items() if now - t <= idle}
        for p in [p for p in self.last_active if p not in want]:
            del self.last_active[p]
        before = set(self.rates.pairs)
        if want == before:
            return False
        for p in before - want:
            self.rates.forget(p)
            self.controller_b.pop(p, None)
        halves = self.sender_halves(want)
        n = len(want)
        for p in sorted(want - before, key=ipaddress.IPv4Address):
            # w_i until the controller's: Eq. 1 with this side's |X^r| and the receiver's |Y^s| taken as 1
            self.rates.open(p, halves[p], self.policy.weight / n + self.policy.peers[p].weight)
        return True

    def sender_halves(self, open_peers=None) -> dict[str, float]:
        """Algorithm 1: B_x·w_y/Σ_{X^r} w over the open pairs."""
        peers = set(self.rates.pairs) if open_peers is None else set(open_peers)
        return M.sender_halves(self.guarantee_mbps, {p: self.policy.peers[p].weight for p in peers})

    def set_terms(self, factors, now: float) -> None:
        """The controller's latest {peer: [r̃_i, w_i, B_i]}: checked whole
        (a bad one changes nothing), taken for the open pairs."""
        if not isinstance(factors, dict):
            self.terms_refused += 1
            raise M.LrcError("factors must be an object {peer address: [r_tilde, weight, guarantee]}")
        checked = {}
        for peer, t in factors.items():
            if peer not in self.policy.peers:
                self.terms_refused += 1
                raise M.LrcError(f"factors for {peer!r}, not a peer of this VM")
            if not (isinstance(t, list) and len(t) == 3):
                self.terms_refused += 1
                raise M.LrcError(f"factors[{peer}] must be [r_tilde, weight, guarantee]")
            checked[peer] = tuple(t)
        try:
            self.rates.set_terms({p: t for p, t in checked.items() if p in self.rates.pairs}, now)
        except M.LrcError:
            self.terms_refused += 1
            raise
        for p, (_, _, b) in checked.items():
            if p in self.rates.pairs:
                self.controller_b[p] = (float(b), now)
        self.terms_received += 1

    def step(self, now: float) -> None:
        self.rates.step(now)

    def guarantees(self, now: float) -> dict[str, float]:
        halves = self.sender_halves()
        out = {}
        for p, half in halves.items():
            b, at = self.controller_b.get(p, (None, None))
            fresh = b is not None and now - at <= self.policy.params.fallback_s
            out[p] = min(half, b) if fresh else half
        return out

    def limits(self, now: float) -> dict[str, PairLimit]:
        out = {}
        for p, b in self.guarantees(now).items():
            pr = self.rates.pairs[p]
            pr.guarantee_mbps = b
            total = min(self.rates.limit(p, now), self.nic_mbps)
            if self.policy.mode == "paper":
                out[p] = PairLimit(total)
            elif self.policy.wc == "ceiling":
                out[p] = PairLimit(*M.split_limits(b, total))
            else:
                out[p] = PairLimit(b)
        return out

    def competition(self, now: float, unit_mbps: float) -> float | None:
        """Combined mode with ``wc: competition``: the VM's A_l, its pairs'
        excess Σ (max(B_i, v_i) − B_i) in units of U (None otherwise)."""
        if self.policy.mode != "combined" or self.policy.wc != "competition":
            return None
        excess = 0.0
        for p, b in self.guarantees(now).items():
            excess += max(0.0, min(self.rates.limit(p, now), self.nic_mbps) - b)
        return excess / unit_mbps

    def report(self, now: float) -> dict[str, dict]:
        """Per open pair: v, the limit in force, B_i, the factor's age."""
        lim = self.limits(now)
        b = self.guarantees(now)
        out = {}
        for p in self.open:
            pr = self.rates.pairs[p]
            total = lim[p].bg_mbps + (lim[p].wc_mbps or 0.0)
            out[p] = {"v_mbps": round(pr.v, 4), "limit_mbps": round(total, 4), "guarantee_mbps": round(b[p], 4),
                      "weight": pr.weight, "factor_age_s": None if pr.received_at is None
                      else round(now - pr.received_at, 3)}
        return out
