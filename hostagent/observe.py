"""What the agent reads back from the kernel (pure parsing): live TCP/MPTCP
subflow RTTs and rates from ``ss -tinH``, for Eq. 1's buffer.

A receiver's own ``rtt`` only times its ACK-only direction; its
``rcv_rtt`` (the receiver's estimate of the sender's round trip, queueing
included) is what its buffer must cover, so a subflow's RTT is the larger
of the two; likewise its rate is the larger of ``delivery_rate`` (sending)
and ``rcv_space`` per ``rcv_rtt`` (receiving)."""

from __future__ import annotations

import collections
import re
from dataclasses import dataclass

from bwcommon.policy import receive_buffer_bytes

_RTT = re.compile(r"\brtt:([\d.]+)/")
_RATE = re.compile(r"\bdelivery_rate (\d+)bps")
_RCV_RTT = re.compile(r"\brcv_rtt:([\d.]+)")
_RCV_SPACE = re.compile(r"\brcv_space:(\d+)")
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
        rtt_s = float(rtt.group(1)) / 1000.0
        rate = _RATE.search(line)
        bps = float(rate.group(1)) if rate else 0.0
        rcv_rtt, rcv_space = _RCV_RTT.search(line), _RCV_SPACE.search(line)
        if rcv_rtt and float(rcv_rtt.group(1)) > 0:
            rcv_rtt_s = float(rcv_rtt.group(1)) / 1000.0
            rtt_s = max(rtt_s, rcv_rtt_s)
            if rcv_space:
                bps = max(bps, int(rcv_space.group(1)) * 8 / rcv_rtt_s)
        out.append(Subflow(rtt_s, bps))
    return out


def buffer_inputs(subflows: list[Subflow]) -> tuple[float, float]:
    """(max RTT in seconds, sum of rates in bit/s) -- Eq. 1's maxRTT and the measured sum(BW)."""
    if not subflows:
        return 0.0, 0.0
    return max(s.rtt_s for s in subflows), sum(s.delivery_bps for s in subflows)


RTT_WINDOW_S = 30.0
CHANGE = 0.2


class BufferSizer:
    """Eq. 1, B = beta * maxRTT * sum(BW), from a stream of live samples.

    - maxRTT: the largest subflow RTT seen in the last ``window_s`` -- a
      buffer sized in a lull would stall the next busy period (sockets take
      tcp_wmem's size when they open);
    - sum(BW): the NIC rate. Measured rates are capped by the very buffer
      being sized (a small buffer slows the subflows, which then ask for a
      smaller one), and a receiver's estimates overshoot; the NIC is what a
      VM's subflows can carry together.

    :meth:`update` returns the new B, or None while it is within ``change``
    of the one in force (or no subflow is live)."""

    def __init__(self, window_s: float = RTT_WINDOW_S, change: float = CHANGE):
        self.window_s, self.change = window_s, change
        self.samples: collections.deque[tuple[float, float]] = collections.deque()

    def max_rtt(self) -> float:
        return max((r for _, r in self.samples), default=0.0)

    def update(self, now: float, rtt_s: float, nic_bps: float, beta: float, in_force: int | None,
               floor_rtt_s: float = 0.0) -> int | None:
        """``floor_rtt_s``: maxRTT is never taken below it (the configured
        rtt_hint_ms: a WC subflow's RTT is its queue's delay, which the first
        seconds' samples -- before the WC queues have built -- understate;
        sized from them, buffers held connections back in exactly those
        seconds: fig12 BG 0.83-0.93 of its guarantee in its first phase)."""
        if rtt_s > 0:
            self.samples.append((now, rtt_s))
        while self.samples and self.samples[0][0] < now - self.window_s:
            self.samples.popleft()
        if not self.samples:
            return None
        want = receive_buffer_bytes(max(self.max_rtt(), floor_rtt_s), nic_bps, beta)
        if in_force is not None and abs(want - in_force) <= self.change * in_force:
            return None
        return want


# each field's number is the pattern's first group; absent fields read 0
_FIELDS = {**{name: re.compile(rf"\b{name}:(\d+(?:\.\d+)?)") for name in
              ("cwnd", "rtt", "ssthresh", "rto", "backoff", "unacked", "lost", "lastack", "lastsnd", "notsent",
               "snd_wnd", "rcv_ssthresh", "rcv_space", "bytes_acked", "bytes_received")},
           "pacing_rate": re.compile(r"\bpacing_rate (\d+)bps"), "delivery_rate": _RATE,
           # % of the subflow's busy time so far
           **{name: re.compile(rf"\b{name}:\d+ms\(([\d.]+)%\)") for name in ("rwnd_limited", "sndbuf_limited")}}
_RETRANS = re.compile(r"\bretrans:\d+/(\d+)")
_FLAGS = re.compile(r"\btcp-ulp-mptcp flags:(\w+)")


def subflow_states(text: str) -> list[dict]:
    """Per MPTCP subflow of ``ss -tinH`` output, what tells a stalled one:
    its role (``bg``: the connection's first subflow, flags ``M``; ``wc``: a
    join, flags ``J``), local and remote port, Send-Q, cwnd, rto (ms),
    backoff (consecutive RTOs), unacked and lost segments, total
    retransmissions, ms since its last ACK and last send, the peer's window
    and its own (snd_wnd, rcv_ssthresh, rcv_space), bytes acked and
    received, pacing and delivery rates (bit/s), and the share of its busy
    time limited by the receiver's window and by its send buffer."""
    out = []
    header = None
    for line in text.splitlines():
        if not line.startswith((" ", "\t")):
            header = line.split()
            continue
        flags = _FLAGS.search(line)
        if flags is None or header is None or len(header) < 5:
            continue
        # header: State Recv-Q Send-Q Local:Port Peer:Port
        st = {"role": "bg" if "M" in flags.group(1) else "wc" if "J" in flags.group(1) else "?",
              "local": header[3], "peer": header[4], "send_q": int(header[2]) if header[2].isdigit() else None}
        for name, rx in _FIELDS.items():
            m = rx.search(line)
            st[name] = float(m.group(1)) if m else 0.0
        m = _RETRANS.search(line)
        st["retrans"] = int(m.group(1)) if m else 0
        out.append(st)
    return out


_MSK_SEQ = {name: re.compile(rf"\b{name}:([0-9a-f]+)") for name in ("write_seq", "snd_una", "rcv_nxt")}


def msk_queues(text: str) -> list[dict]:
    """Per MPTCP socket of ``ss -MinH`` output: its addresses, its
    connection-level Recv-Q and Send-Q (bytes), and -- from its info line,
    when there is one -- its data-level sequence numbers (write_seq,
    snd_una, rcv_nxt, as integers)."""
    out: list[dict] = []
    for line in text.splitlines():
        f = line.split()
        if line.startswith((" ", "\t")):
            if out:
                for name, rx in _MSK_SEQ.items():
                    m = rx.search(line)
                    if m:
                        out[-1][name] = int(m.group(1), 16)
        elif len(f) >= 5 and f[1].isdigit() and f[2].isdigit():
            out.append({"local": f[3], "peer": f[4], "recv_q": int(f[1]), "send_q": int(f[2])})
    return out

