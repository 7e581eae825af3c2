"""Where each subflow goes, decided by the product's own routing code.

- ``single_path``: ``DestinationRouting(multipath=False).single_path``, the
  path the baseline app installs;
- ``ecmp``: at every switch with several equal-cost next hops, the SELECT
  group the ECMP app installs (``DestinationRouting.bucket_layout``: each
  next hop's port repeated P_L times), its bucket chosen by one 64-bit hash
  of the subflow's 5-tuple -- the same hash at every switch, as Open vSwitch
  does (``hash(sym_l4(0))``, apps/routing/logic.py); OVS's hash function is
  not reproduced (a splitmix64 of the 5-tuple stands in for it);
- ``lessor`` / ``hedera``: ``LessorLogic`` / ``HederaLogic`` themselves,
  driven as ``apps/lessor/app.py``'s polling loop drives them: the first poll
  1 s after start; each poll reads every ToR's counters (the simulated
  subflows' bytes so far, as OpenFlow match fields: the learned accounting
  entries) and hands them to ``flow_stats`` one RTT later; at the decision
  time PRE's schedule gives (first reply + T/2) Algorithm 1 decides the next
  period from the controller's CPU share, the long flows are allocated when
  ``allocation_needed`` says so (PMPT / Global First Fit), installed, and
  policed (receiver fairness: the meter rate caps the flow); the installed
  exact paths take effect half an RTT later (flow-mods reach the switches).
  Subflows without an exact entry follow the ECMP groups.

The controller's CPU share Algorithm 1 sees: ``cpu`` fixed (deterministic
runs, tests), or ``None`` -- the process time the logic really spent in the
last period over the period's simulated length (what the controller would
measure running in real time: PMPT's cost at k = 32 stretches the period,
as it would in production).
"""

from __future__ import annotations

import math
import time

from apps.lessor.hedera_logic import HederaLogic
from apps.lessor.logic import LessorLogic
from apps.lessor.settings import PollingConfig
from apps.routing.logic import DestinationRouting
from controller import ofmsg

from experiments.flowsim.net import SimError, SimNet

ROUTINGS = ("single_path", "ecmp", "hedera", "lessor")
FIRST_POLL_S = 1.0          # apps/lessor/app.py: the polling loop's first sleep


def flow_hash(src_ip: int, dst_ip: int, proto: int, sport: int, dport: int) -> int:
    """A 64-bit mix of the 5-tuple (splitmix64 rounds): the stand-in for
    the switch's packet hash."""
    mask = (1 << 64) - 1
    x = (src_ip * 0x9E3779B97F4A7C15 ^ dst_ip * 0xBF58476D1CE4E5B9 ^ (proto << 40) ^ (sport << 16) ^ dport) & mask
    for _ in range(2):
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & mask
        x = (x ^ (x >> 27)) * 0x94D049BB133111EB & mask
        x ^= x >> 31
    return x


