"""LRC's controller half, pure: the link factors. The controller's service
and the simulator drive this same class (the simulator is not a copy of
the product); the host's half is :mod:`hostagent.pair_rates`.

- :class:`LinkFactors` (controller, every τ_r): the VM-pairs active on
  each link -> r_l re-seeded on joins and leaves, stepped by Eq. 27 from
  the links' measured loads -> r̃_i per pair.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Hashable, Mapping

from bwcommon import lrc as M

Link = Hashable


@dataclass(frozen=True)
class PairPath:
    """A VM-pair as the controller sees it: Eq. 1's weight, Eq. 2's
    guarantee and every link its traffic may use (the union of its paths)."""
    weight: float
    guarantee_mbps: float
    links: frozenset


@dataclass
class LinkFactors:
    params: M.LrcParams
    capacity_mbps: Mapping[Link, float]
    mu_by_link: Mapping[Link, float] = field(default_factory=dict)   # a link's own μ (else params.mu)
    r: dict = field(default_factory=dict)            # link -> r_l (Mb/s per unit weight)
    pairs: dict = field(default_factory=dict)        # pair -> PairPath
    members: dict = field(default_factory=dict)      # link -> set of pairs
    v_hat: dict = field(default_factory=dict)        # pair -> the hosts' v as the controller models it
    sent: list = field(default_factory=list)         # the last rounds' factors, newest last (the model's delay line)
    refused_loads: int = 0
    rescales: int = 0
    saturation_drops: int = 0

    def __post_init__(self) -> None:
        for link, c in self.capacity_mbps.items():
            M._positive(f"capacity of link {link!r}", c)
        for link, mu in self.mu_by_link.items():
            if not (M.finite_number(mu) and 0 < mu <= 1):
                raise M.LrcError(f"mu of link {link!r} {mu!r} must be within (0, 1]")

    def mu_c(self, link: Link) -> float:
        return self.mu_by_link.get(link, self.params.mu) * self.capacity_mbps[link]

    def _bounds(self, link: Link) -> tuple[float, float]:
        ws = [self.pairs[p].weight for p in self.members[link]]
        mu_c = self.mu_c(link)
        return self.params.factor_floor * mu_c / sum(ws), mu_c / min(ws)

    def _clamp(self, link: Link, r: float) -> float:
        lo, hi = self._bounds(link)
        return min(max(r, lo), hi)

    def set_pairs(self, pairs: Mapping[Hashable, PairPath]) -> set:
        """The active pairs now (all of them). Links whose pairs changed are
        re-seeded; returns those links."""
        for p, pp in pairs.items():
            M._positive(f"weight of pair {p!r}", pp.weight)
            M._non_negative(f"guarantee of pair {p!r}", pp.guarantee_mbps)
            unknown = [link for link in pp.links if link not in self.capacity_mbps]
            if unknown:
                raise M.LrcError(f"pair {p!r} crosses links without a capacity: {unknown!r}")
        old_members = self.members
        old_sum = {link: sum(self.pairs[p].weight for p in ps) for link, ps in old_members.items()}
        old_pairs = self.pairs
        self.pairs = dict(pairs)
        self.members = {}
        for p, pp in self.pairs.items():
            for link in pp.links:
                self.members.setdefault(link, set()).add(p)
        changed = set()
        for link in list(self.r):
            if link not in self.members:
                del self.r[link]
        self.v_hat = {p: self.v_hat[p] if p in self.v_hat else max(pp.guarantee_mbps, self.params.v_floor_mbps)
                      for p, pp in self.pairs.items()}
        # pass 1: links that keep the same pairs with the same terms keep r_l;
        # pass 2 re-seeds the rest, seeing the kept factors of the pairs' other links
        for link, ps in self.members.items():
            if link in self.r and old_members.get(link) == ps and all(old_pairs[p] == self.pairs[p] for p in ps):
                continue
            changed.add(link)
        for link in sorted(changed, key=repr):
            mu_c = self.mu_c(link)
            new_sum = sum(self.pairs[p].weight for p in self.members[link])
            if link not in self.r:
                seed = M.initial_factor(mu_c, new_sum) if self.params.rescale != "equilibrium" \
                    else M.equilibrium_factor(mu_c, self._terms(link))
            else:
                seed = M.rescaled_factor(self.params.rescale, self.r[link], mu_c, old_sum.get(link) or new_sum,
                                         new_sum, self._terms(link))
                self.rescales += 1
            self.r[link] = self._clamp(link, seed)
        return changed

    def _terms(self, link: Link) -> list[tuple[float, float, float]]:
        out = []
        for p in sorted(self.members[link], key=repr):
            pp = self.pairs[p]
            elsewhere = [self.r[o] for o in pp.links if o != link and o in self.r]
            out.append((pp.weight, pp.guarantee_mbps, min(elsewhere) if elsewhere else math.inf))
        return out

    def seed(self, link: Link, r: float) -> None:
        """Resume from what the hosts run (a restarted controller): r_l =
        the largest v_i/w_i the link's pairs report, within bounds."""
        if link not in self.members:
            raise M.LrcError(f"link {link!r} carries no pair")
        self.r[link] = self._clamp(link, M._positive(f"factor of link {link!r}", r))

    def update(self, loads_mbps: Mapping[Link, float], full_is_equilibrium: bool = False) -> None:
        """One τ_r round: Eq. 27 on every link with pairs and a load sample.
        A missing or invalid load leaves that link's factor as it is. A full
        link's factor drops to its equilibrium if above it; with
        ``full_is_equilibrium`` (the WC subflows are not capped at the hosts,
        so a link with WC demand is always full and its load says nothing of
        the limits) a full link's factor *is* its equilibrium."""
        p = self.params
        lag = self.lag() if p.anti_windup else {}
        full = set()
        for link in sorted(self.members, key=repr):
            load = loads_mbps.get(link)
            if not M.finite_number(load) or load < 0:
                if load is not None:
                    self.refused_loads += 1
                continue
            lo, hi = self._bounds(link)
            self.r[link] = M.next_link_factor(self.r[link], load + lag.get(link, 0.0), self.mu_c(link), p.beta,
                                              p.tau_r_s, lo, hi)
            if p.saturation is not None and load >= p.saturation * self.capacity_mbps[link]:
                full.add(link)
        if full:
            # full: the wire caps the load at C, so Eq. 27's decrease is at most β·τ_r·(1 − 1/μ) a round
            # however far the limits overshoot; the full links' joint equilibrium is where the pairs fit
            for link, eq in self.equilibrium(full).items():
                if self.r[link] > eq or full_is_equilibrium:
                    self.r[link] = eq
                    self.saturation_drops += 1
        self._advance_model()

    def equilibrium(self, links: set) -> dict:
        """The factors at which the pairs crossing ``links`` fill them
        together (weighted max-min with the guarantees as floors, at μC:
        progressive filling, compiled -- :mod:`apps.lrc._kernels`); a link
        none of whose pairs rises above its guarantee keeps no entry."""
        from apps.lrc._kernels import waterfill
        pairs = sorted({q for link in links for q in self.members[link]}, key=repr)
        order = sorted(links, key=repr)
        index = {link: i for i, link in enumerate(order)}
        paths = [[link for link in self.pairs[q].links if link in links] for q in pairs]
        # a pair's other links hold it at w·(their least factor), at least its guarantee
        caps = []
        for q in pairs:
            pp = self.pairs[q]
            others = [self.r[o] for o in pp.links if o not in links and o in self.r]
            caps.append(max(pp.guarantee_mbps, pp.weight * min(others)) if others else math.inf)
        rates = waterfill([[index[link] for link in path] for path in paths],
                          [self.pairs[q].weight for q in pairs], [self.pairs[q].guarantee_mbps for q in pairs], caps,
                          [self.mu_c(link) for link in order])
        out: dict = {}
        for q, path, rate, cap in zip(pairs, paths, rates, caps):
            pp = self.pairs[q]
            if rate > pp.guarantee_mbps * (1 + 1e-9) + 1e-9 and rate < cap * (1 - 1e-9):
                for link in path:
                    out[link] = max(out.get(link, 0.0), rate / pp.weight)
        return {link: self._clamp(link, r) for link, r in out.items()}

    def lag(self) -> dict:
        """Per link, how much more the pairs' limits would carry once every
        v has reached its target w_i·r̃_i: Σ (max(B, w·r̃) − max(B, v̂))⁺.
        Counting it as load keeps r_l from winding up while the hosts'
        v are still climbing (anti-windup, not in the paper; it is zero at
        equilibrium, so Eq. 7 is unchanged)."""
        out: dict = {}
        for pair, pp in self.pairs.items():
            if not pp.links:
                continue
            target = max(pp.guarantee_mbps, pp.weight * self.pair_factor(pair))
            gap = target - max(pp.guarantee_mbps, self.v_hat[pair])
            if gap > 0:
                for link in pp.links:
                    out[link] = out.get(link, 0.0) + gap
        return out

    def _advance_model(self) -> None:
        """The hosts' Eq. 27 over one τ_r, as they run it: with the factors
        of ``feedback_delay_s`` ago (a pair the hosts have no factor for yet
        stays where it started)."""
        p = self.params
        steps = max(1, round(p.tau_r_s / p.tau_v_s))
        lag_rounds = round(p.feedback_delay_s / p.tau_r_s)
        self.sent.append(self.factors())
        del self.sent[:-(lag_rounds + 1)]
        at_hosts = self.sent[0] if len(self.sent) > lag_rounds else {}
        for pair, pp in self.pairs.items():
            if not pp.links or pair not in at_hosts:
                continue
            target_r = at_hosts[pair]
            v = self.v_hat[pair]
            for _ in range(steps):
                v = M.next_pair_rate(v, pp.weight, target_r, p.alpha, p.tau_v_s, p.v_floor_mbps, math.inf)
            self.v_hat[pair] = v

    def pair_factor(self, pair: Hashable) -> float:
        """r̃_i: the least factor over the pair's links."""
        return min(self.r[link] for link in self.pairs[pair].links)

    def factors(self) -> dict[Hashable, float]:
        return {p: self.pair_factor(p) for p in self.pairs if self.pairs[p].links}
