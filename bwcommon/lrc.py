"""LRC, logistic rate control: the paper's equations as pure code.

Guo et al., "On Efficient Bandwidth Allocation for Traffic Variability in
Datacenters" (INFOCOM 2014). Every VM x has a hose guarantee B_x and a
weight w_x; a VM-pair ("VM-flow") i = (x, y) gets a rate that is
guaranteed, work-conserving and weighted max-min fair.

- Eq. 1, :func:`pair_weight`: w_i = w_x/|X^r| + w_y/|Y^s|, X^r the VMs x
  sends to, Y^s the VMs y receives from.
- Eq. 2, :func:`pair_guarantee`: B_i = min(B_x·w_y/Σ_{X^r} w,
  B_y·w_x/Σ_{Y^s} w). Algorithm 1's rule is :func:`sender_halves`; the
  agent applies it to the pairs it reads from conntrack every round
  (:mod:`hostagent.lrc`); the receiver's half needs Y^s, which only the
  controller sees.
- Eq. 27, the discrete updates: at the host every τ_v,
  :func:`next_pair_rate`: v ← v^(1−α·τ_v)·(w_i·r̃_i)^(α·τ_v); at the
  controller every τ_r, :func:`next_link_factor`:
  r_l ← r_l·exp(β·τ_r·(1 − load_l/(μ·C_l))). r̃_i is the least r_l on the
  pair's path(s).
- Eq. 28, :func:`enforced_rate`: the limit is max(B_i, v_i).
- Eq. 7: on one bottleneck the equilibrium is v_i = w_i·μC/Σw.

What the paper leaves open, decided here (docs/lrc.md says why and what
was measured):
- rates are Mb/s; both recursions run in the log domain (Eq. 27 is a
  weighted geometric mean: ln v moves a fraction α·τ_v of the way to
  ln(w·r̃) each step), so α·τ_v and β·τ_r must lie in (0, 1];
- r_l starts at μC_l/Σw (Eq. 7's value), stays within
  [floor·μC_l/Σw, μC_l/w_min] (a link no pair fills cannot wind r up
  without end), and when pairs join or leave a link it is re-seeded
  (:func:`rescaled_factor`): ``weights`` multiplies by Σw_old/Σw_new, as
  the issue proposes; ``equilibrium`` solves Σ max(B_i, w_i·min(r, r_i'))
  = μC_l for r, r_i' the pair's factor elsewhere -- the single-link
  equilibrium the guarantees move (measured against each other in the
  delay table);
- a new pair starts at v = max(B_i, v_floor) and climbs (a pair starting
  at its share would add its whole share on top of the others' old rates);
- in bwfabric's combined mode (:func:`split_limits`) BG carries B_i and the
  WC subflows at most max(B_i, v_i) − B_i.
"""

from __future__ import annotations

import math

from dataclasses import dataclass
from typing import Hashable, Iterable, Literal, Mapping

from pydantic import Field, model_validator

from bwcommon.validate import StrictModel, finite_number

Pair = tuple[Hashable, Hashable]          # (sender VM, receiver VM)


class LrcError(ValueError):
    pass


