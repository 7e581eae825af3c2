"""MPTCP's connection level, from kernel tracepoints, for an experiment run
(option ``ktrace=1``): what ``ss`` cannot show without disturbing the run.

- ``mptcp:ack_update_msk``: every DATA_ACK a sender takes in -- the
  connection's ``snd_una`` and the right edge of the peer's window;
- ``mptcp:mptcp_sendmsg_frag``: every chunk of data handed to a subflow --
  how far the connection has sent (``snd_nxt``);
- ``mptcp:mptcp_subflow_get_send``: each subflow at each decision of the
  default scheduler (kept in the trace file for reading by hand). Its
  ``pace`` and ``ratio`` are from the socket's pacing rate, not from the
  scheduler's own estimate (``avg_pacing_rate``, updated only when it hands
  the subflow data), which decides: a subflow whose estimate lags can be
  picked although its ``ratio`` here is the larger;
- ``tcp:tcp_retransmit_skb``: every retransmission, with the subflow's
  addresses and ports -- which subflow was repairing a hole, and how often.

The events go to a private tracefs instance, so nothing else that traces is
disturbed. They stay in the kernel's ring buffer during the run and are
read after it (gzip), so the run pays only for the tracepoints themselves:
sampling ``ss`` every 0.55 s made misses rarer (issue #4's notes), so it
cannot show why they happen.

:func:`stalls` finds connection-level stalls: a sender's DATA_ACK standing
still while data is outstanding. That is a hole -- a segment lost or
waiting on one subflow -- which holds back every byte behind it, BG's
included; once the data sent past the hole reaches the peer's window
(``window_full``), nothing more can be sent on any subflow. The parsing and
the analysis are pure; :class:`KernelTrace` is the thin part that touches
tracefs.
"""

from __future__ import annotations

import gzip
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

TRACEFS = Path("/sys/kernel/tracing")
EVENTS = (("mptcp", "ack_update_msk"), ("mptcp", "mptcp_sendmsg_frag"), ("mptcp", "mptcp_subflow_get_send"),
          ("tcp", "tcp_retransmit_skb"))
MARK = "bwfabric-wall"          # trace_marker line: "<MARK> <unix time>", at start and at stop
SAME_CONN = 1 << 31             # data sequence numbers of one connection stay this close in a run


class KtraceError(RuntimeError):
    pass


