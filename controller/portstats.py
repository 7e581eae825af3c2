"""Link loads from OpenFlow port statistics (pure).

Every reply carries, per port, the bytes sent and received since the port
came up and the time it has been up (``duration_sec`` + ``duration_nsec``).
A port's rate is the byte delta between two replies over the *duration*
delta -- the switch's own clock, so the controller's polling jitter and the
reply's travel time do not enter it. A link's load in one direction is what
the switch port at its sending end transmitted; on a host link the host end
has no switch, so the host->switch direction is what the switch port
received.

A counter that went backwards or a duration that did not advance (the port
was reset, a reply came twice) gives no sample; values that are not
non-negative finite numbers are refused and counted, never stored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from controller.network_view import NetworkView


@dataclass(frozen=True)
class PortSample:
    tx_bytes: int
    rx_bytes: int
    duration_s: float


def _count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**64


class PortLoads:
    def __init__(self, view: NetworkView):
        self.view = view
        self.last: dict[tuple[str, int], PortSample] = {}
        self.rates: dict[tuple[str, str], float] = {}      # (from, to) -> bits/s
        self.tx_bytes: dict[tuple[str, int], int] = {}
        self.refused = 0
        self.replies = 0
        self.ports_parsed = 0

    def record(self, switch: str, stats: list[tuple[int, int, int, int, int]], now: float) -> None:
        """One reply: (port_no, tx_bytes, rx_bytes, duration_sec, duration_nsec)
        per port; ``now`` (the controller's monotonic clock) stands in for a
        switch that does not count durations (duration_sec all ones)."""
        self.replies += 1
        for port, tx, rx, sec, nsec in stats:
            self.ports_parsed += 1
            if not all(_count(v) for v in (port, tx, rx, sec, nsec)) or nsec >= 10**9:
                self.refused += 1
                continue
            peer = self.view.peer(switch, port)
            if peer is None:
                continue
            sample = PortSample(tx, rx, now if sec == 0xFFFFFFFF else sec + nsec / 1e9)
            before = self.last.get((switch, port))
            self.last[(switch, port)] = sample
            self.tx_bytes[(switch, port)] = tx
            if before is None:
                continue
            dt = sample.duration_s - before.duration_s
            if dt <= 0 or tx < before.tx_bytes or rx < before.rx_bytes or not math.isfinite(dt):
                continue
            self.rates[(switch, peer)] = (tx - before.tx_bytes) * 8 / dt
            if self.view.is_host(peer):
                self.rates[(peer, switch)] = (rx - before.rx_bytes) * 8 / dt

    def link_loads(self) -> dict[tuple[str, str], float]:
        return dict(self.rates)