class LrcParams(StrictModel):
    """LRC's gains, periods and bounds (the ``lrc`` section of the
    controller's configuration; the agent gets the host's part)."""
    alpha: float = Field(10.0, gt=0, le=1000, description="Eq. 27's host gain α (1/s): v moves α·τ_v of the way "
                         "(log domain) to w·r̃ each τ_v")
    beta: float = Field(1.0, gt=0, le=1000, description="Eq. 27's link gain β (1/s) of r's update every τ_r")
    tau_v_s: float = Field(0.05, ge=0.01, le=10, description="host update period τ_v (s); at least 10 ms: each round reads conntrack and may change tc (benchmarks/conntrack_cost.py)")
    tau_r_s: float = Field(0.1, ge=0.01, le=10, description="link factor period τ_r (s): port statistics are "
                           "polled and factors pushed this often")
    mu: float = Field(0.9, gt=0, le=1, description="target utilisation μ (the highest TCP goodput measured over "
                      "the link's rate)")
    v_floor_mbps: float = Field(1.0, gt=0, le=1e5, description="least v of a pair (a new pair starts at "
                                "max(B_i, this))")
    factor_floor: float = Field(0.001, gt=0, le=1, description="r_l never below this × μC_l/Σw")
    rescale: Literal["none", "weights", "equilibrium"] = Field(
        "equilibrium", description="re-seed r_l when pairs join or leave a link: by Σw_old/Σw_new, or to the "
        "link's equilibrium with the pairs' guarantees")
    anti_windup: bool = Field(True, description="count the load the pairs' limits have yet to climb to "
                              "(modelled at the controller) when stepping r_l, so a lagging v does not wind r_l up")
    saturation: float | None = Field(0.97, gt=0.5, le=1.0, description="a link carrying at least this x its "
                                     "capacity is full: its load says nothing of how far the limits exceed it "
                                     "(the wire caps it), so a factor above the link's equilibrium drops to it "
                                     "at once; null: never")
    feedback_delay_s: float = Field(0.2, ge=0, le=10, description="the controller's estimate of the delay from "
                                    "the end of a port-statistics interval to the factor at the host (its model "
                                    "of the hosts' v applies factors this late)")
    pair_idle_s: float = Field(2.0, ge=0, le=3600, description="an agent closes a VM-pair this long after the "
                               "VM last sent to that peer (short flows do not churn the pairs)")
    hold_s: float = Field(1.0, gt=0, le=3600, description="an agent without a fresh factor for this long holds "
                          "its limits...")
    fallback_s: float = Field(5.0, gt=0, le=3600, description="...and after this long falls back to B_i")

    @model_validator(mode="after")
    def _stable_steps(self) -> "LrcParams":
        bad = []
        if self.alpha * self.tau_v_s > 1:
            bad.append(f"alpha·tau_v_s = {self.alpha * self.tau_v_s:g} must be <= 1 (v would step past its target)")
        if self.beta * self.tau_r_s > 1:
            bad.append(f"beta·tau_r_s = {self.beta * self.tau_r_s:g} must be <= 1")
        if self.fallback_s < self.hold_s:
            bad.append(f"fallback_s {self.fallback_s:g} must be >= hold_s {self.hold_s:g}")
        if bad:
            raise ValueError("; ".join(bad))
        return self


def _positive(name: str, x) -> float:
    if not finite_number(x) or x <= 0:
        raise LrcError(f"{name} {x!r} must be a positive finite number")
    return float(x)


def _non_negative(name: str, x) -> float:
    if not finite_number(x) or x < 0:
        raise LrcError(f"{name} {x!r} must be a non-negative finite number")
    return float(x)


# ---- Eqs. 1 and 2 ---------------------------------------------------------------------------------


MAX_REPORT_MBPS = 400_000.0            # no rate an agent reports can exceed a NIC (hostagent.plan.MAX_NIC_MBPS)
REPORT_WEIGHTS = (1e-6, 1e6)          # the configuration's weight range


def report_problems(rep) -> list[str]:
    """Why one agent's report of a pair (v, limit, guarantee, weight, factor
    age) cannot enter an LRC round ([] = it can): an object whose rates are
    finite numbers in [0, 400000] Mb/s, whose weight is in [1e-6, 1e6] and
    whose factor age is finite and >= 0 -- each field absent or right."""
    if not isinstance(rep, dict):
        return ["must be an object"]
    bad = [k for k in ("v_mbps", "limit_mbps", "guarantee_mbps")
           if k in rep and not (finite_number(rep[k]) and 0 <= rep[k] <= MAX_REPORT_MBPS)]
    if "weight" in rep and not (finite_number(rep["weight"])
                                and REPORT_WEIGHTS[0] <= rep["weight"] <= REPORT_WEIGHTS[1]):
        bad.append("weight")
    if rep.get("factor_age_s") is not None and not (finite_number(rep["factor_age_s"])
                                                    and 0 <= rep["factor_age_s"] <= 1e9):
        bad.append("factor_age_s")
    return [f"{', '.join(f'{k} {rep[k]!r:.30}' for k in bad)} out of range"] if bad else []


