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
  its bottleneck and is closed (α = 1.3, β = 0.1). Decided here: the
  reference is the reference subflow's latest sample (``frozen=True``: the
  paper's one sample that raised TRIG -- a subflow that joins later meets a
  queue grown since, and none sharing a bottleneck was closed on the
  testbed, see docs/coupled.md); the connection's first subflow (the
  first added) is never closed; a subflow is closed after ``confirm``
  (4) consecutive matching samples, not one (on disjoint paths alike in
  rate and delay a joining subflow's RTT crossing the reference's closed
  the only subflow of a path in 3 of 10 runs with one).
  What the paper leaves open, decided here: baseRTT_r is the least RTT
  sample of the subflow; a subflow is a candidate during its first
  ``ESE_SAMPLES`` (80) RTT samples only (ESE acts as subflows join, not
  for the rest of their lives); one reference per connection (TRIG stays
  set once raised: a second shared group is not looked for); a closed
  subflow is not reopened by the controller (the path manager may add a
  new one, which starts as a candidate again).
- **LIA-VM** (Ha and Xu): an RTT sample D with D/minRTT_r > θ (10) is a
  descheduled period, not congestion: sRTT is not updated with it (Eq.
  15) and α becomes the largest α of the last δ = 1 s. Decided here: each
  subflow keeps the α it computed, as the largest of each of 8 buckets of
  δ/8 (a BPF program keeps no list): "the last δ" is the current bucket and
  the 7 before it, between 7/8·δ and δ of history.

Windows here are what the BPF programs count with: an ACK of ``acked``
segments adds ``acked`` times the per-segment increase (RFC 6356 §3), and
only subflows with an RTT sample take part in α, ψ and w_total.
:func:`replay` checks a trace the BPF programs recorded (bwf_cctrace)
against these rules, step by step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

GAMMA = 7 / 8                 # sRTT EWMA (Eq. 5)
ESE_ALPHA, ESE_BETA, ESE_SAMPLES, ESE_CONFIRM = 1.3, 0.1, 80, 4
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


def lia_alpha(windows: list[float], srtts: list[float]) -> float:
    """RFC 6356's α over subflows (window, sRTT); 1 for none."""
    if not windows:
        return 1.0
    total = sum(windows)
    best = max(w / r ** 2 for w, r in zip(windows, srtts))
    return total * best / sum(w / r for w, r in zip(windows, srtts)) ** 2


def lia_increase(alpha: float, total: float, w_r: float) -> float:
    """LIA's increase per ACKed segment: min(α/w_total, 1/w_r)."""
    return min(alpha / total, 1.0 / w_r)


def mptcp_d_increase(windows: list[float], rtts: list[float], me: int) -> float:
    """MPTCP-D's increase per ACKed segment on subflow ``me``:
    ψ·w/RTT² / (Σ_k w_k/RTT_k)², ψ = min_k RTT_k / RTT."""
    psi = min(rtts) / rtts[me]
    return psi * windows[me] / rtts[me] ** 2 / sum(w / r for w, r in zip(windows, rtts)) ** 2


class BucketMax:
    """The largest value of the last δ, as the largest of 8 buckets of δ/8
    (what the BPF program keeps)."""
    N = 8

    def __init__(self, delta_s: float):
        self.width = delta_s / self.N
        self.bucket = None
        self.best = [0.0] * self.N

    def roll(self, now: float) -> None:
        b = math.floor(now / self.width + 1e-9)
        if self.bucket is not None and b <= self.bucket:
            return
        start = -1 if self.bucket is None else self.bucket
        for k in range(start + 1, min(b, start + self.N) + 1):
            self.best[k % self.N] = 0.0
        if self.bucket is None:
            self.best = [0.0] * self.N
        self.bucket = b

    def put(self, now: float, value: float) -> None:
        self.roll(now)
        i = self.bucket % self.N
        self.best[i] = max(self.best[i], value)

    def max(self, now: float) -> float:
        self.roll(now)
        return max(self.best)


