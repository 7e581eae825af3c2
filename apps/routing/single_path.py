"""os-ken/Ryu app: single_path baseline (one shortest path per destination)."""

from apps.routing.app import RoutingApp


class SinglePathApp(RoutingApp):
    ROUTING = "single_path"
