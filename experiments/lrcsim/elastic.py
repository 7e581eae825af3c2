"""An ElasticSwitch-like rate allocator, the baseline of the paper's §V-B.

ElasticSwitch (Popa et al., SIGCOMM 2013) limits every VM-pair at the
sender and moves the limit R_i with congestion feedback, TCP-like. What is
implemented here, exactly (one allocator per pair, every ``PERIOD_S``):

- congestion: a link on the pair's path carried its full capacity C in
  the last period (the flow-level stand-in for a loss or an ECN mark);
- on congestion: R_max ← R (CUBIC's fast convergence: R·(1 − DECREASE/2)
  if R was below the previous R_max); R ← max(B_i, R·(1 − DECREASE)); the
  CUBIC clock restarts;
- otherwise R follows CUBIC's curve from its last decrease,
  R(t) = R_max + c_i·(t − K)³, K = ∛(R_max·DECREASE / c_i), never below
  B_i nor above the NIC, where c_i = CUBIC_C·w_i (the pair's weight scales
  its aggressiveness -- "guarantee decoupled from weight": in ElasticSwitch
  itself the guarantee plays this part) and, above the guarantee, times
  CAUTION ("rate caution": a pair above its guarantee probes more gently);
- a new pair starts at max(B_i, START_MBPS) with R_max = that.

There is no delay line: feedback is one period old, as a loss at the
receiver would be. The allocator is a model of the family, not of
ElasticSwitch's code.
"""

from __future__ import annotations

import numpy as np

PERIOD_S = 0.015           # the paper's "15 ms"
DECREASE = 0.3             # CUBIC's multiplicative decrease (β_cubic = 0.7)
CUBIC_C = 100.0            # Mb/s per s³ per unit weight: ~1.4 s from a decrease back to R_max at 900 Mb/s
CAUTION = 0.5
START_MBPS = 10.0


class ElasticAllocator:
    def __init__(self, run):
        self.run = run
        n = len(run.sc.flows)
        self.R = np.zeros(n)
        self.R_max = np.zeros(n)
        self.since = np.zeros(n)            # time of the last decrease
        self.B = np.array([f.guarantee_mbps for f in run.sc.flows])
        self.w = np.array([f.weight for f in run.sc.flows])
        self.was_active = np.zeros(n, dtype=bool)
        self.congested = np.zeros(n, dtype=bool)
        self.n_period = max(1, int(round(PERIOD_S / run.sc.dt_s)))
        self.nic = float(run.C.max())

    def before_step(self, k, now, act, n_v, n_r, n_d) -> None:
        new = act & ~self.was_active
        self.R[new] = np.maximum(self.B[new], START_MBPS)
        self.R_max[new] = self.R[new]
        self.since[new] = now
        self.was_active = act.copy()
        if k % self.n_period or k == 0:
            return
        hit = act & self.congested
        # CUBIC's fast convergence: a pair congested below its last R_max lets go of more
        falling = hit & (self.R < self.R_max)
        self.R_max[hit] = np.where(falling[hit], self.R[hit] * (2 - DECREASE) / 2, self.R[hit])
        self.R[hit] = np.maximum(self.B[hit], self.R[hit] * (1 - DECREASE))
        self.since[hit] = now
        grow = act & ~self.congested
        c = CUBIC_C * self.w * np.where(self.R > self.B, CAUTION, 1.0)
        K = np.cbrt(self.R_max * DECREASE / c)
        t = now - self.since
        curve = self.R_max + c * (t - K) ** 3
        self.R[grow] = np.clip(curve[grow], np.maximum(self.B[grow], 1e-3), self.nic)
        self.congested[:] = False

    def limits(self, now, act) -> np.ndarray:
        return np.where(act, self.R, 0.0)

    def after_step(self, k, now, act, rates, load) -> None:
        full = load >= self.run.C * (1 - 1e-9)
        if full.any():
            self.congested |= (self.run.A[full].sum(axis=0) > 0)

    def round(self, *_):
        pass
