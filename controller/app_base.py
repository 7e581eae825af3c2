"""Base class of bwfabric's os-ken/Ryu apps: a thin shim.

It takes the fabric from the configuration in force (:func:`controller.config.active`), keeps the connected
datapaths, and is the only place apps send through. Subclasses hold a pure
logic object and forward events to it in a few lines each.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from controller import api, config, metrics, ofmsg, ofread, ofsend, runtime
from bwcommon.loops import LoopGuard
from controller.linkdamp import LinkDamping
from controller.network_view import NetworkView
from controller.portstats import PortLoads
from controller.sdn import (CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER, BaseApp, hub, ofp_event,
                            ofproto_v1_3, set_ev_cls)


def port_is_up(ofp, desc) -> bool:
    return not (desc.state & ofp.OFPPS_LINK_DOWN) and not (desc.config & ofp.OFPPC_PORT_DOWN)


class FabricApp(BaseApp):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.config = config.active()
        self.view = NetworkView(self.config.topology)
        self.datapaths: dict[str, object] = {}
        self.guard = LoopGuard(self.logger)      # rounds of periodic loops and event handlers
        # os-ken's hub runs the event loop and an app's own loops on separate OS
        # threads: whoever touches the logic holds this (never across a sleep)
        self.lock = threading.RLock()
        self.refused: dict[str, int] = {}        # inputs refused at the OpenFlow boundary, by kind
        self.sent: dict[str, int] = {}           # OpenFlow messages sent, by kind
        metrics.register(f"app:{type(self).__name__}", self.samples)

    def samples(self):
        """Metrics (controller.metrics): connections, messages, loop errors, refusals."""
        with self.lock:
            yield "bwfabric_switches_connected", {}, len(self.datapaths)
            for kind, n in sorted(self.sent.items()):
                yield "bwfabric_openflow_messages_sent", {"kind": kind}, n
            for loop, st in self.guard.as_dict().items():
                yield "bwfabric_loop_errors", {"loop": loop}, st["errors"]
            for kind, n in sorted(self.refused.items()):
                yield "bwfabric_refused_inputs", {"kind": kind}, n

    def handle(self, name: str, fn, *args) -> None:
        """An event handler's body: under the lock, through the loop guard
        (an exception is logged and counted; the event loop goes on)."""
        with self.lock:
            self.guard.run(name, fn, *args)

    def refuse(self, kind: str, fmt: str, *args) -> None:
        self.refused[kind] = self.refused.get(kind, 0) + 1
        self.logger.warning(fmt, *args)

    def register(self, dp) -> str | None:
        """Remember a connected datapath; None (and a warning) if unknown.

        A second connection announcing the datapath id of a switch whose
        connection is still alive is refused and closed: the switch that
        connected first keeps its place (anything that knows a dpid could
        otherwise take a switch over). A switch that really restarted has
        closed its old connection (os-ken marks it inactive at once), and
        one whose old connection is half-open gets in once os-ken's echo
        checks have declared that one dead; OVS keeps retrying meanwhile."""
        switch = self.view.switch_by_dpid(dp.id)
        if switch is None:
            self.refuse("unknown_datapath", "datapath %016x is not in the topology; ignoring it", dp.id)
            return None
        old = self.datapaths.get(switch)
        if old is not None and old is not dp and getattr(old, "is_active", True):
            self.refuse("duplicate_datapath", "switch %s (dpid %d): a second connection while the first is "
                        "alive; refusing the new one (%s)", switch, dp.id, getattr(dp, "address", "?"))
            close = getattr(dp, "close", None)
            if close is not None:
                close()
            return None
        self.datapaths[switch] = dp
        self.logger.info("switch %s (dpid %d) connected", switch, dp.id)
        return switch

    def unregister(self, dp) -> str | None:
        switch = self.view.switch_by_dpid(dp.id)
        if switch is not None and self.datapaths.get(switch) is dp:
            del self.datapaths[switch]
            self.logger.info("switch %s disconnected", switch)
            return switch
        return None

    # ---- roles (controller.ha): a standby keeps a warm view and writes nothing ------------------
    @staticmethod
    def leading() -> bool:
        rt = runtime.current()
        return rt is None or rt.leading()

    @staticmethod
    def role_request() -> ofmsg.RoleRequest | None:
        """What this process asks to be on a switch: MASTER with its
        generation as leader, SLAVE with the leader's as a standby; None
        without an election (or before a standby knows any leader)."""
        rt = runtime.current()
        if rt is None or rt.role == "single":
            return None
        if rt.role == "leader":
            return ofmsg.RoleRequest("master", rt.generation)
        return ofmsg.RoleRequest("slave", rt.leader_generation) if rt.leader_generation else None

    def _watch_role(self) -> None:
        rt = runtime.current()
        if rt is not None:
            rt.on_role(lambda role, generation: self.handle("role_change", self._role_changed, role))

    def _role_changed(self, role: str) -> None:
        request = self.role_request()
        switches = sorted(self.datapaths)
        self.logger.warning("role %s: telling %d switches%s", role, len(switches),
                            "" if request is None else f" ({request.role}, generation {request.generation_id})")
        for sw in switches:
            if request is not None:
                self.send(sw, [request])
        if role == "leader":
            self.promoted(switches)
        else:
            self.demoted(switches)

    def promoted(self, switches: list[str]) -> None:
        """This process now leads: bring the connected switches to its view."""

    def demoted(self, switches: list[str]) -> None:
        """This process is a standby now: forget what it would write."""

    WRITES = (ofmsg.FlowMod, ofmsg.GroupMod, ofmsg.MeterMod, ofmsg.PacketOut)

    def send(self, switch: str, msgs) -> None:
        dp = self.datapaths.get(switch)
        if dp is None:
            self.logger.warning("not sending %d messages to %s: not connected", len(msgs), switch)
            return
        if not self.leading():
            writes = [m for m in msgs if isinstance(m, self.WRITES)]
            if writes:                 # a standby writes nothing (the switch would refuse a SLAVE anyway)
                self.sent["not_leading"] = self.sent.get("not_leading", 0) + len(writes)
                msgs = [m for m in msgs if not isinstance(m, self.WRITES)]
                if not msgs:
                    return
        ofsend.send(dp, msgs)
        for m in msgs:
            kind = type(m).__name__
            self.sent[kind] = self.sent.get(kind, 0) + 1


LINK_HOLD_S = 0.2   # port changes within this of the last recomputation are gathered (flap damping)
RECONCILE_TIMEOUT_S = 3.0   # a switch's read-back replies, at most (then it is wiped and installed anew)


@dataclass
class _Reading:
    """One connection's read-back in progress."""
    dp: object
    t0: float
    xids: dict[int, str] = field(default_factory=dict)       # request xid -> "flows" | "groups" | "meters"
    bodies: dict[str, list] = field(default_factory=dict)
    complete: set[str] = field(default_factory=set)


