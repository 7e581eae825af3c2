"""Base class of bwfabric's os-ken/Ryu apps: a thin shim.

It loads the topology description (``BWFABRIC_TOPOLOGY``), keeps the connected
datapaths, and is the only place apps send through. Subclasses hold a pure
logic object and forward events to it in a few lines each.
"""

from __future__ import annotations

import os

from controller import ofmsg, ofsend
from controller.network_view import NetworkView
from controller.sdn import (CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER, BaseApp, ofp_event,
                            ofproto_v1_3, set_ev_cls)
from controller.topology import TopologyDescription

TOPOLOGY_ENV = "BWFABRIC_TOPOLOGY"


def load_view() -> NetworkView:
    path = os.environ.get(TOPOLOGY_ENV)
    if not path:
        raise RuntimeError(f"set {TOPOLOGY_ENV} to a topology description "
                           "(bwfabric controller --topology FILE does it for you)")
    return NetworkView(TopologyDescription.load(path))


def port_is_up(ofp, desc) -> bool:
    return not (desc.state & ofp.OFPPS_LINK_DOWN) and not (desc.config & ofp.OFPPC_PORT_DOWN)


class FabricApp(BaseApp):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.view = load_view()
        self.datapaths: dict[str, object] = {}

    def register(self, dp) -> str | None:
        """Remember a connected datapath; None (and a warning) if unknown."""
        switch = self.view.switch_by_dpid(dp.id)
        if switch is None:
            self.logger.warning("datapath %016x is not in the topology; ignoring it", dp.id)
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

    def send(self, switch: str, msgs) -> None:
        dp = self.datapaths.get(switch)
        if dp is None:
            self.logger.warning("not sending %d messages to %s: not connected", len(msgs), switch)
            return
        ofsend.send(dp, msgs)


class ForwardingApp(FabricApp):
    """An app that installs the forwarding defaults: switch connect, port
    changes and disconnects go to ``self.logic``, which answers with
    messages (``switch_connected``, ``link_changed``, ``switch_disconnected``)."""

    logic = None  # set by the subclass

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def _switch_features(self, ev):
        switch = self.register(ev.msg.datapath)
        if switch:
            self.send(switch, [*self.logic.switch_connected(switch), ofmsg.PortDescRequest()])

    @set_ev_cls(ofp_event.EventOFPPortDescStatsReply, MAIN_DISPATCHER)
    def _port_desc(self, ev):
        switch, ofp = self.view.switch_by_dpid(ev.msg.datapath.id), ev.msg.datapath.ofproto
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
            self.logic.switch_disconnected(switch)

    def _port_changed(self, switch, port, up):
        if switch is None or port > 0xFFFFFF00:
            return
        for sw, msgs in self.logic.link_changed(switch, port, up).items():
            self.logger.info("port %s:%d %s: updating %s", switch, port, "up" if up else "down", sw)
            self.send(sw, msgs)