class Lia(Coupled):
    def _counted(self) -> list[Subflow]:
        return [s for s in self.live().values() if s.srtt]

    def alpha(self) -> float:
        """RFC 6356's α over the live subflows with an sRTT."""
        subs = self._counted()
        return lia_alpha([s.cwnd for s in subs], [s.srtt for s in subs])

    def on_ack(self, r, rtt: float, now: float = 0.0, acked: int = 1) -> float:
        """``acked`` segments acknowledged on ``r`` with an RTT sample; returns the new window."""
        s = self._get(r)
        self._sample(s, _positive("rtt", rtt))
        self._increase(s, self.alpha(), acked)
        return s.cwnd

    def _increase(self, s: Subflow, alpha: float, acked: int = 1) -> None:
        if s.cwnd < s.ssthresh:
            s.cwnd += acked
            return
        total = sum(x.cwnd for x in self._counted()) or s.cwnd
        s.cwnd += acked * lia_increase(alpha, total, s.cwnd)


class LiaVm(Lia):
    """LIA that does not take a VM's descheduled time for congestion."""

    def __init__(self, theta: float = VM_THETA, delta_s: float = VM_DELTA_S):
        super().__init__()
        self.theta, self.delta_s = _positive("theta", theta), _positive("delta_s", delta_s)
        self.recent: dict = {}             # subflow -> BucketMax of the α it computed
        self.off_periods = 0

    def is_off(self, s: Subflow, rtt: float) -> bool:
        return s.min_rtt < math.inf and rtt / s.min_rtt > self.theta

    def on_ack(self, r, rtt: float, now: float = 0.0, acked: int = 1) -> float:
        s = self._get(r)
        rtt = _positive("rtt", rtt)
        recent = self.recent.setdefault(r, BucketMax(self.delta_s))
        if self.is_off(s, rtt):                           # Eq. 15: no sRTT update from a descheduled period
            self.off_periods += 1
            s.rtt, s.samples, s.min_rtt = rtt, s.samples + 1, min(s.min_rtt, rtt)
            alpha = recent.max(now) or self.alpha()
        else:
            self._sample(s, rtt)
            alpha = self.alpha()
            recent.put(now, alpha)
        self._increase(s, alpha, acked)
        return s.cwnd


class EseRule:
    """ESE's decision for one connection, sample by sample (the model and
    the replay of a BPF trace share it): TRIG and the reference subflow,
    and each subflow's run of matching samples."""

    def __init__(self, alpha: float = ESE_ALPHA, beta: float = ESE_BETA, candidates: int = ESE_SAMPLES,
                 frozen: bool = False, confirm: int = ESE_CONFIRM):
        self.a, self.b = _positive("alpha", alpha), _positive("beta", beta)
        self.candidates = int(_positive("candidates", candidates))
        self.frozen, self.confirm = frozen, int(_positive("confirm", confirm))
        self.trig = False
        self.ref_rtt: float | None = None
        self.ref_sub = None
        self.matches: dict = {}

    def step(self, sub, rtt: float, min_rtt: float, samples: int, latest_ref: float | None = None,
             first: bool = False, live: int = 2) -> bool:
        """One RTT sample of subflow ``sub``; True: close it. ``latest_ref``:
        the reference subflow's latest sample (None: not known, the one
        that raised TRIG is used); ``first``: the connection's first
        subflow (never closed); ``live``: the connection's subflows."""
        if samples > self.candidates:
            return False
        if rtt <= self.a * min_rtt:
            self.matches[sub] = 0
            return False
        if not self.trig:
            self.trig, self.ref_rtt, self.ref_sub = True, rtt, sub
            return False
        if sub == self.ref_sub or first:
            return False
        ref = self.ref_rtt if self.frozen or latest_ref is None else latest_ref
        if not (abs(rtt - ref) < self.b * min_rtt and live > 1):
            self.matches[sub] = 0
            return False
        self.matches[sub] = self.matches.get(sub, 0) + 1
        return self.matches[sub] >= self.confirm


