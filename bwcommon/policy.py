"""The paper's host-side formulas (pure).

- Fair work conservation (Eq. 7): the WC subflows of one VM together are as
  aggressive as A_l TCP flows when each of its K WC subflows increases its
  window by alpha_w = A_l^2 / K^2 per RTT (K flows, each at rate ~ alpha_w^(1/2)
  relative to Reno, sum to A_l Reno flows).
- Competition level A_l from the fairness policy: ``guarantee`` (the
  paper's default) A_l = B_g / U, U a unit bandwidth (75 Mb/s in the paper,
  scaled with the emulated link speeds); ``equal``: A_l = 1 for every VM;
  ``explicit``: a configured value (0 turns the VM's WC off).
- Receive buffer (Eq. 1): B >= beta * maxRTT * sum(BW) over the connection's
  subflows, so that the slowest subflow's reordering never stalls the
  others; beta defaults to 3.
"""

from __future__ import annotations

PAPER_UNIT_MBPS = 75.0
DEFAULT_BETA = 3.0
POLICIES = ("guarantee", "equal", "explicit")
# the WC congestion control reads alpha_w from a BPF map as a fixed-point value
ALPHA_SCALE = 1 << 10


class PolicyError(ValueError):
    pass


def competition_level(policy: str, guarantee_mbps: float, unit_mbps: float = PAPER_UNIT_MBPS,
                      explicit: float | None = None) -> float:
    if policy == "guarantee":
        if unit_mbps <= 0:
            raise PolicyError(f"unit_mbps {unit_mbps} must be positive")
        if guarantee_mbps < 0:
            raise PolicyError(f"guarantee_mbps {guarantee_mbps} must be >= 0")
        return guarantee_mbps / unit_mbps
    if policy == "equal":
        return 1.0
    if policy == "explicit":
        if explicit is None or explicit < 0:
            raise PolicyError("policy 'explicit' needs a competition level >= 0")
        return float(explicit)
    raise PolicyError(f"unknown fairness policy {policy!r}; one of {', '.join(POLICIES)}")


def wc_increase_factor(a_l: float, k: int) -> float:
    """Eq. 7: alpha_w = A_l^2 / K^2 for each of the VM's K WC subflows."""
    if a_l < 0:
        raise PolicyError(f"competition level {a_l} must be >= 0")
    if k < 1:
        raise PolicyError(f"K (WC subflows of the VM) must be >= 1, got {k}")
    return (a_l / k) ** 2


def fixed_point(a_l: float) -> int:
    """A_l as the BPF map stores it (the kernel side computes
    A_l^2 / K^2 with its live K)."""
    return int(round(a_l * ALPHA_SCALE))


def receive_buffer_bytes(max_rtt_s: float, total_bw_bps: float, beta: float = DEFAULT_BETA,
                         floor_bytes: int = 128 * 1024, cap_bytes: int = 64 * 1024 * 1024) -> int:
    """Eq. 1: B = beta * maxRTT * sum(BW) (bytes), kept within [floor, cap]."""
    if beta <= 0 or max_rtt_s < 0 or total_bw_bps < 0:
        raise PolicyError("receive buffer: beta must be > 0, RTT and bandwidth >= 0")
    need = beta * max_rtt_s * total_bw_bps / 8
    return int(min(cap_bytes, max(floor_bytes, need)))