class EcmpRouter:
    """Destination-based routing, with or without multipath."""
    controller = False

    def __init__(self, net: SimNet, multipath: bool = True):
        self.net = net
        self.routing = DestinationRouting(net.view, multipath=multipath)
        self.multipath = multipath
        self._layouts: dict[tuple[str, str], tuple[str, ...]] = {}
        self._groups: dict[tuple[str, tuple[str, ...]], tuple[str, ...]] = {}
        self._single: dict[tuple[str, str], tuple[str, ...] | None] = {}

    def _layout(self, switch: str, dst: str) -> tuple[str, ...]:
        """The group's buckets at ``switch`` towards ``dst``, as next-hop nodes."""
        got = self._layouts.get((switch, dst))
        if got is None:
            view = self.net.view
            hops = tuple(view.next_hops(switch, dst))
            got = self._groups.get((switch, hops))     # one group per next-hop set, as the app installs
            if got is None:
                if len(hops) <= 1:
                    got = hops
                else:
                    layout = self.routing.bucket_layout(switch, [view.port(switch, h) for h in hops])
                    got = tuple(view.peer(switch, p) for p in layout)
                self._groups[(switch, hops)] = got
            self._layouts[(switch, dst)] = got
        return got

    def default_path(self, key: tuple, key_hash: int, src: str, dst: str) -> tuple[str, ...] | None:
        """The path the destination-based defaults give a subflow from host
        ``src`` to host ``dst`` (None: unreachable)."""
        if src == dst:
            return (src,)
        if not self.multipath:
            got = self._single.get((src, dst), False)
            if got is False:
                got = self._single[(src, dst)] = self.routing.single_path(src, dst)
            return got
        path = [src, self.net.tor_of[src]]
        node = path[-1]
        while node != dst:
            buckets = self._layout(node, dst)
            if not buckets:
                return None
            node = buckets[key_hash % len(buckets)]
            path.append(node)
            if len(path) > 16:
                raise SimError(f"routing loop from {src} to {dst}: {path}")
        return tuple(path)

    def path(self, key: tuple, key_hash: int, src: str, dst: str) -> tuple[str, ...] | None:
        return self.default_path(key, key_hash, src, dst)

    def cap(self, key: tuple) -> float:
        return math.inf

    def next_event(self) -> float:
        return math.inf


class PinnedRouter(EcmpRouter):
    """ECMP with the paths of some (source host, destination host) pairs
    given: an emulated run's own hash draw, as the switches took it
    (``experiments.pathprobe``), replayed so the sharing is compared on the
    same paths. Pairs not given follow the ECMP groups."""

    def __init__(self, net: SimNet, paths: dict[tuple[str, str], tuple[str, ...]]):
        super().__init__(net, multipath=True)
        for (src, dst), path in paths.items():
            path = tuple(path)
            if len(path) < 2 or path[0] != src or path[-1] != dst:
                raise SimError(f"pinned path {path!r} does not run from {src} to {dst}")
            missing = [(u, v) for u, v in zip(path, path[1:]) if (u, v) not in net.link_index]
            if missing:
                raise SimError(f"pinned path {path!r} from {src} to {dst}: no link {missing[0]}")
        self.pinned = {k: tuple(p) for k, p in paths.items()}

    def path(self, key: tuple, key_hash: int, src: str, dst: str) -> tuple[str, ...] | None:
        got = self.pinned.get((src, dst))
        return got if got is not None else self.default_path(key, key_hash, src, dst)


