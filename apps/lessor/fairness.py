"""Receiver fairness: the max-min share of a saturated receiving host link,
enforced at the senders' ToRs (pure; :class:`apps.lessor.logic.LessorLogic`
turns it into meters).

Why. Where long flows from several hosts meet at one host's link, the ToR's
port to that host is a drop-tail FIFO, and plain TCP splits it as its
losses fall: in emulation one of three flows into a 10 Mb/s port got
0.75-0.95 of its equal share in 40 s runs (``benchmarks.port_shares``), and
an intra-ToR flow beside two inter-ToR ones 0.55-0.85 under LESSOR
(docs/results.md). No placement changes that -- every path ends at that
port -- and a switch port has no per-flow scheduler to call on (this
platform's userspace OVS honours no queues at all; a hardware port has a
handful, not one per flow). What a controller does have is a policer per
flow: an OpenFlow meter at the flow's source ToR, before the packets cross
the fabric.

What. For each host whose receiving is saturated (its long flows' measured
rates add up to ``busy`` of its link or more) with two long flows into it
or more: each flow's demand is its measured rate times (1 + ``headroom``),
the link's capacity is water-filled over those demands, and the flows at
the water level -- those that take at least the level -- are policed at the
level times (1 + ``slack``). The flows below it are never policed: they get
what the policed ones leave, and, measured higher next round, a larger
demand (so a TCP flow the FIFO held low climbs to the equal share in a few
polling rounds), while a flow its application holds low keeps only
``headroom`` times its rate of the link from the others. Measured on one
emulated switch: three TCP flows policed at 1.05 x the equal share got
0.97-1.01 of it, 9.8-10.0 Mb/s of 10 in all (docs/results.md).

What it costs. A policed flow cannot take more than the level x (1 +
slack) until the next round: when another flow into that host slows down,
up to one polling period passes before the level rises (the host is no
longer saturated, or the slower flow's demand is lower). And up to
``headroom`` x the rate of each flow its application holds below the level
is kept for it and may stay unused.
"""

from __future__ import annotations

import math
from typing import Hashable, Iterable, Mapping

HEADROOM = 0.5      # a flow below the level may want this much more than it was measured at
SLACK = 0.05        # policed at the level x (1 + this): the FIFO stays busy, no flow above the level takes more
BUSY = 0.85         # a host's receiving is saturated at this fraction of its link
RATE_BAND = 0.05    # a meter's rate is changed only when the level moved more than this


class FairnessError(ValueError):
    pass


def _check(name: str, x: float, low: float = 0.0) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < low:
        raise FairnessError(f"{name}: {x!r} is not a finite number >= {low}")
    return float(x)


def water_level(capacity: float, demands: Iterable[float]) -> float:
    """The max-min level L of ``capacity`` over ``demands``: the sum of
    min(d, L) is the capacity; infinity when the demands fit altogether."""
    remaining = _check("capacity", capacity)
    ds = sorted(_check("demand", d) for d in demands)
    for i, d in enumerate(ds):
        share = remaining / (len(ds) - i)
        if d >= share:
            return share
        remaining -= d
    return math.inf


def receiver_caps(rates: Mapping[Hashable, float], capacity: float, headroom: float = HEADROOM,
                  busy: float = BUSY) -> dict[Hashable, float]:
    """The flows into one host link to police, and the level each is held
    to (bits/s): {} unless the measured ``rates`` add up to ``busy`` x
    ``capacity`` or more over at least two flows."""
    capacity = _check("capacity", capacity)
    headroom = _check("headroom", headroom)
    if not 0 < _check("busy", busy) <= 1:
        raise FairnessError(f"busy: {busy!r} is not in (0, 1]")
    checked = {key: _check(f"rate of {key!r}", r) for key, r in rates.items()}
    if len(checked) < 2 or capacity <= 0 or sum(checked.values()) < busy * capacity:
        return {}
    demands = {key: r * (1 + headroom) for key, r in checked.items()}
    level = water_level(capacity, demands.values())
    if not math.isfinite(level):
        return {}
    return {key: level for key, d in demands.items() if d >= level}


def police_rate(level: float, slack: float = SLACK) -> float:
    """What a meter lets through for a flow held to ``level``."""
    return _check("level", level) * (1 + _check("slack", slack))


def rate_moved(old: float, new: float, band: float = RATE_BAND) -> bool:
    """Whether a meter at ``old`` is to be changed to ``new``."""
    return abs(new - old) > band * old
