"""Traffic-engineering instances: long flows with demands on a topology
(pure; used by the PMPT benchmark, tests and simulations).

- ``permutation``: every host sends one long flow to its partner in a random
  derangement; natural demand = the NIC rate.
- ``websearch``: the random communication model: as many long flows as
  hosts, each from a random source to a random other host, sizes drawn from
  the web-search CDF above the 100 KB long-flow threshold; demands are
  Hedera's natural-demand estimates (NIC-limited max-min) times the NIC rate.
"""

from __future__ import annotations

import random

from apps.lessor.hedera import estimate_demands
from apps.lessor.pmpt import LongFlow
from controller.network_view import NetworkView
from experiments.workloads import SizeCdf, permutation

LONG_FLOW_BYTES = 100_000


def _nic_bps(view: NetworkView, host: str) -> float:
    sw, _ = view.host_switch(host)
    return view.capacity(host, sw)


def long_flows(view: NetworkView, kind: str, seed: int = 1, n_flows: int | None = None) -> list[LongFlow]:
    rng = random.Random(seed)
    hosts = view.hosts
    if kind == "permutation":
        pairs = permutation(hosts, rng)
        sizes = [None] * len(pairs)
    elif kind == "websearch":
        cdf = SizeCdf.load("websearch")
        n = n_flows or len(hosts)
        pairs, sizes = [], []
        for _ in range(n):
            src = rng.choice(hosts)
            dst = rng.choice([h for h in hosts if h != src])
            size = cdf.sample(rng)
            while size < LONG_FLOW_BYTES:
                size = cdf.sample(rng)
            pairs.append((src, dst))
            sizes.append(size)
    else:
        raise ValueError(f"unknown instance kind {kind!r}: permutation or websearch")
    fractions = estimate_demands(pairs)
    flows = []
    for i, ((src, dst), frac, size) in enumerate(zip(pairs, fractions, sizes)):
        flows.append(LongFlow((i, src, dst), view.host_switch(src)[0], view.host_switch(dst)[0],
                              frac * _nic_bps(view, src), size))
    return flows
