"""PRE: performance-oriented resource excavation (LESSOR §4.2), pure logic.

- ``AdaptivePolling``: Algorithm 1, the polling period T adapted to the
  controller's CPU utilisation CU (LT = 50 %, UT = 70 %):
      CU < LT        -> T <- T / 2
      LT <= CU <= UT -> T <- T * (1 + alpha * dir), alpha <- max(0.01, alpha - 0.01),
                        dir = +1 if the controller-switch RTT (OpenFlow echo)
                        exceeds 2x its average, else -1
      CU > UT        -> T <- 2 T
  T starts at 5 s, alpha at 0.05; T is kept within configurable bounds. The
  next period is decided T/2 after the first reply of the current poll.
- ``predict_rate``: Eq. 4, V = (Vp + Vc) / 2 if 0.9 Vp <= Vc <= 1.1 Vp, else
  (Vp + Vc + Vn) / 3 after a recheck gives Vn.
- ``FlowTable``: per-flow byte counters from ToR polls -> rates, Eq. 4
  predictions with rechecks, short/long classification (long once 100 KB
  have been sent, or when the host labels the flow).
- ``link_loads`` / ``available_bandwidth``: link loads f(e) derived from flow
  rates along known paths (only ToRs are polled), and W_sd, the bandwidth
  still available between two ToRs (max flow over residual capacities).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Hashable, Iterable

import networkx as nx

from controller.network_view import NetworkView
from apps.lessor.settings import LONG_FLOW_BYTES, PollingConfig  # noqa: F401 (re-exported)
from bwcommon.validate import finite_number

MAX_RTT_S = 3600.0   # a controller-switch RTT beyond an hour is no measurement (and sums of such overflow)
RECHECK_BAND = 0.10


@dataclass
class AdaptivePolling:
    """Algorithm 1. Feed RTT samples with ``record_rtt``; call ``decide``
    with the controller's CPU utilisation (0..1) and the latest RTT."""
    config: PollingConfig = field(default_factory=PollingConfig)
    period_s: float = field(init=False)
    alpha: float = field(init=False)
    _rtt_sum: float = field(default=0.0, init=False)
    _rtt_n: int = field(default=0, init=False)
    history: list[tuple[float, float, str]] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.config.check()
        self.period_s = self.config.initial_s
        self.alpha = self.config.alpha

    @property
    def rtt_average(self) -> float | None:
        return self._rtt_sum / self._rtt_n if self._rtt_n else None

    def record_rtt(self, rtt_s: float) -> None:
        if not finite_number(rtt_s) or not 0 <= rtt_s <= MAX_RTT_S:
            raise ValueError(f"rtt {rtt_s!r}: must be a number of seconds in [0, {MAX_RTT_S:g}]")
        self._rtt_sum += rtt_s
        self._rtt_n += 1

    def decide(self, cpu: float, rtt_s: float | None = None) -> float:
        """Refuses (ValueError, nothing changed) a CPU utilisation that is not
        a finite number >= 0 or an RTT that is not finite and >= 0."""
        if not finite_number(cpu) or cpu < 0:
            raise ValueError(f"cpu {cpu!r}: must be a finite utilisation >= 0")
        if rtt_s is not None and (not finite_number(rtt_s) or not 0 <= rtt_s <= MAX_RTT_S):
            raise ValueError(f"rtt {rtt_s!r}: must be a number of seconds in [0, {MAX_RTT_S:g}]")
        c = self.config
        if cpu < c.lower:
            self.period_s /= 2
            why = "idle: halve"
        elif cpu <= c.upper:
            avg = self.rtt_average
            direction = 1 if (rtt_s is not None and avg is not None and rtt_s > c.rtt_factor * avg) else -1
            self.period_s *= 1 + self.alpha * direction
            self.alpha = max(c.alpha_min, self.alpha - c.alpha_step)
            why = "busy: lengthen (slow echo)" if direction > 0 else "busy: shorten"
        else:
            self.period_s *= 2
            why = "overloaded: double"
        self.period_s = min(c.max_s, max(c.min_s, self.period_s))
        self.history.append((cpu, self.period_s, why))
        return self.period_s


@dataclass
class PollSchedule:
    """When to poll and when to decide the next period: poll k is sent at
    s_k; its first reply arrives at r_k; the next period is decided at
    r_k + T/2; the next poll goes out at max(decision time, s_k + T)."""
    polling: AdaptivePolling
    sent_at: float | None = None
    decide_at: float | None = None

    def poll_sent(self, now: float) -> None:
        self.sent_at = now
        self.decide_at = None

    def first_reply(self, now: float) -> float:
        if self.decide_at is None:
            self.decide_at = now + self.polling.period_s / 2
        return self.decide_at

    def decide(self, now: float, cpu: float, rtt_s: float | None) -> float:
        """Returns the time of the next poll."""
        period = self.polling.decide(cpu, rtt_s)
        start = self.sent_at if self.sent_at is not None else now
        return max(now, start + period)


