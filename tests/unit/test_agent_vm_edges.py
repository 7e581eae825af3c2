"""One VM's state at the agent (hostagent.agent.Vm), the edges the mutation
pass of 2026-11-29 found untested: what a rollback applies and checks, the
words of its outcome and of the DEGRADED log line, LRC's A_l and limits
carried into the plan, the measured buffer kept, the pair slots read on the
VM's own interface, and each VM's executor made for its own namespace."""

from __future__ import annotations

import logging
import time

import pytest

from bwcommon.policy import fixed_point
from hostagent import agent as A
from hostagent import plan as P
from hostagent.executor import ExecError
from bwtesting.executors import KernelModel

ME, PEER2 = "10.9.0.1", "10.9.0.2"


def cfg(lrc_wc: str | None = None, **over) -> P.HostConfig:
    raw = {"host": "ns", "interface": "ag0", "address": ME, "nic_mbps": 100, "guarantee_mbps": 40,
           "wc_subflows": 1, "join_port_base": 10100, **over}
    if lrc_wc:
        raw["lrc"] = {"mode": "combined", "wc": lrc_wc, "weight": 1.0, "params": {"alpha": 20.0, "pair_idle_s": 5.0},
                      "peers": {PEER2: {"weight": 1.0, "guarantee_mbps": 20}}}
    return P.HostConfig.from_dict(raw)


class Failing(KernelModel):
    """A kernel model whose next ``fail`` applies raise ``exc``; teardown
    leaves ``leftovers``."""

    def __init__(self):
        super().__init__()
        self.fail, self.exc = 0, ExecError("tc: RTNETLINK answers: No buffer space available")
        self.checked: list = []

    def apply(self, plan) -> int:
        if self.fail:
            self.fail -= 1
            raise self.exc
        return super().apply(plan)

    def differences(self, plan) -> list[str]:
        self.checked.append(plan)
        return super().differences(plan)


def _sysctl(plan, name):
    return next(s.value for s in plan.of(P.Sysctl) if s.key == name)


def test_a_fresh_vm_has_nothing_degraded_and_no_slots_read():
    vm = A.Vm("v", KernelModel())
    assert vm.degraded is None and vm.lrc_slots is None and vm.lrc_in_force == {}


def test_a_rollback_puts_back_and_checks_the_previous_plan_with_its_buffer():
    ex = Failing()
    vm = A.Vm("v", ex)
    vm.put_in_force(cfg(), 262144)
    first = ex.applied[-1]
    ex.fail = 1
    with pytest.raises(ExecError) as err:
        vm.put_in_force(cfg(guarantee_mbps=30), 131072)
    assert str(err.value) == ("applying the configuration failed (tc: RTNETLINK answers: No buffer space "
                              "available); the previous one is in force (verified)")
    # the way back: the first plan, its measured buffer included, applied and then checked
    assert ex.applied[-1] == first and ex.checked[-1] == first
    assert "262144" in _sysctl(first, "net.ipv4.tcp_rmem")
    assert vm.config == cfg() and vm.rcvbuf == 262144 and vm.degraded is None
    assert vm.lrc_slots is None          # the failed apply may have moved slots: unread until the next apply


def test_an_exception_that_is_not_the_executors_is_named_by_its_type():
    ex = Failing()
    vm = A.Vm("v", ex)
    ex.fail, ex.exc = 1, OSError("netlink socket closed")
    with pytest.raises(ExecError) as err:
        vm.put_in_force(cfg(), None)
    assert str(err.value) == ("applying the configuration failed (OSError: netlink socket closed); "
                              "nothing is in force (verified)")


def test_leftovers_after_a_first_configuration_failed_are_degraded_and_logged(caplog):
    ex = Failing()
    ex.leftovers = [f"qdisc {i}" for i in range(7)]
    vm = A.Vm("tenant/vm1", ex)
    ex.fail = 1
    with caplog.at_level(logging.ERROR, logger=A.log.name), pytest.raises(ExecError, match="degraded"):
        vm.put_in_force(cfg(), None)
    assert vm.config is None
    assert vm.degraded == ("tc: RTNETLINK answers: No buffer space available; rollback failed: kernel differs "
                           "after the rollback: qdisc 0; qdisc 1; qdisc 2; qdisc 3; qdisc 4")
    [rec] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert rec.getMessage() == f"DEGRADED (tenant/vm1): {vm.degraded}"


