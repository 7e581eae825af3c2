"""Traffic patterns and flow-size workloads (pure, seeded, deterministic).

Flow-size CDFs: one point per line, ``<bytes> <cumulative percent>``, linear
between points (data/websearch_cdf.txt: DCTCP web search, mean ~1.6 MB;
data/fb_hadoop_cdf.txt: Facebook Hadoop, short-flow heavy).
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
WORKLOADS = {"websearch": DATA / "websearch_cdf.txt", "hadoop": DATA / "fb_hadoop_cdf.txt"}


@dataclass(frozen=True)
class SizeCdf:
    sizes: tuple[float, ...]
    probs: tuple[float, ...]  # cumulative, 0..1

    @classmethod
    def load(cls, path_or_name: str | Path) -> "SizeCdf":
        path = WORKLOADS.get(str(path_or_name), Path(path_or_name))
        sizes, probs = [], []
        for n, line in enumerate(Path(path).read_text().splitlines(), 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            try:
                size, pct = (float(x) for x in line.split()[:2])
            except ValueError:
                raise ValueError(f"{path}:{n}: expected '<bytes> <cumulative percent>'") from None
            if sizes and (size < sizes[-1] or pct / 100 < probs[-1]):
                raise ValueError(f"{path}:{n}: sizes and percentages must not decrease")
            sizes.append(size)
            probs.append(pct / 100)
        if not sizes or abs(probs[-1] - 1.0) > 1e-9:
            raise ValueError(f"{path}: the CDF must end at 100 percent")
        return cls(tuple(sizes), tuple(probs))

    def sample(self, rng: random.Random) -> int:
        u = rng.random()
        i = bisect.bisect_left(self.probs, u)
        if i == 0:
            return max(1, int(self.sizes[0]))
        p0, p1 = self.probs[i - 1], self.probs[i]
        s0, s1 = self.sizes[i - 1], self.sizes[i]
        frac = 0.0 if p1 == p0 else (u - p0) / (p1 - p0)
        return max(1, int(round(s0 + frac * (s1 - s0))))

    def mean(self) -> float:
        """Exact mean of the piecewise-linear CDF."""
        return sum((p1 - p0) * (s0 + s1) / 2 for s0, s1, p0, p1 in
                   zip(self.sizes, self.sizes[1:], self.probs, self.probs[1:]))


def permutation(hosts: list[str], rng: random.Random) -> list[tuple[str, str]]:
    """Random derangement: every host sends to one other and receives from one."""
    while True:
        dsts = hosts[:]
        rng.shuffle(dsts)
        if all(a != b for a, b in zip(hosts, dsts)):
            return list(zip(hosts, dsts))


def stride(hosts: list[str], step: int) -> list[tuple[str, str]]:
    n = len(hosts)
    if step % n == 0:
        raise ValueError(f"stride {step} maps every host to itself ({n} hosts)")
    return [(hosts[i], hosts[(i + step) % n]) for i in range(n)]


def poisson_arrivals(rate_per_s: float, duration_s: float, rng: random.Random) -> list[float]:
    times, t = [], 0.0
    while True:
        t += rng.expovariate(rate_per_s)
        if t >= duration_s:
            return times
        times.append(t)


@dataclass(frozen=True)
class FlowSpec:
    src: str
    dst: str
    start_s: float
    size: int


def open_loop_flows(hosts: list[str], cdf: SizeCdf, load: float, host_mbps: float,
                    duration_s: float, seed: int) -> list[FlowSpec]:
    """Each host starts flows to uniformly random other hosts as a Poisson
    process whose offered load is ``load`` of its NIC rate."""
    rng = random.Random(seed)
    rate = load * host_mbps * 1e6 / 8 / cdf.mean()
    flows = []
    for src in hosts:
        others = [h for h in hosts if h != src]
        for t in poisson_arrivals(rate, duration_s, rng):
            flows.append(FlowSpec(src, rng.choice(others), t, cdf.sample(rng)))
    return sorted(flows, key=lambda f: (f.start_s, f.src))


@dataclass(frozen=True)
class OnOffModel:
    """ON-OFF sources (LESSOR §5): each server alternates log-normal ON and
    OFF periods and starts flows (Poisson) only while ON; the random
    communication model: each server draws how many destinations it talks to
    (uniform in 1..max_dests, all others by default) and which ones, and
    sends each flow to one of them at random."""
    on_mean_s: float = 2.0
    off_mean_s: float = 2.0
    sigma: float = 1.0          # of the underlying normal, both periods
    max_dests: int | None = None

    def check(self) -> None:
        if self.on_mean_s <= 0 or self.off_mean_s < 0 or self.sigma < 0:
            raise ValueError("on-off: on_mean_s must be > 0, off_mean_s and sigma >= 0")
        if self.max_dests is not None and self.max_dests < 1:
            raise ValueError(f"on-off: max_dests {self.max_dests} must be >= 1")

    @property
    def duty(self) -> float:
        return self.on_mean_s / (self.on_mean_s + self.off_mean_s)

    def period(self, mean_s: float, rng: random.Random) -> float:
        if mean_s == 0:
            return 0.0
        mu = math.log(mean_s) - self.sigma ** 2 / 2  # so that E[period] = mean_s
        return rng.lognormvariate(mu, self.sigma)


def on_off_flows(hosts: list[str], cdf: SizeCdf, load: float, host_mbps: float, duration_s: float,
                 seed: int, model: OnOffModel = OnOffModel()) -> list[FlowSpec]:
    """Flows of ON-OFF sources whose long-run offered load is ``load`` of the
    NIC rate: while ON, arrivals are Poisson at ``load / duty`` times the
    rate that would fill ``load`` of the NIC, so bursts exceed the average.
    Each source starts in ON with probability ``duty``, at a random phase."""
    model.check()
    if len(hosts) < 2:
        raise ValueError("on-off: need at least two hosts")
    rng = random.Random(seed)
    rate_on = load * host_mbps * 1e6 / 8 / cdf.mean() / model.duty
    limit = len(hosts) - 1 if model.max_dests is None else min(model.max_dests, len(hosts) - 1)
    flows = []
    for src in hosts:
        others = [h for h in hosts if h != src]
        dests = rng.sample(others, rng.randint(1, limit))
        on = rng.random() < model.duty
        length = model.period(model.on_mean_s if on else model.off_mean_s, rng)
        t = -rng.random() * length  # the run starts somewhere inside the first period
        while t < duration_s:
            if on:
                for a in poisson_arrivals(rate_on, length, rng):
                    if 0 <= t + a < duration_s:
                        flows.append(FlowSpec(src, rng.choice(dests), t + a, cdf.sample(rng)))
            t += length
            on = not on
            length = model.period(model.on_mean_s if on else model.off_mean_s, rng)
    return sorted(flows, key=lambda f: (f.start_s, f.src))
