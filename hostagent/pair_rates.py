"""LRC's host half, pure: a host's pair rates, stepped every tau_v from the
latest terms the controller sent (Eq. 27), limited by Eq. 28, held when the
terms stop arriving and then dropped to the guarantees (the fail-safe). The
agent (:mod:`hostagent.lrc`) and the simulator drive this same class; the
controller's half is :mod:`apps.lrc.control`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Mapping

from bwcommon import lrc as M


@dataclass
class PairRate:
    v: float
    weight: float
    guarantee_mbps: float
    r_tilde: float | None
    received_at: float | None


@dataclass
class PairRates:
    """A host's pairs: the latest terms from the controller and v_i."""
    params: M.LrcParams
    nic_mbps: float
    pairs: dict = field(default_factory=dict)      # pair -> PairRate

    def set_terms(self, terms: Mapping[Hashable, tuple[float, float, float]], now: float) -> None:
        """The controller's latest (r̃_i, w_i, B_i) per pair, all of them
        checked before any is taken. Pairs it no longer lists keep their
        state until :meth:`forget` (the host decides when a pair ends)."""
        checked = {}
        for p, t in terms.items():
            if not (isinstance(t, (tuple, list)) and len(t) == 3):
                raise M.LrcError(f"pair {p!r}: terms must be (r_tilde, weight, guarantee)")
            r, w, b = t
            checked[p] = (M._positive(f"pair {p!r} r_tilde", r), M._positive(f"pair {p!r} weight", w),
                          M._non_negative(f"pair {p!r} guarantee", b))
            if checked[p][2] > self.nic_mbps:
                raise M.LrcError(f"pair {p!r} guarantee {b!r} above the NIC's {self.nic_mbps:g} Mb/s")
        for p, (r, w, b) in checked.items():
            cur = self.pairs.get(p)
            if cur is None:
                self.pairs[p] = PairRate(max(b, self.params.v_floor_mbps), w, b, r, now)
            else:
                cur.weight, cur.guarantee_mbps, cur.r_tilde, cur.received_at = w, b, r, now

    def open(self, pair: Hashable, guarantee_mbps: float, weight: float) -> None:
        """A pair the host saw open before the controller's terms: it starts
        at its guarantee (Algorithm 1's sender half) and climbs once a factor
        comes."""
        if pair not in self.pairs:
            b = min(M._non_negative("guarantee", guarantee_mbps), self.nic_mbps)
            self.pairs[pair] = PairRate(max(b, self.params.v_floor_mbps), M._positive("weight", weight), b,
                                        None, None)

    def forget(self, pair: Hashable) -> None:
        self.pairs.pop(pair, None)

    def step(self, now: float) -> None:
        """One τ_v round of Eq. 27 for every pair with a fresh factor; a pair
        whose factor is older than ``hold_s`` keeps its v."""
        p = self.params
        for pr in self.pairs.values():
            if pr.r_tilde is None or now - pr.received_at > p.hold_s:
                continue
            pr.v = M.next_pair_rate(pr.v, pr.weight, pr.r_tilde, p.alpha, p.tau_v_s, p.v_floor_mbps,
                                    self.nic_mbps)

    def fallen_back(self, pr: PairRate, now: float) -> bool:
        """Whether the pair's factors have been missing for ``fallback_s``:
        it is held to B_i (a pair that never had one is not)."""
        return pr.received_at is not None and now - pr.received_at > self.params.fallback_s

    def limit(self, pair: Hashable, now: float) -> float:
        """Eq. 28, or B_i once factors have been missing for ``fallback_s``."""
        pr = self.pairs[pair]
        if self.fallen_back(pr, now):
            return pr.guarantee_mbps
        return M.enforced_rate(pr.guarantee_mbps, pr.v)

    def limits(self, now: float) -> dict[Hashable, float]:
        return {p: self.limit(p, now) for p in self.pairs}
