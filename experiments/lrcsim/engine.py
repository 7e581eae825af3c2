"""The discrete, delayed LRC system (paper §V-B), simulated.

The controller's and the hosts' halves are the product's own classes
(:class:`apps.lrc.control.LinkFactors`, :class:`hostagent.pair_rates.PairRates`);
this module only supplies what the fabric would:

- time advances in steps of ``dt_s``; the hosts step every τ_v, the
  controller every τ_r;
- the controller sees the active pairs at its rounds (agents report opens
  and closes), measures each link's mean load over the last τ_r (port
  statistics: bytes over the interval), and its factors reach the hosts
  ``delay_s`` after the interval ends (stats round trip + compute + push);
- what the flows actually get is TCP's share modelled at flow level:
  max-min fair sharing of the links' full capacity C with each flow capped
  by its limit and its demand (:func:`fill`). μC < C is LRC's target; C
  is what the wire carries.

The ElasticSwitch-like allocator (:mod:`experiments.lrcsim.elastic`) runs
in the same loop in place of LRC.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from apps.lrc.control import LinkFactors, PairPath
from hostagent.pair_rates import PairRates
from experiments.lrcsim.scenario import Scenario


def fill(caps: np.ndarray, incidence: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Max-min fair rates of flows capped at ``caps`` on links of
    ``capacity`` (progressive filling; ``incidence`` is links × flows,
    0/1)."""
    if caps.size == 0:
        return caps.copy()
    finite = np.minimum(caps, 2 * float(capacity.sum()) + 1.0)     # inf·0 would be NaN
    if np.all(incidence @ finite <= capacity * (1 + 1e-12)):
        return caps.copy()                   # nothing is shared: every flow gets its cap
    rate = np.zeros_like(caps)
    active = caps > 0
    residual = capacity.astype(float).copy()
    for _ in range(caps.size + capacity.size + 1):
        if not active.any():
            break
        users = incidence[:, active].sum(axis=1)
        used = users > 0
        step = np.min(residual[used] / users[used]) if used.any() else math.inf
        step = min(step, float(np.min(caps[active] - rate[active])))
        rate[active] += step
        residual -= step * users
        eps = 1e-9 * max(1.0, float(capacity.max()))
        full = used & (residual <= eps)
        blocked = (incidence[full].sum(axis=0) > 0) if full.any() else np.zeros_like(active)
        active = active & ~blocked & (caps - rate > eps)
    return rate


def jain(x: np.ndarray) -> float:
    return float(x.sum() ** 2 / (x.size * (x ** 2).sum())) if x.size and (x ** 2).sum() > 0 else 1.0


@dataclass
class ShortFlows:
    """A pair's short flows: Poisson arrivals, served processor-sharing
    within the pair's rate; each one's completion time recorded."""
    rate_per_s: float
    size_bits: float
    start_s: float
    stop_s: float
    rng: np.random.Generator
    next_at: float = 0.0
    pending: list = field(default_factory=list)     # [arrival time, bits left]
    last_busy: float | None = None
    fct_s: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.next_at = self.start_s + self.rng.exponential(1 / self.rate_per_s)

    def arrive(self, now: float) -> None:
        while self.next_at <= now and self.next_at < self.stop_s:
            self.pending.append([self.next_at, self.size_bits])
            self.next_at += self.rng.exponential(1 / self.rate_per_s)

    def serve(self, rate_bps: float, dt: float, now: float) -> None:
        budget = rate_bps * dt
        while self.pending and budget > 1e-9:
            share = budget / len(self.pending)
            smallest = min(p[1] for p in self.pending)
            take = min(share, smallest)
            for p in self.pending:
                p[1] -= take
            budget -= take * len(self.pending)
            done = [p for p in self.pending if p[1] <= 1e-6]
            for p in done:
                self.fct_s.append(now + dt - p[0])
            self.pending = [p for p in self.pending if p[1] > 1e-6]

    @property
    def backlogged(self) -> bool:
        return bool(self.pending)


