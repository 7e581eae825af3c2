"""The event loop: connections arrive, are split into subflows by the
sharing policy, routed by the router (product code), share the links
(:mod:`.sharing`) and complete; the controller's events (polls,
decisions, entries taking effect) happen at their times.

Time advances from one allocation to the next. After an allocation at t
the next one is at the earliest of: the next arrival, the next
completion, the controller's next event -- but never before t + window
(``window_s``): connections arriving inside the window are allocated at t
and counted from their own arrival time (they neither wait nor start
early), connections completing inside it end at their own completion time
and free their capacity at the window's end. With ``window_s`` = 0 every
event is exact (one allocation per event).

Outputs: per connection its completion time (``fct_s``, NaN if it did not
end before ``end_s``), and the bits each endpoint received in every slot
(``slot_s``: 1 s by default, the emulator's receiver counters' resolution).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from experiments.flowsim.net import MAX_HOPS, SimError, SimNet
from experiments.flowsim.routing import EcmpRouter, counter_match, flow_hash
from experiments.flowsim.sharing import BG, SHARINGS, SUBFLOWS, allocate, pair_terms

LOCAL_FACTOR = 10.0       # two VMs of one host: a memory copy, ten times the NIC (no fabric link)
TCP = 6
SPORT_BASE = 10_000
DPORT = 7000              # experiments.traffic.FLOWGEN_PORT
MAX_EVENTS_AT_ONCE = 100  # a router with more events due at one instant is stuck


@dataclass
class Flows:
    """Connections, sorted by start: endpoint indices, start times (s),
    sizes (bytes)."""
    src: np.ndarray
    dst: np.ndarray
    start_s: np.ndarray
    size_bytes: np.ndarray

    def __post_init__(self) -> None:
        n = self.src.size
        for name in ("dst", "start_s", "size_bytes"):
            if getattr(self, name).size != n:
                raise SimError(f"flows: {name} has {getattr(self, name).size} entries, src {n}")
        if n and (not np.all(np.isfinite(self.start_s)) or np.any(self.start_s < 0)):
            raise SimError("flows: start times must be finite and >= 0")
        if n and (not np.all(np.isfinite(self.size_bytes)) or np.any(self.size_bytes <= 0)):
            raise SimError("flows: sizes must be finite and > 0 bytes")
        if n and np.any(np.diff(self.start_s) < 0):
            raise SimError("flows: start times must not decrease")
        if n and np.any(self.src == self.dst):
            raise SimError("flows: a connection needs two different endpoints")

    @classmethod
    def from_specs(cls, net: SimNet, specs) -> "Flows":
        """experiments.workloads.FlowSpec list (the emulator's input)."""
        specs = sorted(specs, key=lambda f: f.start_s)
        return cls(np.array([net.endpoint(f.src) for f in specs], dtype=np.int64),
                   np.array([net.endpoint(f.dst) for f in specs], dtype=np.int64),
                   np.array([f.start_s for f in specs], dtype=float),
                   np.array([f.size for f in specs], dtype=float))


def _check_batch(src, dst, start, size, t: float, n_ep: int) -> None:
    """A source's connections, refused by name before any is added."""
    src, dst, start, size = map(np.asarray, (src, dst, start, size))
    if np.any((src < 0) | (src >= n_ep) | (dst < 0) | (dst >= n_ep)):
        raise SimError(f"flows: an endpoint index outside the fabric's {n_ep} endpoints")
    if np.any(src == dst):
        raise SimError("flows: a connection needs two different endpoints")
    if not np.all(np.isfinite(start)) or np.any(start < t - 1e-9):
        raise SimError(f"flows: a start time that is not finite or before now ({t!r} s)")
    if not np.all(np.isfinite(size)) or not np.all(size > 0):
        raise SimError("flows: sizes must be finite and > 0 bytes")


class StaticSource:
    """Connections known in advance (a ``Flows``), handed over by start."""

    def __init__(self, flows: Flows):
        self.flows = flows
        self.i = 0

    def next_start(self) -> float:
        return float(self.flows.start_s[self.i]) if self.i < self.flows.src.size else math.inf

    def take(self, until: float, inclusive: bool):
        f = self.flows
        hi = int(np.searchsorted(f.start_s, until, side="right" if inclusive else "left"))
        out = (f.src[self.i:hi], f.dst[self.i:hi], f.start_s[self.i:hi], f.size_bytes[self.i:hi])
        self.i = max(self.i, hi)
        return out

    def completed(self, gids: np.ndarray, times: np.ndarray, now: float) -> None:
        """Connections ``gids`` ended at ``times`` (a job source starts what
        waited for them, from ``now``)."""

    def exhausted(self) -> bool:
        return self.i >= self.flows.src.size


class _Store:
    """Every connection handed over so far, by global id (grows)."""

    def __init__(self, capacity: int = 1024):
        self.n = 0
        self.src = np.zeros(capacity, dtype=np.int64)
        self.dst = np.zeros(capacity, dtype=np.int64)
        self.start = np.zeros(capacity)
        self.size = np.zeros(capacity)
        self.fct = np.full(capacity, np.nan)

    def add(self, src, dst, start, size) -> np.ndarray:
        k = len(src)
        if self.n + k > self.src.size:
            cap = max(2 * self.src.size, self.n + k)
            for name, fill in (("src", 0), ("dst", 0), ("start", 0.0), ("size", 0.0), ("fct", np.nan)):
                old = getattr(self, name)
                new = np.full(cap, fill, dtype=old.dtype)
                new[:self.n] = old[:self.n]
                setattr(self, name, new)
        sl = slice(self.n, self.n + k)
        self.src[sl], self.dst[sl], self.start[sl], self.size[sl] = src, dst, start, size
        self.n += k
        return np.arange(sl.start, sl.stop)


@dataclass
class Result:
    fct_s: np.ndarray                  # per connection (NaN: not done by end_s)
    rx_bits: np.ndarray                # [slot, endpoint]
    allocations: int
    wall_s: float
    end_s: float
    decisions: list = field(default_factory=list)
    events: int = 0                    # arrivals + completions + controller events handled
    slot_s: float = 1.0                # rx_bits' resolution

    def aggregate_bps(self, window: tuple[float, float]) -> float:
        """Bits received per second over the slots covering ``window``
        (whole slots: a window between slot edges is widened to them)."""
        a, b = int(math.floor(window[0] / self.slot_s + 1e-9)), int(math.ceil(window[1] / self.slot_s - 1e-9))
        if not 0 <= a < b <= self.rx_bits.shape[0]:
            raise SimError(f"window {window}: whole {self.slot_s:g} s slots within the run's "
                           f"{self.rx_bits.shape[0]} slots")
        return float(self.rx_bits[a:b].sum()) / ((b - a) * self.slot_s)


class Engine:
    def __init__(self, net: SimNet, router: EcmpRouter, sharing: str = "fair", window_s: float = 0.0,
                 guarantee_bps: np.ndarray | None = None, vm_weight: np.ndarray | None = None,
                 port_seed: int = 0, wc_per_vm: bool = False, slot_s: float = 1.0):
        """``port_seed`` shifts every connection's source ports: another
        draw of ECMP's hash (the emulator's ephemeral ports are random).
        ``wc_per_vm``: the WC class shares by the agents' WC policy -- each
        sending VM's WC subflows together weigh its ``vm_weight`` (its A_l:
        the declared competition level), however many connections it opens
        -- instead of one weight per subflow (TCP's share)."""
        if sharing not in SHARINGS:
            raise SimError(f"sharing {sharing!r}: known are {', '.join(SHARINGS)}")
        if not (isinstance(slot_s, (int, float)) and math.isfinite(slot_s) and 1e-3 <= slot_s <= 60):
            raise SimError(f"slot_s {slot_s!r}: the receive counters' resolution, seconds in [0.001, 60]")
        self.slot_s = float(slot_s)
        if not (isinstance(window_s, (int, float)) and math.isfinite(window_s) and 0 <= window_s <= 1):
            raise SimError(f"window_s {window_s!r}: must be a finite number of seconds in [0, 1]")
        n_ep = len(net.endpoints)
        needs_b = sharing in ("reservation", "bgwc", "lrc")
        if needs_b and guarantee_bps is None:
            raise SimError(f"sharing {sharing!r} needs every endpoint's guarantee")
        self.guarantee = np.zeros(n_ep) if guarantee_bps is None else np.asarray(guarantee_bps, float)
        self.vm_weight = np.ones(n_ep) if vm_weight is None else np.asarray(vm_weight, float)
        for name, arr in (("guarantee_bps", self.guarantee), ("vm_weight", self.vm_weight)):
            if arr.shape != (n_ep,) or not np.all(np.isfinite(arr)) or np.any(arr < 0):
                raise SimError(f"{name}: one finite value >= 0 per endpoint ({n_ep})")
        if np.any(self.vm_weight <= 0):
            raise SimError("vm_weight: every weight must be > 0")
        self.net, self.router, self.sharing, self.window_s = net, router, sharing, float(window_s)
        if not isinstance(port_seed, int) or isinstance(port_seed, bool) or not 0 <= port_seed < 2**31:
            raise SimError(f"port_seed {port_seed!r}: an integer in [0, 2^31)")
        self.port_seed = port_seed
        self.wc_per_vm = bool(wc_per_vm)
        self.classes = SUBFLOWS[sharing]
        host_names = net.view.hosts
        self._host_tor_port = [(net.tor_of[h], net.view.port(net.tor_of[h], h)) for h in host_names]
        self._nic = np.array([net.nic_bps(h) for h in host_names])

    # ---- subflows ----
    def _sport(self, conn: int, k: int) -> int:
        """Subflow k of connection ``conn``: its source port (its 5-tuple's
        only free field; one per subflow, never 0)."""
        return SPORT_BASE + (2 * conn + 2 * self.port_seed * 7919) % 50_000 + k

    def _key(self, ep_s: int, ep_d: int, sport: int) -> tuple:
        e = self.net.endpoints
        return (e[ep_s].ip, e[ep_d].ip, TCP, sport, DPORT)

    def _route(self, key: tuple, h: int, ep_s: int, ep_d: int) -> tuple[np.ndarray, int, bool]:
        """(padded link indices, hops, reachable) of one subflow now."""
        e = self.net.endpoints
        src, dst = e[ep_s].host, e[ep_d].host
        row = np.full(MAX_HOPS, -1, dtype=np.int64)
        if src == dst:
            return row, 0, True
        path = self.router.path(key, h, src, dst)
        if path is None:
            return row, 0, False
        links = self.net.path_links(path)
        if len(links) > MAX_HOPS:
            raise SimError(f"path {path} longer than {MAX_HOPS} links")
        row[:len(links)] = links
        return row, len(links), True

    # ---- the loop --------------------------------------------------------------------------
    def run(self, flows, end_s: float, progress=None) -> Result:
        """``flows``: a ``Flows`` (known in advance) or a source (``next_start``,
        ``take``, ``completed``, ``exhausted``: :class:`StaticSource`'s
        methods) that may start connections as others end."""
        if not (isinstance(end_s, (int, float)) and math.isfinite(end_s) and end_s > 0):
            raise SimError(f"end_s {end_s!r}: must be a finite number of seconds > 0")
        n_ep = len(self.net.endpoints)
        source = StaticSource(flows) if isinstance(flows, Flows) else flows
        wall0 = time.perf_counter()
        net, router, W = self.net, self.router, self.window_s
        store = self.store = _Store()
        n_slots = int(math.ceil(end_s / self.slot_s)) + 1
        rx = np.zeros((n_slots, n_ep))
        ncls = len(self.classes)
        # active connections
        a_gid = np.zeros(0, dtype=np.int64)
        a_left = np.zeros(0)
        # active subflows
        s_conn = np.zeros(0, dtype=np.int64)        # connection gid
        s_cls = np.zeros(0, dtype=np.int64)
        s_links = np.zeros((0, MAX_HOPS), dtype=np.int64)
        s_hops = np.zeros(0, dtype=np.int64)
        s_ok = np.zeros(0, dtype=bool)
        s_sent = np.zeros(0)                          # bits sent so far (the ToR's counter)
        s_cap = np.zeros(0)
        t = 0.0
        allocations = 0
        events = 0
        due_now = 0                                   # controller events run at this same time so far
        hosts_of = net.ep_host

        def keys_of(conn, cls):
            return [self._key(int(store.src[c]), int(store.dst[c]), self._sport(int(c), int(k)))
                    for c, k in zip(conn, cls)]

        def counters():
            by_tor: dict[str, list] = {}
            e = net.endpoints
            for c, k, sent in zip(s_conn.tolist(), s_cls.tolist(), s_sent.tolist()):
                ep_s, ep_d = int(store.src[c]), int(store.dst[c])
                tor, port = self._host_tor_port[hosts_of[ep_s]]
                sport = self._sport(c, k)
                by_tor.setdefault(tor, []).append((counter_match(port, e[ep_s].ip, e[ep_d].ip, sport, DPORT),
                                                   int(sent / 8)))
            return by_tor

        def route(c, key):
            h = flow_hash(int(net.ip_int[store.src[c]]), int(net.ip_int[store.dst[c]]), TCP, key[3], DPORT)
            return self._route(key, h, int(store.src[c]), int(store.dst[c]))

        while True:
            # arrivals inside this window: their subflows, routed now
            src, dst, st, sz = source.take(t + W, inclusive=W == 0)
            if len(src):
                _check_batch(src, dst, st, sz, t, n_ep)
                new = store.add(src, dst, st, sz)
                events += new.size
                a_gid = np.concatenate([a_gid, new])
                a_left = np.concatenate([a_left, store.size[new] * 8.0])
                conn = np.repeat(new, ncls)
                cls = np.tile(np.array(self.classes, dtype=np.int64), new.size)
                rows = np.full((conn.size, MAX_HOPS), -1, dtype=np.int64)
                hops = np.zeros(conn.size, dtype=np.int64)
                ok = np.ones(conn.size, dtype=bool)
                caps = np.full(conn.size, np.inf)
                for j, key in enumerate(keys_of(conn, cls)):
                    rows[j], hops[j], ok[j] = route(int(conn[j]), key)
                    caps[j] = router.cap(key)
                s_conn = np.concatenate([s_conn, conn])
                s_cls = np.concatenate([s_cls, cls])
                s_links = np.concatenate([s_links, rows])
                s_hops = np.concatenate([s_hops, hops])
                s_ok = np.concatenate([s_ok, ok])
                s_sent = np.concatenate([s_sent, np.zeros(conn.size)])
                s_cap = np.concatenate([s_cap, caps])
            # the controller's events due now
            # (due: at or before t exactly -- with a tolerance an event a hair after t would be "due" here
            # and not due to the router, and the loop would spin on it)
            if router.controller and router.next_event() <= t:
                events += 1
                if router.on_event(t, counters):
                    for j, key in enumerate(keys_of(s_conn, s_cls)):
                        s_links[j], s_hops[j], s_ok[j] = route(int(s_conn[j]), key)
                        s_cap[j] = router.cap(key)
                if router.next_event() <= t:
                    due_now += 1
                    if due_now > MAX_EVENTS_AT_ONCE:
                        raise SimError(f"router: events still due after {MAX_EVENTS_AT_ONCE} at {t!r} s")
                    continue                  # another event due at once (a poll right after a decision)
            due_now = 0
            if a_gid.size == 0 and source.exhausted():
                break
            # the allocation
            pos = np.searchsorted(a_gid, s_conn)          # subflow -> its connection's row
            rate = self._rates(store.src[s_conn], store.dst[s_conn], s_cls, s_links, s_hops, s_cap)
            local = s_ok & (s_hops == 0)
            if local.any():
                rate[local] = self._nic[hosts_of[store.src[s_conn[local]]]] * LOCAL_FACTOR / ncls
            rate[~s_ok] = 0.0
            allocations += 1
            c_rate = np.bincount(pos, weights=rate, minlength=a_gid.size)
            begin = np.maximum(t, store.start[a_gid])
            with np.errstate(divide="ignore"):
                t_c = np.where(c_rate > 0, begin + a_left / np.where(c_rate > 0, c_rate, 1.0), np.inf)
            t_arr = source.next_start()
            t_ctl = router.next_event() if router.controller else math.inf
            t_next = min(t_arr, float(t_c.min()) if t_c.size else math.inf, t_ctl, end_s)
            t_next = min(max(t_next, t + W), end_s)
            stop = np.minimum(t_c, t_next)
            dt = np.maximum(stop - begin, 0.0)
            self._bin(rx, begin / self.slot_s, stop / self.slot_s, c_rate * self.slot_s, store.dst[a_gid])
            s_sent += rate * dt[pos]
            done = t_c <= t_next
            events += int(done.sum())
            gone = a_gid[done]
            store.fct[gone] = t_c[done] - store.start[gone]
            a_left = a_left - c_rate * dt
            if gone.size:
                keep = ~done
                a_gid, a_left = a_gid[keep], a_left[keep]
                sk = ~np.isin(s_conn, gone)
                s_conn, s_cls, s_links, s_hops = s_conn[sk], s_cls[sk], s_links[sk], s_hops[sk]
                s_ok, s_sent, s_cap = s_ok[sk], s_sent[sk], s_cap[sk]
                source.completed(gone, t_c[done], t_next)
            t = t_next
            if progress is not None:
                progress(t)
            if t >= end_s:
                break
        return Result(store.fct[:store.n].copy(), rx, allocations, time.perf_counter() - wall0, end_s,
                      list(getattr(router, "decisions", [])), events, self.slot_s)

    def _rates(self, src, dst, s_cls, s_links, s_hops, s_cap) -> np.ndarray:
        net = self.net
        weight = None
        if self.wc_per_vm:
            wc = s_cls != BG
            n_wc = np.bincount(src[wc], minlength=self.vm_weight.size)
            weight = self.vm_weight[src] / np.maximum(n_wc[src], 1)
        if self.sharing in ("fair", "wc-only"):
            return allocate(s_links, s_hops, s_cls, s_cap, net.capacity, weight=weight)
        inv, w_i, b_i = pair_terms(src, dst, self.guarantee, self.vm_weight)
        if self.sharing == "lrc":
            per_pair = np.bincount(inv, minlength=b_i.size)           # the pair's connections split its terms
            return allocate(s_links, s_hops, s_cls, s_cap, net.capacity,
                            weight=w_i[inv] / per_pair[inv], floor=b_i[inv] / per_pair[inv])
        return allocate(s_links, s_hops, s_cls, s_cap, net.capacity, pair=inv, pair_cap=b_i, weight=weight)

    @staticmethod
    def _bin(rx: np.ndarray, begin: np.ndarray, stop: np.ndarray, rate: np.ndarray, dst: np.ndarray) -> None:
        """Adds each connection's bits received in [begin, stop) to its
        destination's slots (times in slots, rates in bits per slot)."""
        if begin.size == 0:
            return
        lo, top = int(math.floor(begin.min())), int(math.floor(min(stop.max(), rx.shape[0] - 1e-9)))
        for s in range(max(lo, 0), min(top, rx.shape[0] - 1) + 1):
            part = np.clip(np.minimum(stop, s + 1) - np.maximum(begin, s), 0.0, None) * rate
            np.add.at(rx[s], dst, part)