def pair_weight(w_x: float, n_receivers_of_x: int, w_y: float, n_senders_of_y: int) -> float:
    """Eq. 1: w_i = w_x/|X^r| + w_y/|Y^s|."""
    _positive("w_x", w_x)
    _positive("w_y", w_y)
    if not (isinstance(n_receivers_of_x, int) and n_receivers_of_x >= 1
            and isinstance(n_senders_of_y, int) and n_senders_of_y >= 1):
        raise LrcError(f"|X^r| {n_receivers_of_x!r} and |Y^s| {n_senders_of_y!r} must be integers >= 1")
    return w_x / n_receivers_of_x + w_y / n_senders_of_y


def pair_guarantee(b_x: float, w_y: float, sum_w_receivers_of_x: float,
                   b_y: float, w_x: float, sum_w_senders_of_y: float) -> float:
    """Eq. 2: B_i = min(B_x·w_y/Σ_{X^r} w, B_y·w_x/Σ_{Y^s} w)."""
    return min(_non_negative("B_x", b_x) * _positive("w_y", w_y) / _positive("sum over X^r", sum_w_receivers_of_x),
               _non_negative("B_y", b_y) * _positive("w_x", w_x) / _positive("sum over Y^s", sum_w_senders_of_y))


@dataclass(frozen=True)
class Vm:
    guarantee_mbps: float
    weight: float


def pair_terms(pairs: Iterable[Pair], vms: Mapping[Hashable, Vm]) -> dict[Pair, tuple[float, float]]:
    """(w_i, B_i) of every active VM-pair by Eqs. 1 and 2 (what the
    controller computes: it sees every pair, so both halves)."""
    pairs = sorted(set(pairs), key=repr)
    for x, y in pairs:
        for v in (x, y):
            if v not in vms:
                raise LrcError(f"pair ({x}, {y}): VM {v!r} is not declared")
        if x == y:
            raise LrcError(f"pair ({x}, {y}): a VM does not send to itself over the fabric")
    receivers: dict[Hashable, list] = {}
    senders: dict[Hashable, list] = {}
    for x, y in pairs:
        receivers.setdefault(x, []).append(y)
        senders.setdefault(y, []).append(x)
    out = {}
    for x, y in pairs:
        vx, vy = vms[x], vms[y]
        w = pair_weight(vx.weight, len(receivers[x]), vy.weight, len(senders[y]))
        b = pair_guarantee(vx.guarantee_mbps, vy.weight, sum(vms[z].weight for z in receivers[x]),
                           vy.guarantee_mbps, vx.weight, sum(vms[z].weight for z in senders[y]))
        out[(x, y)] = (w, b)
    return out


def sender_halves(guarantee_mbps: float, receiver_weights: Mapping[Hashable, float]) -> dict[Hashable, float]:
    """Algorithm 1's rule: B_x·w_y/Σ_{X^r} w for every receiver y in X^r
    (they sum to B_x); empty without receivers."""
    total = sum(receiver_weights.values())          # > 0 with any receiver: weights are positive
    return {y: guarantee_mbps * w / total for y, w in receiver_weights.items()}


# ---- Eq. 27 (host) and Eq. 28 ------------------------------------------------------------------------


def next_pair_rate(v: float, w_i: float, r_tilde: float, alpha: float, tau_v: float,
                   floor: float, cap: float) -> float:
    """Eq. 27, host side: v^(1−α·τ_v)·(w_i·r̃_i)^(α·τ_v), within [floor, cap]."""
    v, target = _positive("v", v), _positive("w_i", w_i) * _positive("r_tilde", r_tilde)
    k = _positive("alpha·tau_v", alpha * tau_v)
    if k > 1:
        raise LrcError(f"alpha·tau_v {k:g} must be <= 1")
    out = math.exp((1 - k) * math.log(v) + k * math.log(target))
    return min(max(out, floor), cap)