@dataclass
class Trace:
    t: list = field(default_factory=list)
    limit: list = field(default_factory=list)        # per record: flows' limits (nan when inactive)
    rate: list = field(default_factory=list)
    link_load: list = field(default_factory=list)    # physical load per link
    link_limits: list = field(default_factory=list)  # Σ limits of the flows on each link


class Run:
    def __init__(self, sc: Scenario):
        self.sc = sc
        self.flow_ids = [f.id for f in sc.flows]
        self.link_ids = [link.id for link in sc.links]
        li = {lid: k for k, lid in enumerate(self.link_ids)}
        self.A = np.zeros((len(self.link_ids), len(self.flow_ids)))
        for j, f in enumerate(sc.flows):
            for lid in f.links:
                self.A[li[lid], j] = 1.0
        self.C = np.array([link.capacity_mbps for link in sc.links], dtype=float)
        self.mu = np.array([link.mu if link.mu is not None else sc.params.mu for link in sc.links])
        self.muC = self.mu * self.C
        rng = np.random.default_rng(sc.seed)
        self.noise_rng = np.random.default_rng(sc.seed + 1)
        self.short = {j: ShortFlows(f.arrivals.rate_per_s, f.arrivals.size_bytes * 8 / 1e6,
                                    f.arrivals.start_s, f.arrivals.stop_s or sc.duration_s, rng)
                      for j, f in enumerate(sc.flows) if f.arrivals is not None}
        self.trace = Trace()
        self.events: list[float] = sorted({0.0} | {f.start_s for f in sc.flows}
                                          | {f.stop_s for f in sc.flows if f.stop_s is not None})

    def active(self, now: float) -> np.ndarray:
        """The open VM-pairs: a pair of short flows stays open ``pair_idle_s``
        after its last one finished (the agent's linger)."""
        sc = self.sc
        out = np.zeros(len(sc.flows), dtype=bool)
        for j, f in enumerate(sc.flows):
            on = f.start_s <= now and (f.stop_s is None or now < f.stop_s)
            if j in self.short:
                sf = self.short[j]
                if sf.backlogged:
                    sf.last_busy = now
                on = on and sf.last_busy is not None and now - sf.last_busy <= sc.params.pair_idle_s
            out[j] = on
        return out

    def demand(self, active: np.ndarray) -> np.ndarray:
        d = np.where(active, np.inf, 0.0)
        for j, f in enumerate(self.sc.flows):
            if active[j] and f.demand_mbps is not None:
                d[j] = f.demand_mbps
            elif active[j] and j in self.short and not self.short[j].backlogged:
                d[j] = 0.0
        return d

    def run(self) -> Trace:
        sc = self.sc
        dt = sc.dt_s
        n_steps = int(round(sc.duration_s / dt))
        n_v = int(round(sc.params.tau_v_s / dt))
        n_r = int(round(sc.params.tau_r_s / dt))
        n_d = int(round(sc.delay_s / dt))
        n_rec = int(round(sc.record_every_s / dt))
        allocator = make_allocator(self)
        bits = np.zeros(len(self.link_ids))                 # Mbit carried since the last controller round
        # the water-filling is a pure function of the caps: between the hosts' rounds (tau_v, 10 steps by
        # default) they rarely change, so the last answer is reused for the same caps, bit for bit
        last_caps, last_rates = None, None
        for k in range(n_steps):
            now = k * dt
            for sf in self.short.values():
                sf.arrive(now)
            act = self.active(now)
            allocator.before_step(k, now, act, n_v, n_r, n_d)
            limits = allocator.limits(now, act)
            caps = np.minimum(limits, self.demand(act))
            caps = np.where(act, caps, 0.0)
            if last_caps is None or not np.array_equal(caps, last_caps):
                last_caps, last_rates = caps, fill(caps, self.A, self.C)
                last_rates.flags.writeable = False          # shared by the steps that reuse it
            rates = last_rates
            for j, sf in self.short.items():
                sf.serve(rates[j], dt, now)
            load = self.A @ rates
            bits += load * dt
            allocator.after_step(k, now, act, rates, load)
            if (k + 1) % n_r == 0:
                measured = bits / (n_r * dt)
                if sc.load_noise:
                    measured = measured * np.maximum(0.0, 1 + sc.load_noise * self.noise_rng.standard_normal(
                        measured.size))
                allocator.round(k, now + dt, act, measured, n_d)
                bits[:] = 0.0
            if k % n_rec == 0:
                tr = self.trace
                tr.t.append(now)
                tr.limit.append(np.where(act, limits, np.nan))
                tr.rate.append(np.where(act, rates, np.nan))
                tr.link_load.append(load.copy())
                tr.link_limits.append(self.A @ np.where(act, limits, 0.0))
        return self.trace


