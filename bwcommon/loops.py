"""Periodic loops that never die.

Every periodic loop of bwfabric (LESSOR's polling and allocation, the host
agent's buffer, LRC and ESE rounds, LRC's controller round) runs its rounds
through :class:`LoopGuard`: an exception in one round is logged with the
loop's name, the round number and the traceback, counted per loop, kept as
the last error (so status and metrics can show it), and the loop goes on
with the next round. A loop whose rounds keep failing slows down (the
caller's back-off), it never stops.

Pure Python, no os-ken import: the apps and the agent pass their own sleep.
"""

from __future__ import annotations

import logging
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class LoopStats:
    rounds: int = 0
    errors: int = 0
    consecutive_errors: int = 0
    last_error: str | None = None
    last_error_at: float | None = None   # time.time() of the last failed round


@dataclass
class LoopGuard:
    """Runs one round of a named loop at a time, catching everything a round
    can raise (``BaseException`` minus the ones that mean "stop the process":
    KeyboardInterrupt, SystemExit, and green-thread kills, which subclass
    BaseException too)."""
    logger: logging.Logger
    stats: dict[str, LoopStats] = field(default_factory=dict)
    clock: Callable[[], float] = time.time

    def run(self, name: str, fn: Callable[..., Any], *args, **kwargs) -> tuple[bool, Any]:
        """(True, result) if the round succeeded, (False, None) if it raised."""
        st = self.stats.setdefault(name, LoopStats())
        st.rounds += 1
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - a loop must survive anything a round raises
            st.errors += 1
            st.consecutive_errors += 1
            st.last_error = f"{type(exc).__name__}: {exc}"
            st.last_error_at = self.clock()
            self.logger.error("%s: round %d failed (%d errors so far, %d in a row): %s\n%s",
                              name, st.rounds, st.errors, st.consecutive_errors, st.last_error,
                              traceback.format_exc().rstrip())
            return False, None
        st.consecutive_errors = 0
        return True, result

    def backoff(self, name: str, base_s: float, max_s: float = 30.0) -> float:
        """How long to wait before the next round: ``base_s`` normally,
        doubling per failed round in a row, at most ``max_s``."""
        st = self.stats.get(name)
        n = 0 if st is None else st.consecutive_errors
        return min(max_s, base_s * (2 ** min(n, 16))) if n else base_s

    def as_dict(self) -> dict[str, dict]:
        return {name: dict(vars(st)) for name, st in sorted(self.stats.items())}
