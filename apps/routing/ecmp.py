"""os-ken/Ryu app: ECMP baseline (SELECT groups hashing the 5-tuple)."""

from apps.routing.app import RoutingApp


class EcmpApp(RoutingApp):
    ROUTING = "ecmp"
