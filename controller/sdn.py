"""Import shim: the same apps run under os-ken (our launcher) or Ryu
(``ryu-manager``).

The framework already driving the process wins: when ``ryu-manager`` has
imported Ryu and not os-ken, apps bind to Ryu; otherwise os-ken, falling back to
Ryu if os-ken is missing. ``BWFABRIC_OF_FRAMEWORK=ryu|os_ken`` forces a choice.
Only adapters (apps, launcher, sender) import this module; algorithms never do.
"""

from __future__ import annotations

import importlib.util
import os
import sys


def _choose() -> str:
    forced = os.environ.get("BWFABRIC_OF_FRAMEWORK")
    if forced:
        if forced not in ("os_ken", "ryu"):
            raise ImportError(f"BWFABRIC_OF_FRAMEWORK={forced!r}: use 'os_ken' or 'ryu'")
        return forced
    if "ryu.base.app_manager" in sys.modules and "os_ken.base.app_manager" not in sys.modules:
        return "ryu"
    if importlib.util.find_spec("os_ken") is not None:
        return "os_ken"
    if importlib.util.find_spec("ryu") is not None:
        return "ryu"
    raise ImportError("neither os-ken nor Ryu is installed: pip install os-ken")


FRAMEWORK = _choose()

if FRAMEWORK == "os_ken":
    from os_ken.base import app_manager
    from os_ken.controller import ofp_event
    from os_ken.controller.handler import (CONFIG_DISPATCHER, DEAD_DISPATCHER,
                                           MAIN_DISPATCHER, set_ev_cls)
    from os_ken.lib import hub
    from os_ken.ofproto import ofproto_v1_3

    BaseApp = app_manager.OSKenApp

    from os_ken.ofproto import ofproto_v1_3_parser as _parser13

    from controller.ofwire import decode_flow_stats

    class DecodedMatch(dict):
        """A flow entry's match decoded by :mod:`controller.ofwire`: os-ken's
        field names and values (what ``OFPMatch.items()`` gives), and the
        match's length on the wire."""

        def __init__(self, fields: dict, length: int):
            super().__init__(fields)
            self.length = length

    class AccountingFlowStats(_parser13.OFPFlowStats):
        """os-ken's flow-statistics entry, decoded by :func:`decode_flow_stats`
        where that knows every field (LESSOR's accounting entries), by
        os-ken's own parser otherwise."""

        @classmethod
        def parser(cls, buf, offset):
            got = decode_flow_stats(buf, offset)
            if got is None:
                return super().parser(buf, offset)
            fixed, fields, match_length = got
            (length, table_id, sec, nsec, priority, idle, hard, flags, cookie, packets, octets) = fixed
            return cls(table_id, sec, nsec, priority, idle, hard, flags, cookie, packets, octets,
                       DecodedMatch(fields, match_length), [], length)

    # every OFPMP_FLOW reply's entries go through it (os-ken reads the class from here per reply)
    _parser13.OFPFlowStatsReply.cls_stats_body_cls = AccountingFlowStats
else:  # pragma: no cover - exercised only where Ryu runs
    from ryu.base import app_manager
    from ryu.controller import ofp_event
    from ryu.controller.handler import (CONFIG_DISPATCHER, DEAD_DISPATCHER,
                                        MAIN_DISPATCHER, set_ev_cls)
    from ryu.lib import hub
    from ryu.ofproto import ofproto_v1_3

    BaseApp = app_manager.RyuApp

__all__ = ["FRAMEWORK", "BaseApp", "app_manager", "ofp_event", "set_ev_cls", "hub",
           "CONFIG_DISPATCHER", "MAIN_DISPATCHER", "DEAD_DISPATCHER", "ofproto_v1_3"]