def enforced_rate(b_i: float, v_i: float) -> float:
    """Eq. 28: the pair's limit."""
    return max(_non_negative("B_i", b_i), _non_negative("v_i", v_i))


def split_limits(b_i: float, v_i: float) -> tuple[float, float]:
    """bwfabric's combined mode: (BG limit, WC ceiling). BG carries the
    guarantee only -- LRC's overshoot must not reach the high-priority
    queue -- and the WC subflows carry what LRC gives above it."""
    limit = enforced_rate(b_i, v_i)
    return b_i, limit - b_i


# ---- Eq. 27 (controller) -------------------------------------------------------------------------------


def next_link_factor(r: float, load: float, mu_c: float, beta: float, tau_r: float,
                     floor: float, cap: float) -> float:
    """Eq. 27, controller side: r·exp(β·τ_r·(1 − load/μC)), within [floor, cap]."""
    _positive("r", r)
    _non_negative("load", load)
    _positive("muC", mu_c)
    k = _positive("beta·tau_r", beta * tau_r)
    out = math.exp(math.log(r) + k * (1 - load / mu_c))
    return min(max(out, floor), cap)


def initial_factor(mu_c: float, sum_w: float) -> float:
    """Eq. 7's value: every pair at w_i·μC/Σw fills the link exactly."""
    return _positive("muC", mu_c) / _positive("sum of weights", sum_w)


def equilibrium_factor(mu_c: float, members: Iterable[tuple[float, float, float]]) -> float:
    """The r with Σ max(B_i, w_i·min(r, r_i')) = μC over the link's pairs
    (w_i, B_i, r_i' = the pair's least factor on its other links, inf if
    none): the single-link equilibrium of Eqs. 7/28 given the rest of the
    fabric. If the pairs cannot fill the link at any r (all held
    elsewhere) the answer is where the load stops growing; if their
    guarantees alone fill it, the least B_i/w_i."""
    _positive("muC", mu_c)
    members = [(_positive("w_i", w), _non_negative("B_i", b), float(ro)) for w, b, ro in members]
    if not members:
        raise LrcError("a link without pairs has no equilibrium factor")

    def load(r: float) -> float:
        return sum(max(b, w * min(r, ro)) for w, b, ro in members)

    if load(0.0) >= mu_c:                 # the guarantees alone fill it: r hardly matters, keep it small
        # (load(0) is the guarantees' sum and muC > 0, so some B_i > 0 here)
        return min(b / w for w, b, _ in members if b > 0)
    free = [w for w, _, ro in members if not math.isfinite(ro)]
    if not free:                          # every pair is held elsewhere: load is flat beyond the largest cap
        hi = max(max(ro for _, _, ro in members), max(b / w for w, b, _ in members))
        if load(hi) < mu_c:
            return hi
    else:
        hi = mu_c / min(free)             # load(hi) >= that pair's w·hi = μC
    lo = 0.0
    for _ in range(100):                  # load is monotone: bisect to float precision
        mid = (lo + hi) / 2
        if load(mid) >= mu_c:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-12 * hi:
            break
    return hi


def rescaled_factor(mode: str, r: float, mu_c: float, sum_w_old: float, sum_w_new: float,
                    members: Iterable[tuple[float, float, float]]) -> float:
    """r_l when the link's pairs change (see the module's notes)."""
    if mode == "none":
        return r
    if mode == "weights":
        return r * _positive("old sum of weights", sum_w_old) / _positive("new sum of weights", sum_w_new)
    if mode == "equilibrium":
        return equilibrium_factor(mu_c, members)
    raise LrcError(f"rescale {mode!r}: one of none, weights, equilibrium")
