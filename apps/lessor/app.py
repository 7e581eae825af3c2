"""os-ken/Ryu app: LESSOR (a shim over :class:`apps.lessor.logic.LessorLogic`).

Environment:
- ``BWFABRIC_LESSOR``: optional JSON object of settings: the PollingConfig
  fields (lower, upper, initial_s, alpha, alpha_min, alpha_step, min_s,
  max_s, rtt_factor) and ``epsilon``; unknown keys are refused at start.
- ``BWFABRIC_STATE_FILE``: where to write the controller's state (JSON) after
  every polling decision: polling period and its history, controller CPU,
  long flows, installed paths, lambda.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
import time
from pathlib import Path

import psutil

from apps.lessor.logic import LessorLogic
from apps.lessor.pmpt import warm_up
from apps.lessor.pre import PollingConfig
from controller import ofmsg
from controller.app_base import ForwardingApp
from controller.sdn import MAIN_DISPATCHER, hub, ofp_event, set_ev_cls

SETTINGS_ENV = "BWFABRIC_LESSOR"
STATE_ENV = "BWFABRIC_STATE_FILE"


def load_settings(raw: str | None) -> tuple[PollingConfig | None, float]:
    """(polling config, or None for the app's default; epsilon)."""
    data = json.loads(raw) if raw else {}
    if not isinstance(data, dict):
        raise ValueError(f"{SETTINGS_ENV}: must be a JSON object")
    fields = {f.name for f in dataclasses.fields(PollingConfig)}
    unknown = sorted(set(data) - fields - {"epsilon"})
    if unknown:
        raise ValueError(f"{SETTINGS_ENV}: unknown keys {unknown}; valid: {sorted(fields | {'epsilon'})}")
    epsilon = float(data.pop("epsilon", 0.05))
    if not data:
        return None, epsilon
    cfg = PollingConfig(**{k: float(v) for k, v in data.items()})
    cfg.check()
    return cfg, epsilon


class LessorApp(ForwardingApp):
    LOGIC = LessorLogic

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        polling, epsilon = load_settings(os.environ.get(SETTINGS_ENV))
        self.lessor = self.logic = self.LOGIC(self.view, polling, epsilon)
        self.logger.info("PMPT kernels ready in %.2f s", warm_up())
        self.state_file = os.environ.get(STATE_ENV)
        self.process = psutil.Process()
        self.process.cpu_percent(None)  # after the warm-up: Algorithm 1 must not see the compilation
        self.packet_ins = 0
        self.last_rtt: float | None = None
        self.cpu_log: list[tuple[float, float, float]] = []   # (t, cpu fraction, period)
        self.t0 = time.monotonic()
        self.t0_wall = time.time()  # cpu_log times are seconds after this epoch
        self.decide_at: float | None = None
        self.poller = None

    def start(self):
        thread = super().start()
        self.poller = hub.spawn(self._poll_loop)
        return thread

    # ---- events (switch connect, ports, disconnect: ForwardingApp) -------------------
    @set_ev_cls(ofp_event.EventOFPFlowStatsReply, MAIN_DISPATCHER)
    def _flow_stats(self, ev):
        switch = self.view.switch_by_dpid(ev.msg.datapath.id)
        entries = [(dict(s.match.items()), s.byte_count) for s in ev.msg.body]
        decide_at = self.lessor.flow_stats(switch, entries, time.monotonic())
        self.decide_at = decide_at if self.decide_at is None else min(self.decide_at, decide_at)

    @set_ev_cls(ofp_event.EventOFPEchoReply, MAIN_DISPATCHER)
    def _echo_reply(self, ev):
        if len(ev.msg.data) == 8:
            self.last_rtt = time.monotonic() - struct.unpack("!d", ev.msg.data)[0]

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    def _packet_in(self, ev):
        self.packet_ins += 1  # nothing should ever come here: counted to prove it

    # ---- the polling loop (a green thread) -----------------------------------------------
    def _poll_loop(self):
        next_poll = time.monotonic() + 1.0
        while True:
            hub.sleep(max(0.0, next_poll - time.monotonic()))
            self.decide_at = None
            now = time.monotonic()
            requests = {sw: msgs for sw, msgs in self.lessor.poll(now).items() if sw in self.datapaths}
            if not requests:  # no ToR connected yet: nothing to measure, look again soon
                next_poll = now + 0.5
                continue
            for sw, msgs in requests.items():
                self.send(sw, [*msgs, ofmsg.EchoRequest(struct.pack("!d", time.monotonic()))])
            deadline = now + max(1.0, self.lessor.polling.period_s)
            while self.decide_at is None and time.monotonic() < deadline:
                hub.sleep(0.05)
            if self.decide_at is not None:
                hub.sleep(max(0.0, self.decide_at - time.monotonic()))
            cpu = self.process.cpu_percent(None) / 100.0
            rtt, self.last_rtt = self.last_rtt, None
            next_poll = self.lessor.decide(time.monotonic(), cpu, rtt)  # compares rtt with earlier ones
            if rtt is not None:
                self.lessor.polling.record_rtt(rtt)
            self.cpu_log.append((time.monotonic() - self.t0, cpu, self.lessor.polling.period_s))
            self._reallocate()
            self._write_state()

    def _reallocate(self):
        flows = self.lessor.long_flows()
        if not self.lessor.allocation_needed(flows):
            self.lessor.allocations_skipped += bool(flows)
            return
        self.lessor.allocations += 1
        from eventlet import tpool  # a real OS thread: the event loop keeps running
        allocation = tpool.execute(self.lessor.allocate, flows)
        for sw, msgs in self.lessor.install(allocation, flows):
            self.send(sw, msgs)

    def _write_state(self):
        if not self.state_file:
            return
        state = self.lessor.state()
        state.update(packet_ins=self.packet_ins, cpu_log=self.cpu_log[-500:], t0_wall=self.t0_wall,
                     switches=sorted(self.datapaths))
        tmp = Path(self.state_file + ".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(self.state_file)
