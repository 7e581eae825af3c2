"""Hedera as a controller (the baseline LESSOR is compared with): the same
ToR counters, polling and installation as LESSOR, but Hedera's policy:
a fixed 5 s polling period, elephants only (>= 10 % of the NIC rate),
natural demands by Hedera's estimation, Global First Fit over the candidate
paths (a flow no path can hold stays on its ECMP path), and GFF re-run from
scratch every period (no hysteresis)."""

from __future__ import annotations

import math

import numpy as np

from apps.lessor.hedera import ELEPHANT_FRACTION, POLL_PERIOD_S, estimate_demands, global_first_fit
from apps.lessor.logic import LessorLogic
from apps.lessor.pmpt import Allocation, LongFlow
from apps.lessor.pre import LONG_FLOW_BYTES, PollingConfig
from controller.network_view import NetworkView

HEDERA_POLLING = PollingConfig(initial_s=POLL_PERIOD_S, min_s=POLL_PERIOD_S, max_s=POLL_PERIOD_S)


class HederaLogic(LessorLogic):
    def __init__(self, view: NetworkView, polling: PollingConfig | None = None, epsilon: float = 0.05,
                 long_flow_bytes: int = LONG_FLOW_BYTES):
        """Hedera polls every 5 s whatever LESSOR's polling settings say
        (``polling`` is accepted for the app's signature and ignored)."""
        super().__init__(view, HEDERA_POLLING, epsilon, long_flow_bytes)

    def reconfigure(self, polling: PollingConfig, epsilon: float, long_flow_bytes: int) -> None:
        super().reconfigure(HEDERA_POLLING, epsilon, long_flow_bytes)

    def long_flows(self) -> list[LongFlow]:
        states = [s for s in self.table.flows.values() if s.src_tor != s.dst_tor and s.predicted is not None
                  and s.predicted >= ELEPHANT_FRACTION * self._nic(s.key[0])]
        states.sort(key=lambda s: str(s.key))
        natural = estimate_demands([(s.key[0], s.key[1]) for s in states])
        return [LongFlow(s.key, s.src_tor, s.dst_tor, d * self._nic(s.key[0])) for s, d in zip(states, natural)]

    def allocate(self, flows: list[LongFlow]) -> Allocation:
        cands = [self.paths.paths(f.src_tor, f.dst_tor) for f in flows]
        nic = max((self._nic(f.key[0]) for f in flows), default=1.0)
        choice = global_first_fit([f.demand for f in flows], [idx for _, idx in cands],
                                  self.paths.capacity, nic)
        flow_path, flow_rate = {}, {}
        load = np.zeros(len(self.paths.capacity))
        for f, (nodes, idx), c in zip(flows, cands, choice):
            if c is not None:
                flow_path[f.key] = nodes[c]
                flow_rate[f.key] = f.demand
                load[idx[c]] += f.demand
        busy = load > 0
        lam = float((self.paths.capacity[busy] / load[busy]).min()) if busy.any() else math.inf
        return Allocation(math.nan, math.nan, {}, flow_path, flow_rate, lam, placement="global first fit")

    def _keep_current(self, flows, wanted):
        return None  # Hedera re-runs GFF from scratch every period