class TeRouter(EcmpRouter):
    """LESSOR or Hedera in the loop (see the module's text)."""
    controller = True

    def __init__(self, net: SimNet, kind: str, rtt_s: float = 0.001, cpu: float | None = 0.0,
                 polling: PollingConfig | None = None, epsilon: float = 0.05,
                 long_flow_bytes: int | None = None, fair_receivers: bool = True):
        super().__init__(net, multipath=True)
        if kind not in ("lessor", "hedera"):
            raise SimError(f"routing {kind!r}: the controllers in the loop are lessor and hedera")
        if not (isinstance(rtt_s, (int, float)) and math.isfinite(rtt_s) and 0 <= rtt_s <= 1):
            raise SimError(f"rtt_s {rtt_s!r}: must be a finite number of seconds in [0, 1]")
        if cpu is not None and not (isinstance(cpu, (int, float)) and math.isfinite(cpu) and 0 <= cpu <= 1):
            raise SimError(f"cpu {cpu!r}: must be None (measured) or a share in [0, 1]")
        extra = {} if long_flow_bytes is None else {"long_flow_bytes": long_flow_bytes}
        cls = LessorLogic if kind == "lessor" else HederaLogic
        self.logic = cls(net.view, polling, epsilon, **extra)
        self.logic.fair_receivers = fair_receivers
        self.kind = kind
        self.rtt_s = float(rtt_s)
        self.cpu = cpu
        self.next_poll = FIRST_POLL_S
        self.decide_at: float | None = None
        self.effective_at: float | None = None   # when the last decision's entries are in the switches
        self._paths: dict[tuple, tuple[str, ...]] = {}    # in force: key -> host path
        self._caps: dict[tuple, float] = {}
        self._pending: tuple[dict, dict] | None = None
        self._cpu_s = 0.0
        self._period_start = 0.0
        self.decisions: list[dict] = []      # per decision: time, period, cpu, flows, PMPT's seconds, moved

    def path(self, key, key_hash, src, dst):
        got = self._paths.get(key)
        return got if got is not None else self.default_path(key, key_hash, src, dst)

    def cap(self, key) -> float:
        return self._caps.get(key, math.inf)

    def next_event(self) -> float:
        return min(self.next_poll if self.decide_at is None else math.inf,
                   self.decide_at if self.decide_at is not None else math.inf,
                   self.effective_at if self.effective_at is not None else math.inf)

    def on_event(self, now: float, counters) -> bool:
        """Runs what is due at ``now``; True when paths or caps in force
        changed. ``counters()`` -> {ToR: [(match fields, byte count)]}."""
        changed = False
        if self.effective_at is not None and now >= self.effective_at:
            self._paths, self._caps = self._pending
            self._pending = self.effective_at = None
            changed = True
        if self.decide_at is None and now >= self.next_poll:
            t0 = time.process_time()
            requests = self.logic.poll(now)
            by_tor = counters()
            for tor in requests:
                self.logic.flow_stats(tor, by_tor.get(tor, []), now + self.rtt_s)
            self.decide_at = self.logic.schedule.decide_at
            self._cpu_s += time.process_time() - t0
        if self.decide_at is not None and now >= self.decide_at:
            self._decide(now)
        return changed

    def _decide(self, now: float) -> None:
        logic = self.logic
        t0 = time.process_time()
        span = max(now - self._period_start, 1e-9)
        cpu = self.cpu if self.cpu is not None else min(1.0, self._cpu_s / span)
        self.next_poll = logic.decide(now, cpu, self.rtt_s)
        logic.polling.record_rtt(self.rtt_s)
        flows = logic.long_flows()
        seconds, moved = 0.0, 0
        if logic.allocation_needed(flows):
            logic.allocations += 1
            t1 = time.perf_counter()
            allocation = logic.allocate(flows)
            logic.install(allocation, flows)
            seconds = time.perf_counter() - t1
            moved = logic.moves_per_allocation[-1]
        else:
            logic.allocations_skipped += bool(flows)
        logic.police()
        self._pending = ({k: v.path for k, v in logic.installed.items()},
                         {k: pol.rate_kbps * 1000.0 for k, pol in logic.policed.items()})
        self.effective_at = now + self.rtt_s / 2
        self.decide_at = None
        self._cpu_s = time.process_time() - t0
        self._period_start = now
        self.decisions.append({"t": round(now, 6), "period_s": logic.polling.period_s, "cpu": cpu,
                               "long_flows": len(flows), "pmpt_s": seconds, "moved": moved})


def make_router(net: SimNet, routing: str, **te) -> EcmpRouter:
    if routing == "single_path":
        return EcmpRouter(net, multipath=False)
    if routing == "ecmp":
        return EcmpRouter(net, multipath=True)
    if routing in ("lessor", "hedera"):
        return TeRouter(net, routing, **te)
    raise SimError(f"routing {routing!r}: known are {', '.join(ROUTINGS)}")


def counter_match(in_port: int, src_ip: str, dst_ip: str, sport: int, dport: int) -> dict:
    """A ToR's learned accounting entry for a TCP subflow, as os-ken's
    ``match.items()`` gives it (what ``LessorLogic.flow_stats`` reads)."""
    return {"in_port": in_port, "eth_type": ofmsg.ETH_TYPE_IP, "ipv4_src": src_ip, "ipv4_dst": dst_ip,
            "ip_proto": ofmsg.IPPROTO_TCP, "tcp_src": sport, "tcp_dst": dport}
