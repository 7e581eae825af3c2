"""LRC's settings: its section of the controller's configuration (composed
by :mod:`controller.config`): the equations' parameters (shared with the
agents, :class:`bwcommon.lrc.LrcParams`) and the controller's
switches."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from bwcommon.lrc import LrcParams


class Lrc(LrcParams):
    """LRC (logistic rate control): the controller steps a factor per link
    from port statistics every tau_r and pushes each VM-pair's terms to the
    sending host's agent, which steps v every tau_v and sets the pair's
    limits (docs/lrc.md)."""
    enabled: bool = Field(False, description="run LRC (needs agents; the port statistics are polled every "
                          "tau_r_s)")
    mode: Literal["combined", "paper"] = Field("combined", description="combined: per VM-pair BG limited to "
                                               "B_i, WC to max(B_i, v_i) - B_i; paper: one subflow limited to "
                                               "max(B_i, v_i) (tenants' wc_subflows must be 0)")

    wc: Literal["competition", "ceiling"] = Field("competition", description="combined mode: the WC subflows "
                                                  "get max(B_i, v_i) - B_i as the VM's WC competition level "
                                                  "(A_l = the pairs' excess / U; bwf_wc shares the spare in "
                                                  "proportion) or as an HTB ceiling per pair")

    def params(self) -> LrcParams:
        return LrcParams(**self.model_dump(exclude={"enabled", "mode", "wc"}))
