"""What the agent reads back from the kernel (pure parsing): live TCP/MPTCP
subflow RTTs and delivery rates from ``ss -tinH``, for Eq. 1's buffer."""

from __future__ import annotations

import re
from dataclasses import dataclass

_RTT = re.compile(r"\brtt:([\d.]+)/")
_RATE = re.compile(r"\bdelivery_rate (\d+)bps")
_MPTCP = re.compile(r"\btcp-ulp-mptcp\b")


@dataclass(frozen=True)
class Subflow:
    rtt_s: float
    delivery_bps: float


def parse_ss(text: str, mptcp_only: bool = True) -> list[Subflow]:
    """One entry per socket of ``ss -tinH`` output (a header line with the
    addresses, then an indented line of TCP info)."""
    out = []
    for line in text.splitlines():
        if not line.startswith((" ", "\t")):
            continue
        if mptcp_only and not _MPTCP.search(line):
            continue
        rtt = _RTT.search(line)
        if rtt is None:
            continue
        rate = _RATE.search(line)
        out.append(Subflow(float(rtt.group(1)) / 1000.0, float(rate.group(1)) if rate else 0.0))
    return out


def buffer_inputs(subflows: list[Subflow]) -> tuple[float, float]:
    """(max RTT in seconds, sum of delivery rates in bit/s) -- Eq. 1's maxRTT and sum(BW)."""
    if not subflows:
        return 0.0, 0.0
    return max(s.rtt_s for s in subflows), sum(s.delivery_bps for s in subflows)