def test_lrc_competition_sets_a_l_in_the_plan_and_ceiling_leaves_the_policys():
    ex = KernelModel()
    vm = A.Vm("v", ex)
    vm.put_with_lrc(cfg("competition"))
    assert vm.lrc_a_l == 0.0                                  # no pair open: no excess
    assert ex.bpf[(P.BPF_MAP, ME)] == fixed_point(0.0) != fixed_point(cfg("competition").a_l)
    assert ex.calls[0] == ("pair_slots", "ag0") and vm.lrc_slots == {}
    ex2 = KernelModel()
    vm2 = A.Vm("v", ex2)
    vm2.put_with_lrc(cfg("ceiling"))
    assert vm2.lrc_a_l is None and ex2.bpf[(P.BPF_MAP, ME)] == fixed_point(cfg("ceiling").a_l)


def test_a_reconfiguration_carries_the_open_pairs_limits_at_this_moment_and_the_measured_buffer():
    ex = KernelModel()
    vm = A.Vm("v", ex)
    vm.put_with_lrc(cfg("competition"))
    from hostagent.lrc import Entry, Timeouts
    now = time.monotonic()
    vm.lrc_round([Entry(ME, PEER2, 17, False, False, Timeouts.read().udp)], now=now)
    assert set(vm.lrc_in_force) == {PEER2}
    vm.lrc.set_terms({PEER2: [60.0, 2.0, 40.0]}, now)          # rate factors received: their age counts
    vm.rcvbuf = 524288
    carried = vm.lrc
    vm.put_with_lrc(cfg("competition", guarantee_mbps=35))
    assert vm.lrc is carried and set(vm.lrc_in_force) == {PEER2}        # the pair still open: its limit kept
    assert vm.lrc_in_force == carried.limits(time.monotonic())           # as of the reconfiguration
    assert vm.lrc_a_l == carried.competition(time.monotonic(), cfg("competition").unit_mbps)
    assert "524288" in _sysctl(ex.in_force, "net.ipv4.tcp_rmem") and vm.rcvbuf == 524288
    # the slots read back after each apply: on the VM's own interface, every time
    reads = [dev for call, dev in ex.calls if call == "pair_slots"]
    assert len(reads) >= 4 and set(reads) == {"ag0"} and vm.lrc_slots == ex.slots


def test_each_vms_executor_is_made_for_its_own_namespace(tmp_path):
    made = []
    a = A.Agent("srv", bytes(32), tmp_path / "state", executor=KernelModel(),
                executor_factory=lambda name, ns: made.append((name, ns)) or KernelModel())
    c = P.HostConfig.from_dict({"host": "srv", "vm_id": "t/a", "netns": "ns-a", "nic": "eth9", "interface": "eth0",
                                "address": "10.9.0.5", "nic_mbps": 100, "guarantee_mbps": 10})
    a._vm(c)
    assert made == [("t/a", "ns-a")]


def test_a_fresh_agent_keeps_its_executors_state_in_its_state_directory(tmp_path):
    from hostagent.executor import Executor
    a = A.Agent("srv", bytes(32), tmp_path / "state")
    assert isinstance(a.executor, Executor) and a.executor.state_file == tmp_path / "state" / "executor.json"
    assert a.version is None and a.rates is None and a.stopping is False


def test_remembered_vms_come_back_with_their_namespaces_and_an_unreadable_one_is_named(tmp_path, caplog):
    """An agent restarted finds the VMs an earlier run configured in
    namespaces (their state directories) -- each with an executor for its
    own namespace; a corrupt record is logged by its path and skipped, the
    others still come back. (No ``vms`` directory at all: none.)"""
    state = tmp_path / "state"
    for d, text in (("a~bad", "{not json"), ("t~b", '{"name": "t/b", "netns": "ns-b"}'),
                    ("t~c", '{"name": "t/c", "netns": "ns-c"}')):
        (state / "vms" / d).mkdir(parents=True)
        (state / "vms" / d / "vm.json").write_text(text)
    made = []
    with caplog.at_level(logging.ERROR, logger=A.log.name):
        a = A.Agent("srv", bytes(32), state, executor=KernelModel(),
                    executor_factory=lambda name, ns: made.append((name, ns)) or KernelModel())
    assert made == [("t/b", "ns-b"), ("t/c", "ns-c")]
    assert {n: a.vms[n].netns for n in ("t/b", "t/c")} == {"t/b": "ns-b", "t/c": "ns-c"}
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == [
        f"{state / 'vms' / 'a~bad' / 'vm.json'}: unreadable; that VM's leftovers are not removed"]


@pytest.mark.parametrize("text, ok", [("0", True), (str(2**63 - 1), True), ("-1", False), (str(2**63), False),
                                      ("12x", False)])
def test_a_persisted_counter_is_read_in_range_or_refused_by_name(tmp_path, text, ok):
    p = tmp_path / "generation"
    p.write_text(text + "\n")
    if ok:
        assert A._read_int(p) == int(text)
    else:
        with pytest.raises(ValueError, match="corrupt agent state"):
            A._read_int(p)
    assert A._read_int(tmp_path / "absent") == 0