class MptcpD(Coupled):
    """MPTCP-D's window increase and extra-subflow elimination."""

    def __init__(self, ese: bool = True, alpha: float = ESE_ALPHA, beta: float = ESE_BETA,
                 candidates: int = ESE_SAMPLES, frozen: bool = False, confirm: int = ESE_CONFIRM):
        super().__init__()
        self.ese = ese
        self.rule = EseRule(alpha, beta, candidates, frozen, confirm)
        self.closed_by_ese: list = []

    @property
    def trig(self) -> bool:
        return self.rule.trig

    @property
    def ref_rtt(self) -> float | None:
        return self.rule.ref_rtt

    @property
    def matches(self) -> dict:
        return self.rule.matches

    def psi(self, r) -> float:
        live = [s.rtt for s in self.live().values() if s.rtt]
        s = self.subflows[r]
        return min(live) / s.rtt if live and s.rtt else 1.0

    def on_ack(self, r, rtt: float, now: float = 0.0, acked: int = 1) -> float:
        s = self._get(r)
        self._sample(s, _positive("rtt", rtt))
        if s.cwnd < s.ssthresh:
            s.cwnd += acked
        else:
            subs = [x for x in self.live().values() if x.rtt]
            s.cwnd += acked * mptcp_d_increase([x.cwnd for x in subs], [x.rtt for x in subs], subs.index(s))
        if self.ese:
            self._eliminate(r, s)
        return s.cwnd

    def _eliminate(self, r, s: Subflow) -> None:
        live = self.live()
        ref = self.rule.ref_sub
        latest = self.subflows[ref].rtt if ref in live else None
        if self.rule.step(r, s.rtt, s.min_rtt, s.samples, latest, first=r == next(iter(self.subflows)),
                          live=len(live)):
            s.closed = True
            self.closed_by_ese.append(r)


# ---- checking what the BPF programs did ------------------------------------------------------
Q30 = 1 << 30
REC_SAMPLE, REC_INCREASE, REC_LOSS, REC_ESE = 1, 2, 3, 4
F_SLOWSTART, F_OFF, F_NOTLIMITED, F_UNCOUNTED, F_FIRST = 1, 2, 4, 8, 16
KIND_LIA, KIND_MPTCPD, KIND_LIAVM = 1, 2, 3


@dataclass
class ReplayReport:
    """How a recorded trace compares with the models: ``increases``
    checked and the worst relative error of one (``worst_rel``, the
    window's increase in congestion avoidance), sRTT samples checked and
    the worst error (``worst_srtt_us``), off-period and ESE decisions that
    differ (``off_mismatch``, ``ese_expected`` vs ``ese_seen``)."""
    increases: int = 0
    worst_rel: float = 0.0
    worst_abs: float = 0.0
    uncounted: int = 0
    not_limited: int = 0
    samples: int = 0
    worst_srtt_us: float = 0.0
    off_periods: int = 0
    off_mismatch: int = 0
    losses: int = 0
    ese_expected: set = field(default_factory=set)
    ese_seen: set = field(default_factory=set)
    kinds: set = field(default_factory=set)

    def agrees(self, rel: float = 1e-3, srtt_us: float = 2.0) -> bool:
        return (self.increases > 0 and self.worst_rel <= rel and self.worst_srtt_us <= srtt_us
                and self.off_mismatch == 0 and self.ese_expected == self.ese_seen)


