"""The BG/WC contract between hosts and the fabric, defined once: which IP
ToS (DSCP) values mean BG and WC, and which switch queue each goes to.

- Hosts (``hostagent.plan``) mark BG subflows, UDP and everything else that
  is not a WC join with ToS 0x00 (DSCP CS0), WC join subflows with ToS 0x20
  (DSCP CS1), limit ToS-0 traffic to the guarantee, and match on the DSCP
  bits only (``TOS_MASK``: the two ECN bits are left alone).
- Switches (``apps.prio_queues``) send DSCP CS0 to queue 0 (high priority,
  also where non-IP goes) and CS1 to queue 1, rewrite any other DSCP to CS1
  and any UDP to CS0, and meter CS0 from each host port at its guarantee.
"""

TOS_BG = 0x00            # IPv4 ToS byte of BG traffic (DSCP CS0)
TOS_WC = 0x20            # IPv4 ToS byte of WC join subflows (DSCP CS1)
TOS_MASK = 0xFC          # the DSCP bits of the ToS byte (ECN excluded)
DSCP_BG = TOS_BG >> 2
DSCP_WC = TOS_WC >> 2
NFT_DSCP_BG = "cs0"      # nftables' names of the two DSCP values
NFT_DSCP_WC = "cs1"
# How far BG may run ahead of a guarantee, in one place for both enforcers:
# the host's marker (hostagent/bpf/bwf_mark.bpf.c, a token bucket this
# deep) and the ToR's meter (apps.prio_queues, the same burst at 1.05 x the
# rate). 50 ms at the rate, never below two GSO super-packets (2 x 64 KiB):
# a host releases its BG a whole super-packet at a time, at line rate, and
# a bucket smaller than one frame drops or demotes every frame of that size.
BG_BURST_S = 0.050
BG_BURST_MIN_BYTES = 2 * 65536


def bg_burst_bytes(rate_bytes_per_s: float) -> int:
    """The bucket depth (bytes) for BG at ``rate_bytes_per_s``."""
    return max(BG_BURST_MIN_BYTES, int(rate_bytes_per_s * BG_BURST_S))


def meter_burst_kbit(rate_kbps: int) -> int:
    """A ToR meter's bucket (kilobits) at ``rate_kbps``: the same depth, for
    the same reason (hosts release GSO super-packets at line rate)."""
    return bg_burst_bytes(rate_kbps * 1000 / 8) * 8 // 1000


QUEUE_BG = 0             # switch queue of BG (and of unclassified, non-IP packets)
QUEUE_WC = 1
