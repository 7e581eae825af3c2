"""The agent's rules for a host of several VMs (issue #32 §4), on recorded
executors: the configuration's shape, one namespace per VM, names that
agree, per-VM rates, one VM's failure named while the others are put in
force. Namespaces themselves: tests/integration/test_agent_vms.py."""

from contextlib import contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hostagent.agent import MAX_VMS, Agent, config_envelope
from hostagent.executor import ExecError
from hostagent.plan import PlanError
from bwtesting.executors import RecordingExecutor


def vm(name, ns, address, g=5.0, **over):
    return {"host": "srv", "vm_id": name, "netns": ns, "nic": "srv-eth0", "interface": "eth0", "address": address,
            "nic_mbps": 100, "guarantee_mbps": g, **over}


class Host:
    """An agent whose VMs' executors and namespace entries are recorded."""

    def __init__(self, tmp_path, fail_in=()):
        self.executors, self.entered, self.fail_in = {}, [], set(fail_in)

        def factory(name, ns):
            ex = self.executors[name] = RecordingExecutor()
            if name in self.fail_in:
                def boom(plan):
                    raise ExecError("tc: RTNETLINK answers: Invalid argument")
                ex.apply = boom
            return ex

        @contextmanager
        def enter(ns):
            self.entered.append(ns)
            yield

        self.agent = Agent("srv", b"k" * 32, tmp_path / "state", executor=RecordingExecutor(),
                           executor_factory=factory, enter=enter)

    def push(self, cfg, version=1):
        with self.agent.lock:
            return self.agent._dispatch("config", {"generation": 1, "version": version, "config": cfg})


def test_each_vm_is_applied_in_its_namespace_by_its_own_executor(tmp_path):
    h = Host(tmp_path)
    reply = h.push({"vms": {"t/a": vm("t/a", "nsa", "10.1.0.1"), "t/b": vm("t/b", "nsb", "10.1.0.2", g=7)}})
    assert reply["ok"], reply
    assert set(h.executors) == {"t/a", "t/b"} and all(len(e.applied) == 1 for e in h.executors.values())
    assert {"nsa", "nsb"} <= set(h.entered)
    # the host's own executor: the NIC both share, BG before WC -- and nothing of either VM
    (nic_plan,) = h.agent.executor.applied
    assert {s.dev for s in nic_plan.steps} == {"srv-eth0"} and len(nic_plan.steps) == 7
    assert h.agent.vm("t/b").config.guarantee_mbps == 7
    st = h.agent.status()
    assert set(st["vms"]) == {"t/a", "t/b"} and st["config"] is None and st["in_force"]


def test_two_vms_in_one_namespace_are_refused_and_nothing_changes(tmp_path):
    h = Host(tmp_path)
    with pytest.raises(PlanError, match="two VMs in one network namespace"):
        h.push({"vms": {"t/a": vm("t/a", "same", "10.1.0.1"), "t/b": vm("t/b", "same", "10.1.0.2")}})
    assert not h.agent.vms and not h.executors


@pytest.mark.parametrize("raw, why", [
    ({"vms": {"t/a": vm("t/b", "nsa", "10.1.0.1")}}, "its settings name VM 't/b'"),
    ({"vms": {"t/a": vm("t/a", "nsa", "10.1.0.1")}, "x": 1}, "and nothing else"),
    ({"vms": [1]}, "and nothing else"),
    ({"vms": {"t/a": vm("t/a", "nsa", "10.1.0.1", guarantee_mbps=float("nan"))}}, "guarantee_mbps"),
    ({"vms": {f"t/v{i}": vm(f"t/v{i}", f"n{i}", "10.1.0.1") for i in range(MAX_VMS + 1)}}, "at most"),
    ({"vms": {"t/a": {**vm("t/a", "nsa", "10.1.0.1"), "vm_id": None}}}, "needs a name"),
    ({"vms": {"a/b/c": vm("a/b/c", "nsa", "10.1.0.1")}}, "vm_id"),
])
def test_a_malformed_configuration_of_vms_is_refused_by_name(raw, why):
    with pytest.raises(PlanError, match=why):
        config_envelope({"generation": 1, "version": 1, "config": raw})


def test_one_vms_failure_is_named_and_the_other_is_in_force(tmp_path):
    h = Host(tmp_path, fail_in={"t/b"})
    with pytest.raises(ExecError, match="VM t/b: applying the configuration failed"):
        h.push({"vms": {"t/a": vm("t/a", "nsa", "10.1.0.1"), "t/b": vm("t/b", "nsb", "10.1.0.2")}})
    assert set(h.agent.vms) == {"t/a"} and h.agent.vm("t/a").config is not None
    assert h.agent.generation is None            # not all of it: the controller pushes it again
    assert not (tmp_path / "state" / "vms" / "t~b").exists()


