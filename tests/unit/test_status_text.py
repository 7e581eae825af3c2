"""``bwfabric status``'s tables: per VM, what its agent reads back -- a
host that is its own VM from the agent's top-level state, a VM in a
namespace of its own from the agent's per-VM state (issue #32 §4)."""

from bwfabric.client import status_text

STATUS = {"digest": "d", "version": 3, "generation": 7, "routing": "ecmp", "switches": 20, "hosts": 16,
          "tenants": 2, "vms": 3, "load_errors": 0}
TENANTS = {"t": {"policy": "guarantee", "wc_subflows": 1,
                 "vms": {"a": {"host": "h1", "guarantee_mbps": 2, "weight": 1, "netns": "na", "address": "10.1.1.1"},
                         "b": {"host": "h1", "guarantee_mbps": 3, "weight": 1, "netns": "nb", "address": "10.1.1.2"}}},
           "u": {"policy": "equal", "wc_subflows": 0,
                 "vms": {"c": {"host": "h2", "guarantee_mbps": 1, "weight": 1, "netns": None, "address": None}}}}
AGENT = {"connected": True, "version_in_force": 3, "pushes": 1, "push_failures": 0, "last_error": None}
AGENTS = [{**AGENT, "host": "h1", "in_force": False, "bg_rate_bps": None,
           "vms": {"t/a": {"in_force": True, "bg_rate_bps": 2.0e6}, "t/b": {"in_force": False, "bg_rate_bps": None}}},
          {**AGENT, "host": "h2", "in_force": True, "bg_rate_bps": 0.5e6, "vms": {}}]


def test_each_vm_shows_its_own_read_back():
    text = status_text(STATUS, AGENTS, TENANTS)
    rows = {line.split()[1]: line.split() for line in text.splitlines() if line.split()[:1] in (["t"], ["u"])}
    assert rows["a"][3] == "10.1.1.1" and rows["a"][-2:] == ["yes", "2.00"]
    assert rows["b"][-2:] == ["NO", "-"]
    assert rows["c"][3] == "(host's)" and rows["c"][-2:] == ["yes", "0.50"]