def replay(records, theta: float = VM_THETA, delta_s: float = VM_DELTA_S, ese_alpha: float = ESE_ALPHA,
           ese_beta: float = ESE_BETA, candidates: int = ESE_SAMPLES, frozen: bool = False,
           confirm: int = ESE_CONFIRM) -> ReplayReport:
    """Step the models through a trace of bwf_coupled (records with the
    fields of ``hostagent.bpfring.Record``, in the order recorded) and
    compare each decision with the program's:

    - every sample: the sRTT EWMA (LIA-VM: skipping the samples it calls
      off-periods, which must be the ones the program called so);
    - every increase in congestion avoidance: the model's increase, from
      the windows and RTTs the program read off the connection's subflows,
      against the program's (window and Q30 fraction after minus before,
      slow start's share taken off); LIA-VM's off-period increases use the
      model's own largest α of the last δ;
    - ESE: the subflows the model closes, from the same samples, against
      the ones the program closed."""
    rep = ReplayReport()
    srtt: dict = {}                 # (conn, sub) -> the model's sRTT (us)
    minr: dict = {}                 # (conn, sub) -> least sample before this one
    recent: dict = {}               # (conn, sub) -> BucketMax (LIA-VM)
    ese: dict = {}                  # conn -> EseRule
    latest: dict = {}               # (conn, sub) -> its latest sample (us)
    for rec in records:
        key = (rec.conn, rec.sub)
        rep.kinds.add(rec.kind)
        if rec.type == REC_SAMPLE:
            rep.samples += 1
            prev_min = minr.get(key)
            off = rec.kind == KIND_LIAVM and prev_min is not None and rec.rtt / prev_min > theta
            if off != bool(rec.flags & F_OFF):
                rep.off_mismatch += 1
            minr[key] = rec.rtt if prev_min is None else min(prev_min, rec.rtt)
            if off:
                rep.off_periods += 1
            else:
                srtt[key] = rec.rtt if key not in srtt else GAMMA * srtt[key] + (1 - GAMMA) * rec.rtt
            if key in srtt:
                rep.worst_srtt_us = max(rep.worst_srtt_us, abs(srtt[key] - rec.srtt8 / 8))
            if rec.kind == KIND_MPTCPD and key not in rep.ese_expected:
                rule = ese.setdefault(rec.conn, EseRule(ese_alpha, ese_beta, candidates, frozen, confirm))
                if rule.step(rec.sub, rec.rtt, rec.min_rtt, rec.samples, latest.get((rec.conn, rule.ref_sub)),
                             first=bool(rec.flags & F_FIRST)):
                    rep.ese_expected.add(key)
            latest[key] = rec.rtt
        elif rec.type == REC_INCREASE:
            _check_increase(rep, rec, recent, delta_s)
        elif rec.type == REC_LOSS:
            rep.losses += 1
        elif rec.type == REC_ESE:
            rep.ese_seen.add(key)
    return rep


def _check_increase(rep: ReplayReport, rec, recent: dict, delta_s: float) -> None:
    if rec.flags & F_NOTLIMITED:
        rep.not_limited += 1
        if rec.cwnd_after != rec.cwnd_before or rec.frac_after != rec.frac_before:
            rep.worst_rel = max(rep.worst_rel, math.inf)     # it grew a window it must not
        return
    if rec.flags & F_UNCOUNTED or not rec.acked_ca:
        rep.uncounted += bool(rec.flags & F_UNCOUNTED)
        return
    sibs = list(rec.sibs)
    me = next((i for i, s in enumerate(sibs) if s.id == rec.sub), None)
    if me is None:
        rep.uncounted += 1
        return
    ss_part = rec.acked - rec.acked_ca if rec.flags & F_SLOWSTART else 0
    got = ((rec.cwnd_after - rec.cwnd_before - ss_part) * Q30 + rec.frac_after - rec.frac_before) / Q30
    w_me = sibs[me].cwnd
    if rec.kind == KIND_MPTCPD:
        counted = [s for s in sibs if s.rtt]
        idx = [s.id for s in counted].index(rec.sub)
        per = mptcp_d_increase([s.cwnd for s in counted], [s.rtt for s in counted], idx)
    else:
        counted = [s for s in sibs if s.srtt8]
        windows, rtts = [s.cwnd for s in counted], [s.srtt8 / 8 for s in counted]
        alpha, total = lia_alpha(windows, rtts), sum(windows)
        if rec.kind == KIND_LIAVM:
            box = recent.setdefault((rec.conn, rec.sub), BucketMax(delta_s))
            now = rec.ts_ns / 1e9
            if rec.flags & F_OFF:
                alpha = box.max(now) or alpha
            else:
                box.put(now, alpha)
        per = lia_increase(alpha, total, w_me)
    want = per * rec.acked_ca
    rep.increases += 1
    err = abs(got - want)
    rep.worst_abs = max(rep.worst_abs, err)
    # the program counts in Q30 and alpha in Q16: a few units of 2^-30 per segment are rounding
    if err > rec.acked_ca * 8 / Q30 + 1e-12:
        rep.worst_rel = max(rep.worst_rel, err / want if want else math.inf)
