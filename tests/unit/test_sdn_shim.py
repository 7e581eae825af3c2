"""controller.sdn binds apps to the framework that is driving the process.

Ryu 4.34 cannot start on this Python (docs/platform.md), so minimal stand-in
modules named like Ryu's are put on the path: the test checks only which
framework the shim binds the apps to, not Ryu itself."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STUB = {
    "ryu/__init__.py": "",
    "ryu/base/__init__.py": "",
    "ryu/base/app_manager.py": "class RyuApp:\n    def __init__(self, *a, **k):\n        pass\n",
    "ryu/controller/__init__.py": "",
    "ryu/controller/ofp_event.py": "".join(
        f"class {n}:\n    pass\n" for n in ("EventOFPSwitchFeatures", "EventOFPPortDescStatsReply",
                                         "EventOFPPortStatus", "EventOFPStateChange", "EventOFPPortStatsReply",
                                         "EventOFPGroupDescStatsReply", "EventOFPMeterConfigStatsReply",
                                         "EventOFPFlowStatsReply", "EventOFPErrorMsg", "EventOFPRoleReply")),
    "ryu/controller/handler.py": (
        "CONFIG_DISPATCHER, MAIN_DISPATCHER, DEAD_DISPATCHER = 'config', 'main', 'dead'\n"
        "def set_ev_cls(ev_cls, dispatchers=None):\n"
        "    def deco(f):\n        f.callers = {ev_cls: dispatchers}\n        return f\n    return deco\n"),
    "ryu/lib/__init__.py": "",
    "ryu/lib/hub.py": "",
    "ryu/ofproto/__init__.py": "",
    "ryu/ofproto/ofproto_v1_3.py": "OFP_VERSION = 4\n",
}
PROBE = ("import controller.sdn as s, apps.routing.ecmp as m\n"
         "print(s.FRAMEWORK, [c.__module__ for c in m.EcmpApp.__mro__][-2])\n")


@pytest.fixture
def stub_path(tmp_path):
    for rel, text in STUB.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def _probe(stub_path, prelude="", env_extra=None):
    env = {k: v for k, v in os.environ.items() if k != "BWFABRIC_OF_FRAMEWORK"}
    env.update(PYTHONPATH=f"{stub_path}:{ROOT}", **(env_extra or {}))
    res = subprocess.run([sys.executable, "-c", prelude + PROBE], capture_output=True, text=True, env=env)
    return res


def test_under_ryu_manager_apps_bind_to_ryu(stub_path):
    res = _probe(stub_path, prelude="import ryu.base.app_manager\n")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["ryu", "ryu.base.app_manager"]


def test_otherwise_os_ken(stub_path):
    res = _probe(stub_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["os_ken", "os_ken.base.app_manager"]


def test_forced_choice_and_bad_value(stub_path):
    res = _probe(stub_path, env_extra={"BWFABRIC_OF_FRAMEWORK": "ryu"})
    assert res.stdout.split()[0] == "ryu", res.stderr
    res = _probe(stub_path, env_extra={"BWFABRIC_OF_FRAMEWORK": "pox"})
    assert res.returncode != 0 and "BWFABRIC_OF_FRAMEWORK='pox'" in res.stderr
