"""A simulation scenario: links, VM-flows and parameters (YAML or JSON).

```yaml
duration_s: 30
delay_s: 0.2            # end of a port-stats interval -> the factor at the host
controller: lrc         # or elastic (the ElasticSwitch-like allocator)
params: {alpha: 10, beta: 1}        # bwcommon.lrc.LrcParams; the rest default
links:
  - {id: L, capacity_mbps: 1000}    # mu: the params' unless given
flows:
  - {id: X, weight: 1, guarantee_mbps: 600, links: [L]}
  - {id: Y, weight: 1, links: [L], start_s: 15}
```

A flow is one VM-pair: its Eq. 1 weight, its Eq. 2 guarantee, the links it
crosses; it is backlogged from ``start_s`` to ``stop_s`` unless it has a
``demand_mbps`` or ``arrivals`` (short flows of ``size_bytes`` arriving as
a Poisson process of ``rate_per_s``, sent while any is unfinished).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, model_validator

from bwcommon.lrc import LrcParams
from bwcommon.validate import StrictModel, strict_json

NAME = r"^[A-Za-z0-9_.:-]{1,64}$"


class ScenarioError(ValueError):
    pass


class LinkSpec(StrictModel):
    id: str = Field(pattern=NAME)
    capacity_mbps: float = Field(gt=0, le=1e7)
    mu: float | None = Field(None, gt=0, le=1)


class Arrivals(StrictModel):
    rate_per_s: float = Field(gt=0, le=1e5)
    size_bytes: float = Field(gt=0, le=1e12)
    start_s: float = Field(0.0, ge=0)
    stop_s: float | None = Field(None, gt=0)


class FlowSpec(StrictModel):
    id: str = Field(pattern=NAME)
    weight: float = Field(1.0, gt=0, le=1e6)
    guarantee_mbps: float = Field(0.0, ge=0, le=1e7)
    links: list[str] = Field(min_length=1, max_length=64)
    start_s: float = Field(0.0, ge=0)
    stop_s: float | None = Field(None, gt=0)
    demand_mbps: float | None = Field(None, ge=0, le=1e7)
    arrivals: Arrivals | None = None

    @model_validator(mode="after")
    def _times(self) -> "FlowSpec":
        if self.stop_s is not None and self.stop_s <= self.start_s:
            raise ValueError(f"stop_s {self.stop_s} must be after start_s {self.start_s}")
        if self.arrivals is not None and self.demand_mbps is not None:
            raise ValueError("a flow has demand_mbps or arrivals, not both")
        if len(set(self.links)) != len(self.links):
            raise ValueError("links repeat")
        return self


class Scenario(StrictModel):
    duration_s: float = Field(gt=0, le=3600)
    dt_s: float = Field(0.005, ge=1e-4, le=1.0, description="simulation step; τ_v, τ_r, delay are multiples of it")
    delay_s: float = Field(0.0, ge=0, le=60)
    controller: Literal["lrc", "elastic"] = "lrc"
    mode: Literal["paper", "combined"] = "paper"
    params: LrcParams = Field(default_factory=LrcParams)
    links: list[LinkSpec] = Field(min_length=1, max_length=10_000)
    flows: list[FlowSpec] = Field(min_length=1, max_length=10_000)
    load_noise: float = Field(0.0, ge=0, le=0.5, description="relative standard deviation of the controller's "
                              "load samples (port statistics of bursty TCP are not exact)")
    seed: int = Field(1, ge=0, le=2**32 - 1)
    record_every_s: float = Field(0.05, gt=0, le=60)
    steady_window_s: float = Field(5.0, gt=0, le=3600, description="steady state: the mean over this long before "
                                   "a flow's end (or the run's)")

    @model_validator(mode="after")
    def _consistent(self) -> "Scenario":
        bad = []
        ids = [link.id for link in self.links]
        if len(set(ids)) != len(ids):
            bad.append("links: ids repeat")
        fids = [f.id for f in self.flows]
        if len(set(fids)) != len(fids):
            bad.append("flows: ids repeat")
        known = set(ids)
        for f in self.flows:
            missing = [link for link in f.links if link not in known]
            if missing:
                bad.append(f"flows[{f.id}].links: {missing} not among the links")
        for name in ("delay_s", "record_every_s"):
            v = getattr(self, name)
            if abs(v / self.dt_s - round(v / self.dt_s)) > 1e-6:
                bad.append(f"{name} {v:g} is not a multiple of dt_s {self.dt_s:g}")
        for name in ("tau_v_s", "tau_r_s"):
            v = getattr(self.params, name)
            if abs(v / self.dt_s - round(v / self.dt_s)) > 1e-6:
                bad.append(f"params.{name} {v:g} is not a multiple of dt_s {self.dt_s:g}")
        if bad:
            raise ValueError("; ".join(bad))
        return self


def parse(data, what: str = "scenario") -> Scenario:
    from controller.config import schema_errors
    if not isinstance(data, dict):
        raise ScenarioError(f"{what}: must be a mapping")
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(f"{what}: " + "; ".join(schema_errors(exc))) from None


def load(path: str | Path) -> Scenario:
    path = Path(path)
    raw = path.read_bytes()
    if len(raw) > 1 << 20:
        raise ScenarioError(f"{path}: larger than 1 MiB")
    if path.suffix in (".yaml", ".yml"):
        from controller.config import ConfigError, parse_yaml
        try:
            data = parse_yaml(raw, str(path))
        except ConfigError as exc:
            raise ScenarioError("; ".join(exc.problems)) from None
    else:
        try:
            data = strict_json(raw, str(path))
        except ValueError as exc:
            raise ScenarioError(str(exc)) from None
    return parse(data, str(path))


def dump(s: Scenario) -> str:
    return json.dumps(s.model_dump(mode="json"), indent=2)
