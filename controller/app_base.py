"""Base class of bwfabric's os-ken/Ryu apps: a thin shim.

It loads the topology description (``BWFABRIC_TOPOLOGY``), keeps the connected
datapaths, and is the only place apps send through. Subclasses hold a pure
logic object and forward events to it in a few lines each.
"""

from __future__ import annotations

import os

from controller import ofsend
from controller.network_view import NetworkView
from controller.sdn import BaseApp, ofproto_v1_3
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
