"""prio_queues' settings: its section of the controller's configuration
(composed by :mod:`controller.config`)."""

from __future__ import annotations

from pydantic import Field

from bwcommon.validate import StrictModel as _Strict


class PrioQueues(_Strict):
    meters: bool = Field(True, description="meter each VM's BG at its ToR at its guarantee (x meter_headroom)")
    meter_headroom: float = Field(1.05, ge=1, le=2, description="ToR meters police BG at guarantee x this, "
                                  "so a host's own HTB-shaped BG never meets them")
    burst_kbit: int | None = Field(None, gt=0, lt=2**32, description="meter burst in kilobits (default: "
                                   "50 ms at the guarantee, at least two GSO super-packets)")
