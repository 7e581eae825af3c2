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
