"""LRC's loop in the controller process: every τ_r, poll the switches' port
statistics, wait for the replies (at most half a period), step the
factors (:class:`apps.lrc.logic.LrcController`) and push every sending
host's terms over its agent session (latest value wins). Every LRC host
gets a push each round, even an empty one: its reply carries the pairs
open there, which is how the controller learns of them.

The round trip is measured per round: from the poll to the agent's reply
carrying that round's token (the ``delay`` the hosts' factors are late by),
and fed to the controller's model of the hosts.

A round that raises is logged and counted (``LoopGuard``); the loop goes on.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from apps.lrc.logic import LrcController
from bwcommon.loops import LoopGuard
from controller.network_view import NetworkView

log = logging.getLogger("bwfabric.lrc")


class LrcService:
    def __init__(self, rt, sessions, poll: Callable[[], int], replies: Callable[[], int],
                 loads: Callable[[], dict], view: NetworkView):
        self.rt, self.sessions = rt, sessions
        self.poll, self.replies, self.loads = poll, replies, loads
        cfg = rt.loaded.cfg
        self.ctrl = LrcController(view, cfg.lrc.params(), cfg.controller.routing)
        self.ctrl.configure(rt.loaded)
        self.guard = LoopGuard(log)
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="lrc", daemon=True)
        self.last_round_s: float | None = None
        self.delays: list[float] = []           # the last 100 measured delays (s)
        self.counted: dict[str, float] = {}     # host -> the last round whose reply was measured
        self.last_reports: dict[str, dict] = {}
        rt.subscribe("lrc", lambda old, new: self.ctrl.configure(new, new.cfg.lrc.params()))

    def start(self) -> "LrcService":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(5)

    def _run(self) -> None:
        while not self.stop_event.is_set():
            period = self.rt.loaded.cfg.lrc.tau_r_s
            start = time.monotonic()
            if self.rt.loaded.cfg.lrc.enabled:
                self.guard.run("lrc", self.round)
            wait = max(0.0, self.guard.backoff("lrc", period, max_s=5.0) - (time.monotonic() - start))
            self.stop_event.wait(wait)

    def round(self) -> None:
        token = time.monotonic()
        before = self.replies()
        asked = self.poll()
        deadline = token + self.rt.loaded.cfg.lrc.tau_r_s / 2
        while self.replies() - before < asked and time.monotonic() < deadline:
            time.sleep(0.002)
        reports = {}
        for host in self._lrc_hosts():
            s = self.sessions.session(host)
            rep = s.lrc_report() if s is not None else None
            if rep is None:
                continue
            sent, acked, per_vm = rep
            reports.update(per_vm)
            if sent is not None and sent > self.counted.get(host, 0.0):     # each round's reply once
                self.counted[host] = sent
                self.delays = (self.delays + [acked - sent])[-100:]
                self.ctrl.observe_delay(acked - sent)
        self.last_reports = reports
        out = self.ctrl.round(self.loads(), reports)
        for host in self._lrc_hosts():
            s = self.sessions.session(host)
            if s is not None:
                names = sorted(v.key for v in self.ctrl.vms.values() if v.host == host)
                s.push_rates({"factors": out.get(host, {})} if names == [host] else
                             {"vms": {n: out.get(n, {}) for n in names}}, token=token)
        self.last_round_s = time.monotonic() - token

    def _lrc_hosts(self) -> list[str]:
        return sorted({v.host for v in self.ctrl.vms.values()})

    def state(self) -> dict:
        """What ``GET /v1/lrc`` shows."""
        st = self.guard.stats.get("lrc")
        f = self.ctrl.factors
        return {"enabled": self.rt.loaded.cfg.lrc.enabled, "rounds": st.rounds if st else 0,
                "errors": st.errors if st else 0, "last_error": st.last_error if st else None,
                "delay_s": self.ctrl.delay_s, "feedback_delay_s": f.params.feedback_delay_s,
                "last_round_s": self.last_round_s,
                "pairs": [{"src": s, "dst": d, "weight": pp.weight, "guarantee_mbps": pp.guarantee_mbps,
                           "r_tilde_mbps": f.pair_factor((s, d)) if pp.links else None,
                           "reported": self.last_reports.get(self.ctrl.vms[s].key, {}).get(d)
                           if s in self.ctrl.vms else None}
                          for (s, d), pp in sorted(f.pairs.items())],
                "factors": [{"src": a, "dst": b, "r_mbps": r} for (a, b), r in sorted(f.r.items())]}

    def samples(self):
        st = self.guard.stats.get("lrc")
        yield "bwfabric_lrc_rounds", {}, float(st.rounds if st else 0)
        yield "bwfabric_lrc_pairs", {}, float(len(self.ctrl.factors.pairs))
        if self.ctrl.delay_s is not None:
            yield "bwfabric_lrc_delay_seconds", {}, self.ctrl.delay_s
        for (a, b), r in sorted(self.ctrl.factors.r.items()):
            yield "bwfabric_lrc_link_factor_bytes_per_second", {"src": a, "dst": b}, r * 1e6 / 8
