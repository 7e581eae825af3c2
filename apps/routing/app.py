"""os-ken/Ryu adapter for the baseline routing logic (shared by both apps)."""

from __future__ import annotations

from apps.routing.logic import app_logic
from controller.app_base import ForwardingApp


class RoutingApp(ForwardingApp):
    ROUTING = "single_path"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.logic = app_logic(self.view, self.ROUTING)