def make_allocator(run: Run):
    if run.sc.controller == "lrc":
        return LrcAllocator(run)
    from experiments.lrcsim.elastic import ElasticAllocator
    return ElasticAllocator(run)


class LrcAllocator:
    """The product's LinkFactors (controller) and PairRates (hosts)."""

    def __init__(self, run: Run):
        self.run = run
        sc = run.sc
        self.factors = LinkFactors(sc.params, dict(zip(run.link_ids, run.C.tolist())),
                                   {lid: float(m) for lid, m in zip(run.link_ids, run.mu)})
        self.hosts = PairRates(sc.params, float(run.C.max()))
        self.in_flight: deque = deque()                  # (deliver at step, {pair: terms})
        self.known: frozenset = frozenset()
        self.changed = True                              # the hosts' state moved since `cached` was read
        self.cached: tuple | None = None                 # ((the pairs, which are in fallback), their limits)

    def _pairs(self, act: np.ndarray) -> dict:
        return {f.id: PairPath(f.weight, f.guarantee_mbps, frozenset(f.links))
                for j, f in enumerate(self.run.sc.flows) if act[j]}

    def before_step(self, k, now, act, n_v, n_r, n_d) -> None:
        while self.in_flight and self.in_flight[0][0] <= k:
            self.hosts.set_terms(self.in_flight.popleft()[1], now)
            self.changed = True
        for j, f in enumerate(self.run.sc.flows):
            if act[j]:
                self.hosts.open(f.id, f.guarantee_mbps, f.weight)    # Algorithm 1: B_i at once, locally
            else:
                self.hosts.forget(f.id)
        if k % n_v == 0:
            self.hosts.step(now)
            self.changed = True
        # a pair opened or closed changes the pairs' names, which limits compares

    def limits(self, now, act) -> np.ndarray:
        """PairRates.limits for the active flows. Between the hosts' rounds
        nothing it reads moves but the clock, and the clock only through
        each pair's fallback test: the last array is reused while the pairs,
        their state and which of them are in fallback are what they were
        (PairRates' own test)."""
        names = tuple(self.hosts.pairs)
        fallen = tuple(self.hosts.fallen_back(pr, now) for pr in self.hosts.pairs.values())
        if not self.changed and self.cached[0] == (names, fallen):      # changed until cached is set
            return self.cached[1]
        lim = self.hosts.limits(now)
        out = np.array([lim.get(f.id, 0.0) if act[j] else 0.0 for j, f in enumerate(self.run.sc.flows)])
        out.flags.writeable = False                   # shared by the steps that reuse it
        self.cached, self.changed = ((names, fallen), out), False
        return out

    def after_step(self, *_):
        pass

    def round(self, k, now, act, loads, n_d) -> None:
        pairs = self._pairs(act)
        if frozenset(pairs) != self.known or any(self.factors.pairs.get(p) != pp for p, pp in pairs.items()):
            self.factors.set_pairs(pairs)
            self.known = frozenset(pairs)
        self.factors.update(dict(zip(self.run.link_ids, loads.tolist())))
        terms = {p: (self.factors.pair_factor(p), pp.weight, pp.guarantee_mbps) for p, pp in pairs.items()}
        self.in_flight.append((k + 1 + n_d, terms))
