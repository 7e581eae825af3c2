"""os-ken/Ryu app: BG/WC classification in table 0 (a shim over
:class:`apps.prio_queues.logic.PrioQueuesLogic`). Run it beside a routing
app: ``bwfabric controller --apps ecmp,prio_queues``."""

from apps.prio_queues.logic import PrioQueuesLogic
from controller.app_base import FabricApp
from controller.sdn import CONFIG_DISPATCHER, DEAD_DISPATCHER, ofp_event, set_ev_cls


class PrioQueuesApp(FabricApp):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.logic = PrioQueuesLogic()

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def _switch_features(self, ev):
        switch = self.register(ev.msg.datapath)
        if switch:
            self.send(switch, self.logic.switch_connected(switch))

    @set_ev_cls(ofp_event.EventOFPStateChange, DEAD_DISPATCHER)
    def _disconnected(self, ev):
        self.unregister(ev.datapath)
