"""Max-min fair rates of flows on fixed paths (progressive filling).

The ideal that emulated results are compared with: every flow grows at the
same pace until a link on its path fills or it reaches its demand; frozen
flows keep their rate, the rest go on.
"""

from __future__ import annotations

from typing import Hashable, Mapping, Sequence

Link = tuple[Hashable, Hashable]


def max_min_fair(paths: Sequence[Sequence[Link]], capacity: Mapping[Link, float],
                 demands: Sequence[float] | None = None) -> list[float]:
    """Rates (same unit as capacity) for flows with the given link paths."""
    n = len(paths)
    demand = list(demands) if demands is not None else [float("inf")] * n
    if len(demand) != n:
        raise ValueError(f"{n} paths but {len(demand)} demands")
    for i, path in enumerate(paths):
        for link in path:
            if link not in capacity:
                raise KeyError(f"flow {i}: link {link} has no capacity")
    rate = [0.0] * n
    active = {i for i in range(n) if demand[i] > 0 and paths[i]}
    for i in range(n):
        if not paths[i]:
            rate[i] = demand[i]  # local flow, no shared link: only its demand limits it
    residual = {link: float(c) for link, c in capacity.items()}
    while active:
        users: dict[Link, int] = {}
        for i in active:
            for link in paths[i]:
                users[link] = users.get(link, 0) + 1
        step = min(residual[link] / k for link, k in users.items())
        step = min(step, min(demand[i] - rate[i] for i in active))
        for i in active:
            rate[i] += step
        for link, k in users.items():
            residual[link] -= step * k
        eps = 1e-9 * max(1.0, max(capacity.values(), default=1.0))
        full = {link for link, k in users.items() if residual[link] <= eps}
        active = {i for i in active
                  if demand[i] - rate[i] > eps and not any(link in full for link in paths[i])}
    return rate
