"""LESSOR's settings: its section of the controller's configuration
(composed by :mod:`controller.config`) and the defaults its algorithms
start from. Imports nothing of the controller (docs/architecture.md)."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field, model_validator

from bwcommon.validate import StrictModel as _Strict
from bwcommon.validate import finite_number

DEFAULT_EPSILON = 0.05          # PMPT's approximation parameter
LONG_FLOW_BYTES = 100_000       # PRE: a flow that sent this many bytes in one period is long


@dataclass(frozen=True)
class PollingConfig:
    lower: float = 0.50        # LT
    upper: float = 0.70        # UT
    initial_s: float = 5.0
    alpha: float = 0.05
    alpha_min: float = 0.01
    alpha_step: float = 0.01
    min_s: float = 0.5
    max_s: float = 60.0
    rtt_factor: float = 2.0

    def check(self) -> None:
        bad = [f"{k}={v!r}" for k, v in vars(self).items() if not finite_number(v)]
        if bad:
            raise ValueError(f"polling: {', '.join(bad)} must be finite numbers")
        if not 0 <= self.lower < self.upper <= 1:
            raise ValueError(f"polling: need 0 <= lower ({self.lower}) < upper ({self.upper}) <= 1")
        if not 0 < self.min_s <= self.initial_s <= self.max_s:
            raise ValueError(f"polling: need 0 < min_s ({self.min_s}) <= initial_s ({self.initial_s}) "
                             f"<= max_s ({self.max_s})")
        if not 0 < self.alpha_min <= self.alpha < 1:
            raise ValueError(f"polling: need 0 < alpha_min ({self.alpha_min}) <= alpha ({self.alpha}) < 1")


class Polling(_Strict):
    lower: float = Field(PollingConfig.lower, ge=0, le=1, description="Algorithm 1's lower CPU threshold LT")
    upper: float = Field(PollingConfig.upper, ge=0, le=1, description="Algorithm 1's upper CPU threshold UT")
    initial_s: float = Field(PollingConfig.initial_s, gt=0, description="first polling period (s)")
    alpha: float = Field(PollingConfig.alpha, gt=0, lt=1, description="period step factor")
    alpha_min: float = Field(PollingConfig.alpha_min, gt=0, lt=1, description="smallest step factor")
    alpha_step: float = Field(PollingConfig.alpha_step, ge=0, lt=1, description="step factor change")
    min_s: float = Field(PollingConfig.min_s, gt=0, description="shortest polling period (s)")
    max_s: float = Field(PollingConfig.max_s, gt=0, le=3600, description="longest polling period (s)")
    rtt_factor: float = Field(PollingConfig.rtt_factor, gt=0, le=100,
                              description="an RTT this many times the average counts as a controller backlog")

    @model_validator(mode="after")
    def _consistent(self) -> "Polling":
        try:
            self.polling_config().check()     # the ordering rules (lower < upper, min <= initial <= max, ...)
        except ValueError as exc:
            raise ValueError(str(exc).removeprefix("polling: ")) from None
        return self

    def polling_config(self) -> PollingConfig:
        return PollingConfig(**self.model_dump())


class Lessor(_Strict):
    epsilon: float = Field(DEFAULT_EPSILON, gt=0, lt=0.5, description="PMPT's approximation parameter")
    long_flow_bytes: int = Field(LONG_FLOW_BYTES, ge=1, le=10**12,
                                 description="a flow that sent this many bytes in one period is long")
    polling: Polling = Field(default_factory=Polling, description="PRE's CPU-adaptive polling (Algorithm 1)")
    bg_first: bool = Field(True, description="with prio queues: place the long flows that carry BG (first "
                           "subflows, UDP) before the rest, each link's BG within admission.mu x its capacity")
    bg_routes: bool = Field(True, description="with bg_first: every VM's BG on a default route from its first "
                            "packet, packed so each link's hose bound of BG stays within admission.mu x its capacity")
    fair_receivers: bool = Field(True, description="without prio queues: police the long flows into a host whose "
                                 "link is saturated at its max-min share, by meters at their source ToRs "
                                 "(with prio queues the WC policy shares what BG leaves)")
