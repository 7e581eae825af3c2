"""Extra-subflow elimination's last step, in the host agent: bwf_mptcpd
(hostagent/bpf/bwf_coupled.bpf.c) marks a subflow that shares its
bottleneck with a sibling and enters it in the pinned map bwf_ccese; a
congestion control cannot close its own socket, so the agent destroys it
(SOCK_DESTROY through inet_diag: ``ss -K``, iproute2's), in its own
namespace, for its own addresses only (emulated hosts share one kernel and
one map). MPTCP takes a destroyed subflow as reset; the connection goes on
over the others. The in-kernel path manager does not re-create it (its
endpoint is spent for the connection).

    ip netns exec NS python -m hostagent.ese [--by-endpoint] ADDRESS [ADDRESS ...]   # a closer on its own
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
import subprocess
import sys
import time

from hostagent import bpfring
from hostagent.cc import BPFFS

log = logging.getLogger("bwfabric.ese")
MAP = "bwf_ccese"
EVENT_SIZE = 32
DRAIN_S = 0.2       # a marked subflow is destroyed once nothing it sent is unacknowledged, or after this
UNACKED_RE = re.compile(r"\bunacked:(\d+)")
NOTSENT_RE = re.compile(r"\bnotsent:(\d+)")


class EseCloser:
    """``by_endpoint``: remove a marked subflow by deleting its source
    address's in-kernel path-manager endpoint instead (MPTCP's own graceful
    removal, but of every connection's subflows from that address: for
    experiments that give each subflow an address of its own, to compare
    the two ways of closing)."""

    def __init__(self, addresses, by_endpoint: bool = False):
        self.by_endpoint = by_endpoint
        self.addresses = {int.from_bytes(ipaddress.IPv4Address(a).packed, "little") for a in addresses}
        self.map: bpfring.HashMap | None = None
        self.closed: list[dict] = []
        self.failed = 0
        self.stale = 0
        self.pending: dict[bytes, float] = {}      # key -> when first seen
        self._purge()

    def _purge(self) -> None:
        """Entries for our addresses from before this closer (a previous
        agent's, or a previous test's) name subflows that are gone, or whose
        port a new one may reuse: dropped unread."""
        m = self._open()
        for key, _ in (m.items() if m else []):
            if bpfring.ESE_KEY.unpack(key)[0] in self.addresses:
                m.delete(key)
                self.stale += 1

    def _open(self) -> bpfring.HashMap | None:
        if self.map is None and (BPFFS / MAP).exists():
            self.map = bpfring.HashMap(BPFFS / MAP, bpfring.ESE_KEY.size, EVENT_SIZE)
        return self.map

    def round(self) -> list[dict]:
        """Destroy the subflows entered for our addresses; returns them."""
        m = self._open()
        if m is None:
            return []
        done = []
        for key, value in m.items():
            saddr, *_ = bpfring.ESE_KEY.unpack(key)
            if saddr not in self.addresses:
                continue
            ev = bpfring.parse_ese(value)
            where = ["src", f"{ev.saddr}:{ev.sport}", "dst", f"{ev.daddr}:{ev.dport}"]
            # bwf_mptcpd holds a marked subflow's window at one segment, which also makes MPTCP's scheduler
            # pass it over: destroy it once nothing it sent is unacknowledged. What a destroyed subflow held
            # (unacknowledged, or queued and not sent), MPTCP must send again over the others, queued behind
            # their own data; with the receiver's buffer full of what came after, that can stall the
            # connection (upstream MPTCP has no opportunistic reinjection). Waiting for the queued data too
            # is worse: at one segment per round trip it drained in 0.06-2 s, and meanwhile the receiver
            # waits for it -- 8 subflows on one 50 Mb/s bottleneck carried 27-34 Mb/s over 3 s instead of
            # 47, and one run in five still stalled (docs/coupled.md)
            first = self.pending.setdefault(key, time.monotonic())
            info = subprocess.run(["ss", "-tniH", *where], capture_output=True, text=True).stdout
            unacked, notsent = (int(x.group(1)) if x else 0 for x in (UNACKED_RE.search(info),
                                                                     NOTSENT_RE.search(info)))
            if info.strip() and unacked > 0 and time.monotonic() - first < DRAIN_S:
                continue
            held = unacked + notsent if info.strip() else 0
            done_ok, why = _delete_endpoint(ev.saddr) if self.by_endpoint else _destroy(ev.saddr, where)
            m.delete(key)
            self.pending.pop(key, None)
            entry = {"src": f"{ev.saddr}:{ev.sport}", "dst": f"{ev.daddr}:{ev.dport}", "token": ev.token,
                     "subflow": ev.sub, "rtt_us": ev.rtt_us, "ref_rtt_us": ev.ref_rtt_us,
                     "min_rtt_us": ev.min_rtt_us, "destroyed": done_ok,
                     "held_at_close": held, "drain_s": round(time.monotonic() - first, 3)}
            if not entry["destroyed"]:
                self.failed += 1
                log.warning("ESE: subflow %s -> %s not destroyed: %s", entry["src"], entry["dst"], why)
            else:
                log.info("ESE closed subflow %s -> %s (rtt %d us, reference %d us, base %d us)", entry["src"],
                         entry["dst"], ev.rtt_us, ev.ref_rtt_us, ev.min_rtt_us)
            self.closed.append(entry)
            done.append(entry)
        return done


def _destroy(addr: str, where: list[str]) -> tuple[bool, str]:
    """SOCK_DESTROY of the subflow (``ss -K``, which names the sockets it killed)."""
    res = subprocess.run(["ss", "-K", "-t", *where], capture_output=True, text=True)
    if res.returncode == 0 and addr in res.stdout:
        return True, ""
    return False, (res.stderr or res.stdout).strip()[-200:] or "no such socket (closed already)"


def _delete_endpoint(addr: str) -> tuple[bool, str]:
    """``ip mptcp endpoint delete`` of the endpoint holding ``addr``."""
    show = subprocess.run(["ip", "mptcp", "endpoint", "show"], capture_output=True, text=True).stdout
    m = re.search(rf"^{re.escape(addr)} id (\d+)", show, re.M)
    if not m:
        return False, f"no endpoint for {addr}"
    res = subprocess.run(["ip", "mptcp", "endpoint", "delete", "id", m.group(1)], capture_output=True, text=True)
    return res.returncode == 0, res.stderr.strip()[-200:]


def main(argv=None) -> None:
    args = list(argv if argv is not None else sys.argv[1:])
    by_endpoint = "--by-endpoint" in args
    addrs = [a for a in args if a != "--by-endpoint"]
    if not addrs:
        print("usage: python -m hostagent.ese [--by-endpoint] ADDRESS [ADDRESS ...]", file=sys.stderr)
        sys.exit(2)
    from bwcommon.loops import LoopGuard

    closer = EseCloser(addrs, by_endpoint)
    guard = LoopGuard(log)          # a failed round is logged and counted; the next one runs

    def one_round() -> None:
        for entry in closer.round():
            print(json.dumps(entry), flush=True)

    while True:
        time.sleep(guard.backoff("ese", 0.05, max_s=5.0))
        guard.run("ese", one_round)


if __name__ == "__main__":
    main()
