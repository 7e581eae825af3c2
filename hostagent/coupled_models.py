"""Reference models of the coupled MPTCP congestion controls (issue #23),
per ACK, in packets: what the BPF programs must reproduce on the same ACK
trace. Pure Python, no kernel.

- **LIA** (RFC 6356; the VM-scheduling paper's Eqs. 1-2): in congestion
  avoidance each ACK of one packet on subflow r adds
  min(α/w_total, 1/w_r), with α = w_total·max_i(w_i/sRTT_i²) /
  (Σ_i w_i/sRTT_i)²; sRTT is an EWMA with γ = 7/8 (Eq. 5); slow start
  adds 1 per ACK below ssthresh; a loss halves w_r (ssthresh = w_r/2).
- **MPTCP-D** (Zhao et al., Eq. 2, Algorithm 1): ψ_r = min_k RTT_k/RTT_r
  over the subflows' current RTTs; each ACK adds (ψ_r·w_r/RTT_r²) /
  (Σ_k w_k/RTT_k)², uncapped; a loss halves w_r. Extra-subflow
  elimination (ESE), per connection: the first subflow whose RTT exceeds
  α·baseRTT_r sets TRIG and the reference rtt; another subflow whose RTT
  exceeds α·baseRTT_r and lies within β·baseRTT_r of the reference shares
  its bottleneck and is closed (α = 1.3, β = 0.1).
  What the paper leaves open, decided here: baseRTT_r is the least RTT
  sample of the subflow; a subflow is a candidate during its first
  ``ESE_SAMPLES`` (80) RTT samples only (ESE acts as subflows join, not
  for the rest of their lives); one reference per connection (TRIG stays
  set once raised: a second shared group is not looked for); a closed
  subflow is not reopened by the controller (the path manager may add a
  new one, which starts as a candidate again).
- **LIA-VM** (Ha and Xu): an RTT sample D with D/minRTT_r > θ (10) is a
  descheduled period, not congestion: sRTT is not updated with it (Eq.
  15) and α becomes the largest α of the last δ = 1 s.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

GAMMA = 7 / 8                 # sRTT EWMA (Eq. 5)
ESE_ALPHA, ESE_BETA, ESE_SAMPLES = 1.3, 0.1, 80
VM_THETA, VM_DELTA_S = 10.0, 1.0


class ModelError(ValueError):
    pass


def _positive(name: str, x) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0:
        raise ModelError(f"{name} {x!r} must be a positive finite number")
    return float(x)


@dataclass
class Subflow:
    cwnd: float = 10.0
    ssthresh: float = math.inf
    srtt: float | None = None          # seconds
    rtt: float | None = None           # the latest sample
    min_rtt: float = math.inf
    samples: int = 0
    closed: bool = False


@dataclass
class Coupled:
    """The state every model shares: subflows by id, sRTT, slow start, loss."""
    subflows: dict = field(default_factory=dict)

    def add(self, r, cwnd: float = 10.0) -> None:
        if r in self.subflows:
            raise ModelError(f"subflow {r!r} exists")
        self.subflows[r] = Subflow(cwnd=_positive("cwnd", cwnd))

    def live(self) -> dict:
        return {r: s for r, s in self.subflows.items() if not s.closed}

    def _sample(self, s: Subflow, rtt: float) -> None:
        s.rtt = rtt
        s.samples += 1
        s.min_rtt = min(s.min_rtt, rtt)
        s.srtt = rtt if s.srtt is None else GAMMA * s.srtt + (1 - GAMMA) * rtt

    def on_loss(self, r) -> None:
        s = self._get(r)
        s.cwnd = max(1.0, s.cwnd / 2)
        s.ssthresh = s.cwnd

    def _get(self, r) -> Subflow:
        s = self.subflows.get(r)
        if s is None:
            raise ModelError(f"no subflow {r!r}")
        if s.closed:
            raise ModelError(f"subflow {r!r} is closed")
        return s

    def windows(self) -> dict:
        return {r: s.cwnd for r, s in self.subflows.items()}


class Lia(Coupled):
    def alpha(self) -> float:
        """RFC 6356's α over the live subflows with an sRTT."""
        subs = [s for s in self.live().values() if s.srtt]
        if not subs:
            return 1.0
        total = sum(s.cwnd for s in subs)
        best = max(s.cwnd / s.srtt ** 2 for s in subs)
        return total * best / sum(s.cwnd / s.srtt for s in subs) ** 2

    def on_ack(self, r, rtt: float, now: float = 0.0) -> float:
        """One packet acknowledged on ``r`` with an RTT sample; returns the new window."""
        s = self._get(r)
        self._sample(s, _positive("rtt", rtt))
        self._increase(s, self.alpha())
        return s.cwnd

    def _increase(self, s: Subflow, alpha: float) -> None:
        if s.cwnd < s.ssthresh:
            s.cwnd += 1.0
            return
        total = sum(x.cwnd for x in self.live().values())
        s.cwnd += min(alpha / total, 1.0 / s.cwnd)


