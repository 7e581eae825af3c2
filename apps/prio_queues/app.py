"""os-ken/Ryu app: BG/WC classification in table 0 (a shim over
:class:`apps.prio_queues.logic.PrioQueuesLogic`). Run it beside a routing
app: ``bwfabric controller --apps ecmp,prio_queues``.

``BWFABRIC_PRIO_QUEUES``: optional JSON object ``{"guarantees_mbps": {host:
Mb/s}, "burst_kbit": N}`` -- per-host BG meters at the ToRs (burst in
kilobits; default 20 ms at the guarantee, at least 8 jumbo frames). Unknown keys,
unknown hosts and bad values are refused at start, naming them.
"""

import os

from apps.prio_queues.logic import PrioQueuesLogic
from controller.app_base import FabricApp
from controller.validate import strict_json
from controller.sdn import CONFIG_DISPATCHER, DEAD_DISPATCHER, ofp_event, set_ev_cls


SETTINGS_ENV = "BWFABRIC_PRIO_QUEUES"


def logic_from_env(view, raw):
    data = strict_json(raw, SETTINGS_ENV) if raw else {}
    if not isinstance(data, dict) or set(data) - {"guarantees_mbps", "burst_kbit"}:
        raise ValueError(f"{SETTINGS_ENV}: a JSON object with keys guarantees_mbps, burst_kbit; got {raw!r}")
    return PrioQueuesLogic(view, data.get("guarantees_mbps") or {}, data.get("burst_kbit"))


class PrioQueuesApp(FabricApp):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.logic = logic_from_env(self.view, os.environ.get(SETTINGS_ENV))

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def _switch_features(self, ev):
        self.handle("switch_features", self._switch_features_round, ev)

    def _switch_features_round(self, ev):
        switch = self.register(ev.msg.datapath)
        if switch:
            self.send(switch, self.logic.switch_connected(switch))

    @set_ev_cls(ofp_event.EventOFPStateChange, DEAD_DISPATCHER)
    def _disconnected(self, ev):
        with self.lock:
            self.unregister(ev.datapath)