class KernelTrace:
    """Record the MPTCP tracepoints into ``path`` (gzip) around a block."""

    def __init__(self, path: Path, buffer_kb: int | None = None, tracefs: Path = TRACEFS):
        # the ring buffer is per CPU: 256 MB in all (a fig12 run fills ~20 MB), at least 16 MB each
        buffer_kb = buffer_kb or max(16384, 262144 // (os.cpu_count() or 1))
        self.path, self.buffer_kb, self.tracefs = Path(path), buffer_kb, tracefs
        self.inst = tracefs / "instances" / f"bwfabric-{os.getpid()}"

    def _w(self, rel: str, value: str) -> None:
        (self.inst / rel).write_text(value)

    def __enter__(self) -> "KernelTrace":
        if self.tracefs == TRACEFS and not (self.tracefs / "instances").is_dir():
            # a fresh machine may not have it mounted: the standard place, nothing else touched
            subprocess.run(["mount", "-t", "tracefs", "nodev", str(self.tracefs)], capture_output=True)
        missing = [f"{g}:{e}" for g, e in EVENTS if not (self.tracefs / "events" / g / e).is_dir()]
        if not (self.tracefs / "instances").is_dir() or missing:
            raise KtraceError(f"ktrace needs tracefs at {self.tracefs} with the mptcp and tcp tracepoints "
                              f"(missing: {', '.join(missing) or 'tracefs'}); mount it or run with ktrace=0")
        self.inst.mkdir()
        try:
            self._w("tracing_on", "0")
            self._w("trace_clock", "mono")
            self._w("buffer_size_kb", str(self.buffer_kb))
            for g, e in EVENTS:
                self._w(f"events/{g}/{e}/enable", "1")
            self._w("tracing_on", "1")
            self._w("trace_marker", f"{MARK} {time.time():.6f}")
        except OSError:
            self.inst.rmdir()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._w("trace_marker", f"{MARK} {time.time():.6f}")
            self._w("tracing_on", "0")
            with open(self.inst / "trace", "rb") as src, gzip.open(self.path, "wb", compresslevel=3) as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
        finally:
            for g in {g for g, _ in EVENTS}:
                self._w(f"events/{g}/enable", "0")
            self.inst.rmdir()


@dataclass(frozen=True)
class Event:
    t: float            # Unix time
    cpu: int
    name: str
    f: dict[str, int | str]     # numbers as int; addresses, states ... as text


_LINE = re.compile(r"\[(\d+)\]\s+\S+\s+([\d.]+): (\w+): (.*)")
_KV = re.compile(r"(\w+)=(\S+)")


def parse(lines) -> list[Event]:
    """Trace text (``trace`` file format) -> events on the wall clock, which
    the first ``bwfabric-wall`` marker ties to the trace clock."""
    offset, raw = None, []
    for line in lines:
        m = _LINE.search(line)
        if not m:
            continue
        cpu, ts, name, rest = int(m.group(1)), float(m.group(2)), m.group(3), m.group(4)
        if name == "tracing_mark_write":
            w = re.search(rf"{MARK} ([\d.]+)", rest)
            if w and offset is None:
                offset = float(w.group(1)) - ts
            continue
        raw.append((ts, cpu, name, {k: int(v) if v.isdigit() else v for k, v in _KV.findall(rest)}))
    if raw and offset is None:
        raise KtraceError(f"no '{MARK}' marker in the trace: its times cannot be put on the wall clock")
    return [Event(ts + offset, cpu, name, f) for ts, cpu, name, f in raw]


def overwritten(path: Path) -> int:
    """Events the ring buffer lost to overwriting (its header's
    entries-in-buffer/entries-written), 0 if it kept them all."""
    with gzip.open(path, "rt", errors="replace") as fh:
        for line in fh:
            if not line.startswith("#"):
                break
            m = re.search(r"entries-in-buffer/entries-written: (\d+)/(\d+)", line)
            if m:
                return int(m.group(2)) - int(m.group(1))
    return 0


def read(path: Path) -> list[Event]:
    with gzip.open(path, "rt", errors="replace") as fh:
        return parse(fh)


@dataclass
class _Conn:
    key: int                                    # a data sequence number of the connection
    snd_nxt: int = 0
    sent: int = 0
    last_adv: tuple[float, int, int] | None = None      # (t, snd_una, window's right edge)
    stalls: list[dict] = field(default_factory=list)


def _conn(conns: list[_Conn], seq: int) -> _Conn:
    for c in conns:
        if abs(seq - c.key) < SAME_CONN:
            return c
    conns.append(_Conn(seq))
    return conns[-1]


def stalls(events: list[Event], min_s: float = 0.3, min_sent: int = 1_000_000) -> list[dict]:
    """Stalls of the connections that sent at least ``min_sent`` bytes: the
    DATA_ACK stood still for ``min_s`` or more, then moved. Each: when it
    began (Unix time), how long, the DATA_ACK's value (``snd_una``), how much
    it then jumped, the data outstanding and the peer's window at the start,
    and whether the data sent reached the window's edge during the stall
    (``window_full``: every subflow had to wait)."""
    conns: list[_Conn] = []
    for ev in sorted(events, key=lambda e: e.t):
        if ev.name == "mptcp_sendmsg_frag" and ev.f.get("data_len"):
            c = _conn(conns, ev.f["data_seq"])
            end = ev.f["data_seq"] + ev.f["data_len"]
            c.sent += ev.f["data_len"]
            c.snd_nxt = max(c.snd_nxt, end)
        elif ev.name == "ack_update_msk":
            old, new, wnd = ev.f["old_snd_una"], ev.f["new_snd_una"], ev.f["msk_wnd_end"]
            if new == old:
                continue
            c = _conn(conns, new)
            if c.last_adv is not None and ev.t - c.last_adv[0] >= min_s:
                t0, una, wnd0 = c.last_adv
                c.stalls.append({"t": round(t0, 3), "seconds": round(ev.t - t0, 3), "snd_una": una,
                                 "jump_bytes": new - old, "window_bytes": wnd0 - una,
                                 "window_full": c.snd_nxt >= wnd0 - 1500})   # sent up to the edge
            c.last_adv = (ev.t, new, wnd)
    return [s for c in conns if c.sent >= min_sent for s in c.stalls]


def owner(snd_una: int, snapshots: dict[str, list[int]]) -> str | None:
    """Which host's connection a data sequence number belongs to, given each
    host's connections' ``snd_una`` at some moment of the run (``ss -M``)."""
    best = None
    for host, seqs in snapshots.items():
        for s in seqs:
            d = abs(snd_una - s)
            if d < SAME_CONN and (best is None or d < best[0]):
                best = (d, host)
    return best[1] if best else None


def retransmits(events: list[Event], addr: str, t0: float, t1: float) -> dict[str, int]:
    """Retransmissions sent from ``addr`` in [t0, t1], per subflow
    (``sport->dst:dport``)."""
    out: dict[str, int] = {}
    for ev in events:
        if ev.name == "tcp_retransmit_skb" and ev.f.get("saddr") == addr and t0 <= ev.t <= t1:
            key = f"{ev.f.get('sport')}->{ev.f.get('daddr')}:{ev.f.get('dport')}"
            out[key] = out.get(key, 0) + 1
    return out


def report(events: list[Event], run_t0s: list[float], snapshots: list[dict[str, list[int]]],
           addrs: dict[str, str] | None = None, min_s: float = 0.3) -> list[dict]:
    """:func:`stalls` placed in their runs (``t`` from the run's start),
    attributed to their sender, with the retransmissions the sender (its
    address in ``addrs``) sent from 1 s before the stall to its end (the
    hole's segment left before the DATA_ACK stopped)."""
    out = []
    for s in stalls(events, min_s):
        run = max((i for i, t0 in enumerate(run_t0s) if t0 <= s["t"]), default=0)
        snap = snapshots[run] if run < len(snapshots) else {}
        sender = owner(s["snd_una"], snap)
        row = {"run": run, "sender": sender, **s, "t": round(s["t"] - run_t0s[run], 3) if run_t0s else s["t"]}
        if addrs and sender in addrs:
            row["retransmits"] = retransmits(events, addrs[sender], s["t"] - 1.0, s["t"] + s["seconds"])
        out.append(row)
    return out