def test_a_vm_left_out_is_removed_and_forgotten(tmp_path):
    h = Host(tmp_path)
    h.push({"vms": {"t/a": vm("t/a", "nsa", "10.1.0.1"), "t/b": vm("t/b", "nsb", "10.1.0.2")}})
    assert (tmp_path / "state" / "vms" / "t~b" / "vm.json").exists()
    h.push({"vms": {"t/a": vm("t/a", "nsa", "10.1.0.1")}}, version=2)
    assert set(h.agent.vms) == {"t/a"} and h.executors["t/b"].torn_down == 1 and h.executors["t/a"].torn_down == 0
    assert not (tmp_path / "state" / "vms" / "t~b").exists()


def test_rates_for_several_vms_name_them(tmp_path):
    h = Host(tmp_path)
    h.push({"vms": {"t/a": vm("t/a", "nsa", "10.1.0.1"), "t/b": vm("t/b", "nsb", "10.1.0.2")}})
    with h.agent.lock:
        with pytest.raises(PlanError, match="send vms"):
            h.agent._dispatch("rates", {"generation": 1, "factors": {}})
        with pytest.raises(PlanError, match="not one of this host's"):
            h.agent._dispatch("rates", {"generation": 1, "vms": {"t/zz": {}}})
        reply = h.agent._dispatch("rates", {"generation": 1, "vms": {"t/a": {}, "t/b": {}}})
    assert reply["ok"] and reply["vms"] == {}            # no LRC here: nothing open


def test_a_host_that_is_its_own_vm_keeps_the_flat_form(tmp_path):
    h = Host(tmp_path)
    flat = {"host": "srv", "interface": "srv-eth0", "address": "10.0.0.1", "nic_mbps": 100, "guarantee_mbps": 5}
    assert h.push(flat)["ok"]
    assert set(h.agent.vms) == {"srv"} and len(h.agent.executor.applied) == 1 and h.entered == [None]
    st = h.agent.status()
    assert st["config"]["vm"]["guarantee_mbps"] == 5 and set(st["vms"]) == {"srv"}


def test_a_vm_of_the_hosts_own_namespace_beside_vms_in_theirs_or_two_nics_are_refused(tmp_path):
    h = Host(tmp_path)
    own = {"host": "srv", "interface": "srv-eth0", "address": "10.0.0.1", "nic_mbps": 100, "guarantee_mbps": 5}
    with pytest.raises(PlanError, match="beside VMs in namespaces of their own"):
        h.push({"vms": {"srv": own, "t/a": vm("t/a", "nsa", "10.1.0.1")}})
    with pytest.raises(PlanError, match="different NICs"):
        h.push({"vms": {"t/a": vm("t/a", "nsa", "10.1.0.1"), "t/b": vm("t/b", "nsb", "10.1.0.2", nic="eth7")}})
    assert not h.agent.vms and not h.agent.executor.applied and not h.executors


_value = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True, allow_infinity=True),
                   st.text(max_size=12), st.sampled_from(["t/a", "nsa", "10.1.0.1", "eth0", "srv", "srv-eth0"]))
_vm = st.fixed_dictionaries({}, optional={k: _value for k in ("host", "vm_id", "netns", "nic", "interface",
                                                                "address", "nic_mbps", "guarantee_mbps")})


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.dictionaries(st.one_of(st.text(max_size=8), st.sampled_from(["t/a", "t/b"])),
                                 st.one_of(_vm, st.builds(lambda n: vm(n, "ns-" + n.replace("/", "-"), "10.1.0.1"),
                                                          st.sampled_from(["t/a", "t/b"])), _value), max_size=3),
                 _value))
def test_any_vms_configuration_is_taken_whole_or_refused_by_name(vms):
    """The agent's boundary: whatever ``vms`` holds, a PlanError naming
    what is wrong, or every VM checked and named as its own settings say --
    never anything else (and nothing put in force: this is the parse)."""
    try:
        _, _, desired = config_envelope({"generation": 1, "version": 1, "config": {"vms": vms}})
    except PlanError as exc:
        assert str(exc)
        return
    assert isinstance(vms, dict) and set(desired) == set(vms)
    assert all(cfg.vm_name == name for name, cfg in desired.items())