class LiaVm(Lia):
    """LIA that does not take a VM's descheduled time for congestion."""

    def __init__(self, theta: float = VM_THETA, delta_s: float = VM_DELTA_S):
        super().__init__()
        self.theta, self.delta_s = _positive("theta", theta), _positive("delta_s", delta_s)
        self.recent: deque = deque()       # (time, α) of the last delta_s
        self.off_periods = 0

    def on_ack(self, r, rtt: float, now: float = 0.0) -> float:
        s = self._get(r)
        rtt = _positive("rtt", rtt)
        while self.recent and self.recent[0][0] < now - self.delta_s:
            self.recent.popleft()
        off = s.min_rtt < math.inf and rtt / s.min_rtt > self.theta
        if off:                                           # Eq. 15: no sRTT update from a descheduled period
            self.off_periods += 1
            s.rtt, s.samples = rtt, s.samples + 1
            alpha = max((a for _, a in self.recent), default=self.alpha())
        else:
            self._sample(s, rtt)
            alpha = self.alpha()
            self.recent.append((now, alpha))
        self._increase(s, alpha)
        return s.cwnd


class MptcpD(Coupled):
    """MPTCP-D's window increase and extra-subflow elimination."""

    def __init__(self, ese: bool = True, alpha: float = ESE_ALPHA, beta: float = ESE_BETA,
                 candidates: int = ESE_SAMPLES):
        super().__init__()
        self.ese, self.a, self.b = ese, _positive("alpha", alpha), _positive("beta", beta)
        self.candidates = int(_positive("candidates", candidates))
        self.trig = False
        self.ref_rtt: float | None = None
        self.ref_subflow = None
        self.closed_by_ese: list = []

    def psi(self, r) -> float:
        live = [s.rtt for s in self.live().values() if s.rtt]
        s = self.subflows[r]
        return min(live) / s.rtt if live and s.rtt else 1.0

    def on_ack(self, r, rtt: float, now: float = 0.0) -> float:
        s = self._get(r)
        self._sample(s, _positive("rtt", rtt))
        if s.cwnd < s.ssthresh:
            s.cwnd += 1.0
        else:
            denom = sum(x.cwnd / x.rtt for x in self.live().values() if x.rtt) ** 2
            s.cwnd += (self.psi(r) * s.cwnd / s.rtt ** 2) / denom
        if self.ese:
            self._eliminate(r, s)
        return s.cwnd

    def _eliminate(self, r, s: Subflow) -> None:
        if s.samples > self.candidates or s.rtt <= self.a * s.min_rtt:
            return
        if not self.trig:
            self.trig, self.ref_rtt, self.ref_subflow = True, s.rtt, r
            return
        if r != self.ref_subflow and abs(s.rtt - self.ref_rtt) < self.b * s.min_rtt and len(self.live()) > 1:
            s.closed = True
            self.closed_by_ese.append(r)
