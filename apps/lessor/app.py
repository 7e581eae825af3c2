"""os-ken/Ryu app: LESSOR (a shim over :class:`apps.lessor.logic.LessorLogic`).

Settings come from the configuration's ``lessor`` section (polling, epsilon,
long-flow threshold); ``controller.state_file`` is where the app writes its
state (JSON) after every polling decision: polling period and its history,
controller CPU, long flows, installed paths, lambda.
"""

from __future__ import annotations

import json
import math
import struct
import threading
import time
from pathlib import Path

import psutil

from apps.lessor.bg import BgPolicy
from apps.lessor.logic import LessorLogic
from apps.lessor.pmpt import warm_up
from controller import api, ofmsg, runtime
from controller.app_base import ForwardingApp
from controller.sdn import MAIN_DISPATCHER, hub, ofp_event, set_ev_cls

class LessorApp(ForwardingApp):
    LOGIC = LessorLogic

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.poll_stop = threading.Event()
        settings = self.config.cfg.lessor
        self.lessor = self.logic = self.LOGIC(self.view, settings.polling.polling_config(), settings.epsilon,
                                              long_flow_bytes=settings.long_flow_bytes)
        self.lessor.set_bg(bg_policy(self.config))     # no switch connected yet: nothing to send
        self.lessor.fair_receivers = fair_receivers(self.config)
        self._log_bg_routes()
        self.logger.info("PMPT kernels ready in %.2f s", warm_up(self.lessor.paths))
        self.state_file = self.config.cfg.controller.state_file
        if runtime.current() is not None:
            runtime.current().subscribe("lessor", self.config_changed)
        api.PROVIDERS["flows"] = self.flows
        self.process = psutil.Process()
        self.process.cpu_percent(None)  # after the warm-up: Algorithm 1 must not see the compilation
        self.packet_ins = 0
        self.last_rtt: float | None = None
        self.cpu_log: list[tuple[float, float, float]] = []   # (t, cpu fraction, period)
        self.allocation_log: list[tuple[float, int]] = []      # (t, installed flows moved)
        self.t0 = time.monotonic()
        self.t0_wall = time.time()  # cpu_log times are seconds after this epoch
        self.decide_at: float | None = None
        self.poller = None
        self.polls = 0                      # polls sent (at least one ToR connected)

    def flows(self) -> list[dict]:
        """Long flows, their predicted rates and placed paths (GET /v1/flows)."""
        with self.lock:
            return [{"flow": list(s.key), "rate_mbps": None if s.predicted is None else s.predicted / 1e6,
                     "bytes": s.bytes, "path": list(self.lessor.installed[s.key].path)
                     if s.key in self.lessor.installed else None} for s in self.lessor.table.long_flows()]

    def samples(self):
        yield from super().samples()
        with self.lock:
            alloc = self.lessor.last_allocation
            yield "bwfabric_polling_period_seconds", {}, self.lessor.polling.period_s
            if self.cpu_log:
                yield "bwfabric_controller_cpu_ratio", {}, self.cpu_log[-1][1]
            yield "bwfabric_pmpt_runs", {}, self.lessor.allocations
            yield "bwfabric_packet_ins", {}, self.packet_ins
            yield "bwfabric_bg_routes_vms", {}, len(self.lessor.bg_routes.up)
            yield "bwfabric_bg_routes_links_over_mu", {}, len(self.lessor.bg_routes.over)
            yield "bwfabric_policed_flows", {}, len(self.lessor.policed)
            if alloc is not None:
                yield "bwfabric_pmpt_lambda", {}, alloc.lam
                yield "bwfabric_pmpt_duration_seconds", {}, alloc.seconds
                yield "bwfabric_pmpt_flows_placed", {}, len(alloc.flow_path)

    def config_changed(self, old, new):
        """LESSOR's settings follow a reload: epsilon and the long-flow
        threshold at once, the polling bounds from the next decision on.
        The new BG routes are sent under the lock they were computed under:
        a port event handled meanwhile would otherwise send its newer routes
        first and have them reverted by these."""
        with self.lock:
            self.lessor.reconfigure(new.cfg.lessor.polling.polling_config(), new.cfg.lessor.epsilon,
                                    new.cfg.lessor.long_flow_bytes)
            updates = self.lessor.set_bg(bg_policy(new))
            self.lessor.fair_receivers = fair_receivers(new)    # the next round releases or holds
            self._log_bg_routes()
            for sw, msgs in updates.items():
                if sw in self.datapaths:
                    self.send(sw, msgs)

    def _log_bg_routes(self):
        routes = self.lessor.bg_routes
        if routes.over:
            self.logger.warning("default BG routes: the packing leaves %d links above mu x C (%s): their "
                                "guarantees rely on LESSOR's placement", len(routes.over),
                                ", ".join(f"{u}->{v}" for u, v in routes.over))
        elif routes.up:
            self.logger.info("default BG routes: %d VMs, every link within mu x C", len(routes.up))

    def start(self):
        thread = super().start()
        self.poller = hub.spawn(self._poll_loop)
        return thread

    # ---- events (switch connect, ports, disconnect: ForwardingApp) -------------------
    def flow_stats_reply(self, ev):
        """PRE's poll of a ToR's counters (ForwardingApp hands over every
        flow-stats reply that is not a switch's read-back)."""
        switch = self._registered(ev.msg.datapath)
        if switch is None:
            return
        entries = [(dict(s.match.items()), s.byte_count) for s in ev.msg.body]
        decide_at = self.lessor.flow_stats(switch, entries, time.monotonic())
        self.decide_at = decide_at if self.decide_at is None else min(self.decide_at, decide_at)

    @set_ev_cls(ofp_event.EventOFPEchoReply, MAIN_DISPATCHER)
    def _echo_reply(self, ev):
        self.handle("echo_reply", self._echo_reply_round, ev)

    def _echo_reply_round(self, ev):
        rtt = echo_rtt(ev.msg.data, time.monotonic())
        if rtt is None:
            self.refuse("echo_reply", "echo reply with a payload that is not a sane send time: ignored")
            return
        self.last_rtt = rtt

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    def _packet_in(self, ev):
        self.packet_ins += 1  # nothing should ever come here: counted to prove it

    # ---- the polling loop (a green thread) -----------------------------------------------
    def _poll_loop(self):
        """Returns only once ``poll_stop`` is set (a test or harness ending
        its app): every round runs through the loop guard, so an exception
        in one round is logged, counted and followed by the next round
        (after a back-off while rounds keep failing)."""
        next_poll = time.monotonic() + 1.0
        while not self.poll_stop.is_set():
            hub.sleep(max(0.0, next_poll - time.monotonic()))
            ok, result = self.guard.run("poll", self._poll_round)
            if ok:
                next_poll = result
            else:
                self.decide_at = None
                next_poll = time.monotonic() + self.guard.backoff("poll", max(1.0, self.lessor.polling.period_s))
            self.guard.run("state", self._write_state)

    def _poll_round(self) -> float:
        """One poll, its decision and the allocation; returns the next poll's time."""
        if not self.leading():         # a standby measures nothing and places nothing (controller.ha)
            return time.monotonic() + 0.5
        with self.lock:
            self.decide_at = None
            now = time.monotonic()
            requests = {sw: msgs for sw, msgs in self.lessor.poll(now).items() if sw in self.datapaths}
            if not requests:  # no ToR connected yet: nothing to measure, look again soon
                return now + 0.5
            self.polls += 1
        for sw, msgs in requests.items():
            self.send(sw, [*msgs, ofmsg.EchoRequest(struct.pack("!d", time.monotonic()))])
        deadline = now + max(1.0, self.lessor.polling.period_s)
        while self.decide_at is None and time.monotonic() < deadline:
            hub.sleep(0.05)
        if self.decide_at is not None:
            hub.sleep(max(0.0, min(self.decide_at, deadline + self.lessor.polling.period_s) - time.monotonic()))
        cpu = self.process.cpu_percent(None) / 100.0
        with self.lock:
            rtt, self.last_rtt = self.last_rtt, None
            next_poll = self.lessor.decide(time.monotonic(), cpu, rtt)  # compares rtt with earlier ones
            if rtt is not None:
                self.lessor.polling.record_rtt(rtt)
            self.cpu_log.append((time.monotonic() - self.t0, cpu, self.lessor.polling.period_s))
            del self.cpu_log[:-2000]
            # the allocation is a round of its own: a failure there never skips the next poll
            self.guard.run("allocate", self._reallocate)
            self.guard.run("police", self._police)
        return next_poll

    def _police(self):
        for sw, msgs in self.lessor.police().items():
            self.send(sw, msgs)

    def _reallocate(self):
        flows = self.lessor.long_flows()
        if not self.lessor.allocation_needed(flows):
            self.lessor.allocations_skipped += bool(flows)
            return
        self.lessor.allocations += 1
        # the poll loop is an OS thread of its own (os-ken's native hub): PMPT
        # runs here, under the app's lock -- handlers wait for it (tens of ms on
        # a k=4 fat-tree), they never see a half-installed allocation
        allocation = self.lessor.allocate(flows)
        if allocation.stopped_by == "max phases":
            self.lessor.uncertified += 1
            self.logger.warning("PMPT stopped at its phase cap after %d phases without a certified gap: "
                                "lambda %.4g, dual bound %.4g (placed anyway)",
                                allocation.phases, allocation.lam, allocation.upper_bound)
        for sw, msgs in self.lessor.install(allocation, flows):
            self.send(sw, msgs)
        # when each allocation went out and how many installed flows it moved (the state file's
        # allocation_log: seconds after t0_wall, as cpu_log), to lay beside what the fabric carried
        self.allocation_log.append((round(time.monotonic() - self.t0, 3), self.lessor.moves_per_allocation[-1]))
        del self.allocation_log[:-500]

    def _write_state(self):
        """The state is read under the lock; the file is written after it
        (handlers never wait for the disk)."""
        if not self.state_file:
            return
        with self.lock:
            state = self.lessor.state()
            state.update(packet_ins=self.packet_ins, cpu_log=self.cpu_log[-500:], t0_wall=self.t0_wall,
                         allocation_log=list(self.allocation_log),
                         switches=sorted(self.datapaths), polls=self.polls, loops=self.guard.as_dict(),
                         refused=dict(sorted(self.refused.items())))
        tmp = Path(self.state_file + ".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(self.state_file)


def fair_receivers(loaded) -> bool:
    """Receiver fairness is LESSOR's only without BG/WC classes: with them a
    guaranteed VM's subflows are not equals, and the WC policy (fair WC
    congestion control, LRC's weights) shares what BG leaves."""
    return loaded.cfg.lessor.fair_receivers and not loaded.cfg.controller.prio_queues


def bg_policy(loaded) -> BgPolicy:
    """The declared tenants' BG as LESSOR places it: with prio queues (the
    fabric's two classes), every VM's guarantee by address and its agent's
    first join port, and admission control's mu; without, none (one class:
    nothing travels apart), nor with ``lessor.bg_first`` off. With
    ``lessor.bg_routes`` (on by default) each VM's host and tenant too: its
    BG's default route (:mod:`apps.lessor.bg_routes`)."""
    if not loaded.cfg.controller.prio_queues or not loaded.cfg.lessor.bg_first:
        return BgPolicy()
    vms = loaded.vms().values()
    routed = loaded.cfg.lessor.bg_routes
    return BgPolicy({p.address: p.vm.guarantee_mbps * 1e6 for p in vms},
                    {p.address: loaded.tuning(p.host).join_port_base for p in vms}, loaded.cfg.admission.mu,
                    host={p.address: p.host for p in vms} if routed else {},
                    tenant={p.address: p.tenant for p in vms} if routed else {})


ECHO_RTT_MAX_S = 60.0


def echo_rtt(data: bytes, now: float) -> float | None:
    """The RTT an echo reply carries (our request put ``time.monotonic()``
    in its payload), or None for a payload that is not ours or a time that
    is not finite, lies in the future, or is older than a minute: such a
    sample must not reach Algorithm 1's RTT average."""
    if not isinstance(data, (bytes, bytearray)) or len(data) != 8:
        return None
    (sent,) = struct.unpack("!d", data)
    rtt = now - sent
    if not math.isfinite(rtt) or not 0.0 <= rtt <= ECHO_RTT_MAX_S:
        return None
    return rtt