class ForwardingApp(FabricApp):
    """An app that installs the forwarding defaults: switch connect, port
    changes and disconnects go to ``self.logic``, which answers with
    messages (``switch_reconciled``/``switch_connected``, ``links_changed``,
    ``switch_disconnected``)."""

    logic = None  # set by the subclass

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.port_loads = PortLoads(self.view)
        self._watch_role()
        self.granted: dict[str, tuple[str, int]] = {}    # switch -> the role it granted this process, generation
        self.promoted_at: float | None = None
        self.all_master_logged: int | None = None
        self.pending_links: dict[tuple[str, int], bool] = {}   # port changes not acted on yet
        self.link_flush_at: float | None = None          # when the gathered changes are due
        self.last_link_flush = float("-inf")
        self.link_events = {"received": 0, "recomputed": 0, "coalesced": 0, "held_down": 0, "released": 0}
        d = self.config.cfg.controller.link_damping
        self.damping = LinkDamping(d.threshold, d.window_s, d.hold_s)   # flapping ports held down
        self.release_at: float | None = None             # when held-down ports are checked next
        self.readings: dict[str, _Reading] = {}          # switch -> its read-back in progress
        self.reconciles: dict[str, int] = {}             # "read": reconciled from what it held; "wiped"
        self.last_reconcile: dict[str, dict] = {}        # switch -> what its last reconciliation found and sent
        api.PROVIDERS["link_loads"] = self.link_loads
        api.PROVIDERS["poll_port_stats"] = self._port_stats_round          # LRC polls every τ_r
        api.PROVIDERS["port_stats_replies"] = lambda: self.port_loads.replies

    def start(self):
        thread = super().start()
        self.port_stats_thread = hub.spawn(self._port_stats_loop)
        return thread

    # ---- a (re)connected switch: read back, then reconciled (never wiped) --------------
    def _switch_features_round(self, ev):
        """Read the switch before writing it: its entries, groups and meters
        (the replies complete a :class:`_Reading`, then the logic's
        ``switch_reconciled`` brings it to the view make-before-break). A
        switch that does not answer within ``RECONCILE_TIMEOUT_S`` (or
        refuses to list its entries or groups) is wiped and installed anew
        (``switch_connected``), as before. Its ports are asked for last."""
        dp = ev.msg.datapath
        switch = self.register(dp)
        if not switch:
            return
        request = self.role_request()
        if request is not None:
            self.send(switch, [request])
        if not self.leading():                 # a standby: the ports for a warm view, nothing written
            self.send(switch, [ofmsg.PortDescRequest()])
            return
        self._read_back(switch, dp)

    def _read_back(self, switch: str, dp) -> None:
        reading = _Reading(dp, time.monotonic())
        self.readings[switch] = reading
        for part, req in (("groups", ofmsg.GroupDescRequest()), ("meters", ofmsg.MeterConfigRequest()),
                          ("flows", ofmsg.FlowStatsRequest(ofmsg.OFPTT_ALL))):
            reading.xids[ofsend.send_request(dp, req)] = part   # xids are per connection
        self.send(switch, [ofmsg.PortDescRequest()])
        hub.spawn(self._reading_deadline, switch, reading)

    def promoted(self, switches: list[str]) -> None:
        self.promoted_at = time.monotonic()
        for sw in switches:
            if sw not in self.readings:
                self._read_back(sw, self.datapaths[sw])

    @set_ev_cls(ofp_event.EventOFPRoleReply, MAIN_DISPATCHER)
    def _role_reply(self, ev):
        self.handle("role_reply", self._role_reply_round, ev)

    def _role_reply_round(self, ev):
        """What a switch granted (the log says when every connected switch
        has this process as MASTER: the failover's end)."""
        switch = self._registered(ev.msg.datapath)
        if switch is None:
            return
        ofp = ev.msg.datapath.ofproto
        role = {ofp.OFPCR_ROLE_MASTER: "master", ofp.OFPCR_ROLE_SLAVE: "slave",
                ofp.OFPCR_ROLE_EQUAL: "equal"}.get(ev.msg.role, str(ev.msg.role))
        self.granted[switch] = (role, ev.msg.generation_id)
        rt = runtime.current()
        if (role == "master" and rt is not None and rt.role == "leader" and self.datapaths
                and all(self.granted.get(sw, ("", 0)) == ("master", rt.generation) for sw in self.datapaths)
                and self.all_master_logged != rt.generation):
            self.all_master_logged = rt.generation
            since = time.monotonic() - self.promoted_at if self.promoted_at is not None else 0.0
            self.logger.warning("MASTER on all %d switches (generation %d), %.3f s after this process was "
                                "elected", len(self.datapaths), rt.generation, since)

    def demoted(self, switches: list[str]) -> None:
        for sw in switches:
            if sw in self.readings:
                self._reading_done(sw, self.readings[sw])
            self.logic.switch_disconnected(sw)     # its state is rebuilt from the switch when it leads again

    def unregister(self, dp) -> str | None:
        switch = super().unregister(dp)
        if switch is not None and switch in self.readings:
            self._reading_done(switch, self.readings[switch])
        return switch

    def _reading_deadline(self, switch: str, reading: "_Reading"):
        hub.sleep(RECONCILE_TIMEOUT_S)
        self.handle("reconcile_timeout", self._read_failed, switch, reading, "no complete reply in time")

    def _read_failed(self, switch: str, reading: "_Reading", why: str) -> None:
        if self.readings.get(switch) is not reading or self.datapaths.get(switch) is not reading.dp:
            return      # reconciled already, or another connection took over
        self._reading_done(switch, reading)
        self.reconciles["wiped"] = self.reconciles.get("wiped", 0) + 1
        self.logger.warning("switch %s could not be read (%s): wiping and installing it anew", switch, why)
        self.send(switch, self.logic.switch_connected(switch))

    def _reading_done(self, switch: str, reading: "_Reading") -> None:
        del self.readings[switch]

    def _reading_of(self, ev) -> tuple[str | None, "_Reading | None"]:
        """The read-back a reply or error answers: its connection's reading,
        by the request's xid (xids are numbered per connection)."""
        dp = ev.msg.datapath
        switch = self.view.switch_by_dpid(getattr(dp, "id", None)) if getattr(dp, "id", None) is not None else None
        reading = self.readings.get(switch) if switch is not None else None
        if reading is None or reading.dp is not dp or getattr(ev.msg, "xid", None) not in reading.xids:
            return None, None
        return switch, reading

    def reading_reply(self, ev) -> bool:
        """Whether a multipart reply answers a switch's read-back (then it is
        consumed here; other apps' handlers must ignore it)."""
        return self._reading_of(ev)[1] is not None

    def _reading_part(self, ev) -> None:
        switch, reading = self._reading_of(ev)
        part = reading.xids[ev.msg.xid]
        reading.bodies.setdefault(part, []).extend(ev.msg.body)
        if ev.msg.flags & ev.msg.datapath.ofproto.OFPMPF_REPLY_MORE:
            return
        reading.complete.add(part)
        if len(reading.complete) == len(reading.xids):
            self._complete(switch, reading)

    def _complete(self, switch: str, reading: "_Reading") -> None:
        self._reading_done(switch, reading)
        held = ofmsg.Held(flows=ofread.flows(reading.bodies.get("flows", ())),
                          groups=ofread.groups(reading.bodies.get("groups", ())),
                          meters=ofread.meters(reading.bodies.get("meters", ())),
                          outputs=ofread.outputs(reading.bodies.get("flows", ())))
        msgs = self.logic.switch_reconciled(switch, held)
        self.reconciles["read"] = self.reconciles.get("read", 0) + 1
        self.last_reconcile[switch] = {"held_flows": len(held.flows), "held_groups": len(held.groups),
                                       "held_meters": len(held.meters), "sent": len(msgs),
                                       "deletes": sum(1 for m in msgs if getattr(m, "command", "").startswith(
                                           "delete")),
                                       "read_s": round(time.monotonic() - reading.t0, 4)}
        self.logger.info("switch %s reconciled from what it holds (%d entries, %d groups, %d meters): "
                         "%d messages", switch, len(held.flows), len(held.groups), len(held.meters), len(msgs))
        self.send(switch, msgs)

    def _multipart(self, ev) -> bool:
        """A read-back reply is consumed here (True); anything else is not."""
        if not self.reading_reply(ev):
            return False
        self._reading_part(ev)
        return True

    @set_ev_cls(ofp_event.EventOFPGroupDescStatsReply, MAIN_DISPATCHER)
    def _group_desc(self, ev):
        self.handle("group_desc", self._multipart, ev)

    @set_ev_cls(ofp_event.EventOFPMeterConfigStatsReply, MAIN_DISPATCHER)
    def _meter_config(self, ev):
        self.handle("meter_config", self._multipart, ev)

    @set_ev_cls(ofp_event.EventOFPFlowStatsReply, MAIN_DISPATCHER)
    def _flow_stats(self, ev):
        self.handle("flow_stats", self._flow_stats_any, ev)

    def _flow_stats_any(self, ev):
        if not self._multipart(ev):
            self.flow_stats_reply(ev)

    def flow_stats_reply(self, ev) -> None:
        """A flow-stats reply that is no read-back (traffic engineering polls: LESSOR)."""

    @set_ev_cls(ofp_event.EventOFPErrorMsg, MAIN_DISPATCHER)
    def _error(self, ev):
        self.handle("error", self._error_round, ev)

    def _error_round(self, ev):
        """A switch refusing a read-back request: meters are optional (a
        switch without them holds none); without entries or groups it is
        wiped and installed anew."""
        switch, reading = self._reading_of(ev)
        if reading is None:
            return
        part = reading.xids[ev.msg.xid]
        if part != "meters":
            self._read_failed(switch, reading, f"it refused the {part} request (error type {ev.msg.type}, "
                                               f"code {ev.msg.code})")
            return
        reading.complete.add(part)
        if len(reading.complete) == len(reading.xids):
            self._complete(switch, reading)

    def link_loads(self) -> dict[tuple[str, str], float]:
        with self.lock:
            return self.port_loads.link_loads()

    def samples(self):
        yield from super().samples()
        with self.lock:
            for (a, b), bps in sorted(self.port_loads.link_loads().items()):
                yield "bwfabric_link_load_bytes_per_second", {"src": a, "dst": b}, bps / 8
            for (sw, port), n in sorted(self.port_loads.tx_bytes.items()):
                yield "bwfabric_port_transmit_bytes", {"switch": sw, "port": port}, n
            for how, n in sorted(self.reconciles.items()):
                yield "bwfabric_switch_reconciles", {"how": how}, n
            for what, n in sorted(self.link_events.items()):
                yield "bwfabric_port_changes", {"what": what}, n

    def _port_stats_loop(self):
        """Every switch's port counters, every ``controller.port_stats_s``;
        a failed round is logged and counted, the loop goes on."""
        while True:
            # the configuration in force (a reload may change the period); under
            # ryu-manager there is no runtime: the one the app started with
            rt = runtime.current()
            period = (rt.loaded if rt is not None else self.config).cfg.controller.port_stats_s
            hub.sleep(self.guard.backoff("port_stats", period))
            self.guard.run("port_stats", self._port_stats_round)

    def _port_stats_round(self) -> int:
        """Ask every connected switch for its port counters; how many were asked."""
        with self.lock:
            switches = sorted(self.datapaths)
        for sw in switches:
            self.send(sw, [ofmsg.PortStatsRequest()])
        return len(switches)

    @set_ev_cls(ofp_event.EventOFPPortStatsReply, MAIN_DISPATCHER)
    def _port_stats(self, ev):
        self.handle("port_stats_reply", self._port_stats_reply, ev)

    def _port_stats_reply(self, ev):
        switch = self._registered(ev.msg.datapath)
        if switch is not None:
            self.port_loads.record(switch, [(s.port_no, s.tx_bytes, s.rx_bytes, s.duration_sec, s.duration_nsec)
                                            for s in ev.msg.body], time.monotonic())

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def _switch_features(self, ev):
        self.handle("switch_features", self._switch_features_round, ev)

    def _registered(self, dp) -> str | None:
        """The switch name of a datapath whose connection is the registered
        one (events from a refused or stale connection are ignored)."""
        switch = self.view.switch_by_dpid(dp.id)
        if switch is None or self.datapaths.get(switch) is not dp:
            self.refuse("unregistered_datapath", "event from datapath %s, not a registered switch "
                        "connection: ignored", dp.id)
            return None
        return switch

    @set_ev_cls(ofp_event.EventOFPPortDescStatsReply, MAIN_DISPATCHER)
    def _port_desc(self, ev):
        self.handle("port_desc", self._port_desc_round, ev)

    def _port_desc_round(self, ev):
        switch, ofp = self._registered(ev.msg.datapath), ev.msg.datapath.ofproto
        for desc in ev.msg.body:
            self._port_changed(switch, desc.port_no, port_is_up(ofp, desc))

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    def _port_status(self, ev):
        self.handle("port_status", self._port_status_round, ev)

    def _port_status_round(self, ev):
        ofp, desc = ev.msg.datapath.ofproto, ev.msg.desc
        up = ev.msg.reason != ofp.OFPPR_DELETE and port_is_up(ofp, desc)
        self._port_changed(self._registered(ev.msg.datapath), desc.port_no, up)

    @set_ev_cls(ofp_event.EventOFPStateChange, DEAD_DISPATCHER)
    def _disconnected(self, ev):
        with self.lock:
            switch = self.unregister(ev.datapath)
        if switch:
            self.handle("switch_disconnected", self.logic.switch_disconnected, switch)

    def _port_changed(self, switch, port, up):
        """A port went up or down. The first change after a quiet
        ``LINK_HOLD_S`` is acted on at once (a failure is routed around
        without delay); changes within the hold after it are gathered, the
        last state of each port kept, and acted on together when the hold
        ends -- so a flapping link costs at most one recomputation of the
        routes per hold, whatever its rate. A port that keeps flapping is
        held down (:class:`controller.linkdamp.LinkDamping`) until it has
        stayed up for the damping's hold, then let back in."""
        if switch is None or port > 0xFFFFFF00:
            return
        if self.view.peer(switch, port) is None:
            self.refuse("unknown_port", "port %s:%d is not in the topology: ignored", switch, port)
            return
        self.link_events["received"] += 1
        now = time.monotonic()
        acted = self.damping.report((switch, port), up, now)   # a flapping port is held down
        if up and not acted:
            self.link_events["held_down"] += 1
            self._release_later(self.damping.next_release() - now)
        self._gather(switch, port, acted)

    def _gather(self, switch: str, port: int, up: bool) -> None:
        self.pending_links.pop((switch, port), None)
        self.pending_links[(switch, port)] = up          # in the order of each port's last report
        if self.link_flush_at is not None:
            return                                         # a flush is due: it takes this change too
        wait = self.last_link_flush + LINK_HOLD_S - time.monotonic()
        if wait <= 0:
            self.flush_links()
        else:
            self.link_flush_at = self.last_link_flush + LINK_HOLD_S
            hub.spawn(self._flush_links_later, wait)

    def _flush_links_later(self, wait: float) -> None:
        hub.sleep(wait)
        self.handle("link_flush", self.flush_links)

    def _release_later(self, wait: float) -> None:
        if self.release_at is not None and self.release_at <= time.monotonic() + wait:
            return                                         # a check comes sooner: it reschedules
        self.release_at = time.monotonic() + wait
        hub.spawn(self._release_round_later, wait)

    def _release_round_later(self, wait: float) -> None:
        hub.sleep(max(0.0, wait))
        self.handle("link_release", self.release_links)

    def release_links(self) -> None:
        """Let back in the held-down ports that stayed up through their hold."""
        self.release_at = None
        now = time.monotonic()
        for switch, port in self.damping.due(now):
            self.link_events["released"] += 1
            self._gather(switch, port, True)
        later = self.damping.next_release()
        if later != float("inf"):
            self._release_later(later - now)

    def flush_links(self) -> None:
        """Act on the port changes gathered so far (one recomputation)."""
        changes = [(sw, port, up) for (sw, port), up in self.pending_links.items()]
        self.pending_links.clear()
        self.link_flush_at = None
        self.last_link_flush = time.monotonic()
        if not changes:
            return
        self.link_events["recomputed"] += 1
        self.link_events["coalesced"] += len(changes) - 1
        what = ", ".join(f"{sw}:{port} {'up' if up else 'down'}" for sw, port, up in changes[:6])
        updates = self.logic.links_changed(changes)
        self.logger.info("ports %s%s: updating %d switches (%s)", what, " ..." if len(changes) > 6 else "",
                         len(updates), ", ".join(sorted(updates)))
        for sw, msgs in updates.items():
            self.send(sw, msgs)
