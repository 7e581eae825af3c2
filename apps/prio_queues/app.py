"""os-ken/Ryu app: BG/WC classification in table 0 (a shim over
:class:`apps.prio_queues.logic.PrioQueuesLogic`). Run it beside a routing
app (``controller.prio_queues: true`` in the configuration).

The ToR meters police each VM's BG at its guarantee (x
``prio_queues.meter_headroom``), from the same tenant declaration the host
agents' configurations come from (:mod:`controller.tenancy`).
"""

from apps.prio_queues.logic import PrioQueuesLogic
from controller import runtime, tenancy
from controller.app_base import FabricApp
from controller.sdn import CONFIG_DISPATCHER, DEAD_DISPATCHER, ofp_event, set_ev_cls


def logic_for(view, loaded) -> PrioQueuesLogic:
    return PrioQueuesLogic(view, tenancy.meter_rates(loaded), loaded.cfg.prio_queues.burst_kbit)


class PrioQueuesApp(FabricApp):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.logic = logic_for(self.view, self.config)
        if runtime.current() is not None:
            runtime.current().subscribe("prio_queues", self.config_changed)
        self._watch_role()

    def config_changed(self, old, new):
        """Only the meters of hosts whose guarantee changed are touched."""
        with self.lock:
            changes = self.logic.update(tenancy.meter_rates(new), new.cfg.prio_queues.burst_kbit)
            for switch, msgs in changes.items():
                self.send(switch, msgs)
        self.logger.info("meters changed on %s", ", ".join(sorted(changes)) or "no switch")

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def _switch_features(self, ev):
        self.handle("switch_features", self._switch_features_round, ev)

    def _switch_features_round(self, ev):
        switch = self.register(ev.msg.datapath)
        if switch:
            request = self.role_request()
            self.send(switch, ([request] if request is not None else []) + (
                self.logic.switch_connected(switch) if self.leading() else []))

    def promoted(self, switches):
        for sw in switches:
            self.send(sw, self.logic.switch_connected(sw))

    @set_ev_cls(ofp_event.EventOFPStateChange, DEAD_DISPATCHER)
    def _disconnected(self, ev):
        with self.lock:
            self.unregister(ev.datapath)
