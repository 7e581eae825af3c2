"""os-ken/Ryu adapter for the baseline routing logic (shared by both apps)."""

from __future__ import annotations

from apps.routing.logic import app_logic
from controller import ofmsg
from controller.app_base import FabricApp, port_is_up
from controller.sdn import CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER, ofp_event, set_ev_cls


class RoutingApp(FabricApp):
    ROUTING = "single_path"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.routing = app_logic(self.view, self.ROUTING)

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def _switch_features(self, ev):
        switch = self.register(ev.msg.datapath)
        if switch:
            self.send(switch, [*self.routing.switch_connected(switch), ofmsg.PortDescRequest()])

    @set_ev_cls(ofp_event.EventOFPPortDescStatsReply, MAIN_DISPATCHER)
    def _port_desc(self, ev):
        switch = self.view.switch_by_dpid(ev.msg.datapath.id)
        ofp = ev.msg.datapath.ofproto
        for desc in ev.msg.body:
            self._port_changed(switch, desc.port_no, port_is_up(ofp, desc))

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    def _port_status(self, ev):
        ofp, desc = ev.msg.datapath.ofproto, ev.msg.desc
        up = ev.msg.reason != ofp.OFPPR_DELETE and port_is_up(ofp, desc)
        self._port_changed(self.view.switch_by_dpid(ev.msg.datapath.id), desc.port_no, up)

    @set_ev_cls(ofp_event.EventOFPStateChange, DEAD_DISPATCHER)
    def _disconnected(self, ev):
        switch = self.unregister(ev.datapath)
        if switch:
            self.routing.switch_disconnected(switch)

    def _port_changed(self, switch, port, up):
        if switch is None or port > 0xFFFFFF00:
            return
        for sw, msgs in self.routing.link_changed(switch, port, up).items():
            self.logger.info("port %s:%d %s: updating %s", switch, port, "up" if up else "down", sw)
            self.send(sw, msgs)
