"""LRC's Algorithm 1 as the paper states it, event by event (a reference
model for the tests): connections open and close at the sender's host and
the sender halves follow. The product applies the same rule
(:func:`bwcommon.lrc.sender_halves`) to the pairs the agent reads from
conntrack each round (:mod:`hostagent.lrc`); the tests hold the two equal."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Hashable

from bwcommon.lrc import LrcError, _positive, sender_halves


@dataclass
class SenderHalves:
    """Algorithm 1 at the sender's host: connections open and close; the
    set X^r of VMs this VM sends to changes only when a destination's first
    connection opens or its last closes, and then every destination's
    sender half B_x·w_y/Σ_{X^r} w changes with it. ``weight_of`` gives a
    receiver's weight (the controller sends the tenant's weights)."""
    guarantee_mbps: float
    weight_of: Callable[[Hashable], float]
    connections: Counter = field(default_factory=Counter)

    def open(self, y: Hashable) -> bool:
        """A connection to ``y`` opened; True if X^r changed."""
        _positive(f"weight of {y!r}", self.weight_of(y))
        self.connections[y] += 1
        return self.connections[y] == 1

    def close(self, y: Hashable) -> bool:
        """A connection to ``y`` closed; True if X^r changed. Closing what
        is not open is refused (the caller's bookkeeping is wrong)."""
        if self.connections[y] <= 0:
            del self.connections[y]
            raise LrcError(f"close of a connection to {y!r}: none is open")
        self.connections[y] -= 1
        if self.connections[y] == 0:
            del self.connections[y]
            return True
        return False

    @property
    def receivers(self) -> list:
        return sorted(self.connections, key=repr)

    def halves(self) -> dict[Hashable, float]:
        """B_x·w_y/Σ_{X^r} w for every y in X^r (they sum to B_x)."""
        return sender_halves(self.guarantee_mbps, {y: self.weight_of(y) for y in self.receivers})
