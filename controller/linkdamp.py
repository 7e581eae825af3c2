"""Suppression of flapping links (pure; the forwarding apps' adapter feeds it).

A link that goes down is taken out of the routes at once. A port that keeps
changing state is worse than one that stays down: every time it comes up the
routes and the switches' ECMP groups send traffic into it, and the next
failure drops what is in flight (a TCP flow across it stalls for seconds).
So, as routers damp flapping routes, a port that changed state ``threshold``
times within ``window_s`` is held down -- its "up" reports are not acted on
-- until it has stayed up for ``hold_s``; then it is let back in.

Every report is still counted (``controller.app_base`` gathers the effective
states and recomputes at most once per ``LINK_HOLD_S``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Hashable

from bwcommon.validate import finite_number


@dataclass
class _Port:
    changes: deque = field(default_factory=deque)   # times of its last state changes
    up: bool | None = None                          # last reported state
    held_until: float | None = None                 # suppressed: its "up" is not acted on before this


class LinkDamping:
    def __init__(self, threshold: int = 4, window_s: float = 2.0, hold_s: float = 2.0):
        if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 2:
            raise ValueError(f"threshold {threshold!r} must be an int >= 2 (state changes)")
        if not finite_number(window_s) or window_s <= 0:
            raise ValueError(f"window_s {window_s!r} must be a finite number > 0")
        if not finite_number(hold_s) or hold_s < 0:
            raise ValueError(f"hold_s {hold_s!r} must be a finite number >= 0")
        self.window_s, self.hold_s, self.threshold = float(window_s), float(hold_s), threshold
        self.ports: dict[Hashable, _Port] = {}
        self.suppressed_total = 0     # times a port was held down

    def report(self, port: Hashable, up: bool, now: float) -> bool:
        """A port's reported state; returns the state to act on (False while held down)."""
        if not isinstance(up, bool):
            raise ValueError(f"state {up!r} must be a bool")
        if not finite_number(now):
            raise ValueError(f"now {now!r} must be a finite number")
        st = self.ports.setdefault(port, _Port())
        changed = st.up is not None and st.up != up
        if changed:
            st.changes.append(now)
        st.up = up
        while st.changes and st.changes[0] < now - self.window_s:
            st.changes.popleft()
        if len(st.changes) >= self.threshold and st.held_until is None:
            self.suppressed_total += 1
            st.held_until = now + self.hold_s
        elif changed and st.held_until is not None:
            st.held_until = now + self.hold_s       # not stable yet: every change while held restarts the hold
        if not up:
            return False
        return st.held_until is None or now >= st.held_until

    def due(self, now: float) -> list[Hashable]:
        """Ports whose hold ended and that are up: to be acted on as up now
        (each is let back in once; a port that went down meanwhile stays held
        until its next report)."""
        out = []
        for port, st in self.ports.items():
            if st.held_until is not None and now >= st.held_until:
                st.held_until = None
                st.changes.clear()
                if st.up:
                    out.append(port)
        return out

    def next_release(self) -> float:
        """When the earliest hold ends (inf: none)."""
        return min((st.held_until for st in self.ports.values() if st.held_until is not None), default=math.inf)

    def held(self) -> list[Hashable]:
        return sorted((p for p, st in self.ports.items() if st.held_until is not None), key=repr)