def predict_rate(previous: float, current: float, recheck: float | None = None) -> float | None:
    """Eq. 4. None means: outside +-10 %, recheck soon and call again with
    the recheck's rate."""
    if (1 - RECHECK_BAND) * previous <= current <= (1 + RECHECK_BAND) * previous:
        return (previous + current) / 2
    if recheck is None:
        return None
    return (previous + current + recheck) / 3


@dataclass
class FlowState:
    key: Hashable
    src_tor: str
    dst_tor: str
    bytes: int = 0
    last_t: float | None = None
    prev_rate: float | None = None       # Vp, bits/s
    current_rate: float | None = None    # Vc awaiting a recheck
    predicted: float | None = None       # V
    labelled_size: int | None = None
    long: bool = False
    needs_recheck: bool = False


# Counts closer together than this give no rate (polls are 0.5 s apart at the least; a
# recheck follows its poll by a round trip)
MIN_RATE_INTERVAL_S = 1e-3


class FlowTable:
    """Rates and classes of the flows seen in ToR flow statistics."""

    def __init__(self, long_bytes: int = LONG_FLOW_BYTES):
        self.long_bytes = long_bytes
        self.flows: dict[Hashable, FlowState] = {}

    def label(self, key: Hashable, src_tor: str, dst_tor: str, size_bytes: int) -> None:
        """The end host says this flow will carry ``size_bytes``: it is long
        at once if that reaches the threshold."""
        if size_bytes < 0:
            raise ValueError(f"flow {key}: size {size_bytes} must be >= 0")
        st = self.flows.setdefault(key, FlowState(key, src_tor, dst_tor))
        st.labelled_size = size_bytes
        st.long = st.long or size_bytes >= self.long_bytes

    def update(self, key: Hashable, src_tor: str, dst_tor: str, byte_count: int, now: float) -> FlowState:
        """A poll (or a recheck) reported ``byte_count`` for the flow. A count
        that is not an integer in 0..2^64-1 or a time that is not finite is
        refused (ValueError naming the flow), the table unchanged."""
        if isinstance(byte_count, bool) or not isinstance(byte_count, int) or not 0 <= byte_count < 2**64:
            raise ValueError(f"flow {key}: byte count {byte_count!r} must be an integer in 0..2^64-1")
        if not finite_number(now):
            raise ValueError(f"flow {key}: time {now!r} must be finite")
        st = self.flows.setdefault(key, FlowState(key, src_tor, dst_tor))
        if st.last_t is not None and 0 < now - st.last_t < MIN_RATE_INTERVAL_S and byte_count >= st.bytes:
            # too soon after the last count for a rate (1949 B over 1e-304 s is infinite): the
            # next one is measured from the last, over the whole interval
            st.long = st.long or byte_count >= self.long_bytes
            return st
        if st.last_t is not None and now > st.last_t and byte_count >= st.bytes:
            rate = (byte_count - st.bytes) * 8 / (now - st.last_t)
            if st.needs_recheck:
                st.predicted = predict_rate(st.prev_rate, st.current_rate, rate)
                st.prev_rate, st.current_rate, st.needs_recheck = rate, None, False
            elif st.prev_rate is None:
                st.prev_rate = st.predicted = rate
            else:
                pred = predict_rate(st.prev_rate, rate)
                if pred is None:
                    st.current_rate, st.needs_recheck = rate, True
                else:
                    st.predicted, st.prev_rate = pred, rate
        st.bytes, st.last_t = byte_count, now
        st.long = st.long or byte_count >= self.long_bytes
        return st

    def remove(self, key: Hashable) -> None:
        self.flows.pop(key, None)

    def long_flows(self) -> list[FlowState]:
        return sorted((s for s in self.flows.values() if s.long), key=lambda s: str(s.key))

    def rechecks(self) -> list[Hashable]:
        return sorted((s.key for s in self.flows.values() if s.needs_recheck), key=str)

    def remaining_bytes(self, key: Hashable) -> int | None:
        st = self.flows[key]
        if st.labelled_size is None:
            return None
        return max(0, st.labelled_size - st.bytes)


def link_loads(view: NetworkView, rates_on_paths: Iterable[tuple[tuple[str, ...], float]]) -> dict[tuple[str, str], float]:
    """f(e) for every link: the sum of the rates of the flows whose known path
    crosses it (aggregation and core loads are computed, never polled)."""
    loads: dict[tuple[str, str], float] = {}
    for path, rate in rates_on_paths:
        for link in view.path_links(path):
            loads[link] = loads.get(link, 0.0) + rate
    return loads


def available_bandwidth(view: NetworkView, loads: dict[tuple[str, str], float], src_tor: str,
                        dst_tor: str) -> float:
    """W_sd: the most traffic ToR src could still send to ToR dst through
    the switches (max flow over residual capacities c(e) - f(e))."""
    if src_tor == dst_tor:
        return math.inf
    g = nx.DiGraph()
    for u, v, d in view.graph.edges(data=True):
        if d["up"] and not view.is_host(u) and not view.is_host(v):
            g.add_edge(u, v, capacity=max(0.0, d["capacity"] - loads.get((u, v), 0.0)))
    if src_tor not in g or dst_tor not in g:
        return 0.0
    return float(nx.maximum_flow_value(g, src_tor, dst_tor))
