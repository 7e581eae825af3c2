"""The agent's periodic rounds in-process, against a model of the kernel
(tests.unit.agents_inprocess.KernelModel): LRC's τ_v round (pairs opening
and closing, the rates-only path, the marker's bucket path, A_l, repairs
when the kernel is not what the last apply left), Eq. 1's buffer round,
the rounds' loops (one VM's failure never stops another's, shutdown ends
them), conntrack's fallbacks, and the daemon's ``main``. The same rounds
against a real kernel: tests/integration/test_agent_lrc*.py and
agent_scenarios.lrc_pairs*."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
import time
import types
from contextlib import contextmanager, nullcontext

import pytest

from bwcommon.policy import fixed_point
from hostagent import agent as A
from hostagent import plan as P
from hostagent.executor import ExecError
from hostagent.lrc import Entry, Timeouts
from bwtesting.executors import KernelModel

ME, PEER2, PEER3 = "10.9.0.1", "10.9.0.2", "10.9.0.3"
PEERS = {PEER2: {"weight": 1.0, "guarantee_mbps": 40}, PEER3: {"weight": 3.0, "guarantee_mbps": 40}}
UDP = 17
KEY = bytes(range(32))


def cfg(wc="ceiling", marker=False, mode="combined", lrc=True, **over) -> P.HostConfig:
    raw = {**dict(host="ns", interface="ag0", address=ME, nic_mbps=100, guarantee_mbps=40, wc_subflows=1,
                  join_port_base=10100, demote_bg=marker), **over}
    if lrc:
        raw["lrc"] = {"mode": mode, "wc": wc, "weight": 1.0, "params": {"alpha": 20.0, "pair_idle_s": 1.0},
                      "peers": PEERS}
    return P.HostConfig.from_dict(raw)


def sending(*peers) -> list[Entry]:
    """Fresh UDP entries from this VM to ``peers`` (no byte counts: active by idle time alone)."""
    return [Entry(ME, p, UDP, False, False, Timeouts.read().udp) for p in peers]


def vm_with(c: P.HostConfig) -> tuple[A.Vm, KernelModel]:
    ex = KernelModel()
    vm = A.Vm("ns", ex)
    vm.put_with_lrc(c)
    return vm, ex


def bps(mbps: float) -> int:
    """A limit as an HTB class rate (at least MIN_CLASS_BPS)."""
    return max(int(mbps * 1e6), P.MIN_CLASS_BPS)


def pair_classes(ex: KernelModel) -> dict[str, int]:
    return {k: c.rate_bps for k, c in ex.classes.items() if A._pair_class(k)}


# ---- LRC's round ------------------------------------------------------------------------------
def test_no_round_without_lrc_a_config_or_when_degraded():
    vm, ex = vm_with(cfg(lrc=False))
    assert vm.lrc_round(sending(PEER2), now=1.0) == "idle"
    assert A.Vm("x", KernelModel()).lrc_round(sending(PEER2), now=1.0) == "idle"
    vm, ex = vm_with(cfg())
    vm.degraded = "rollback failed"
    n = len(ex.calls)
    assert vm.lrc_round(sending(PEER2), now=1.0) == "idle" and len(ex.calls) == n


def test_a_pair_opening_applies_the_whole_plan_with_its_classes_and_closing_removes_them():
    vm, ex = vm_with(cfg())
    assert pair_classes(ex) == {}
    t = time.monotonic()
    assert vm.lrc_round(sending(PEER2), now=t) == "pairs"
    assert set(vm.lrc_in_force) == {PEER2}
    # the plan's classes for the pair: its BG class (slot 0) and its WC ceiling, at the limits in force
    lim = vm.lrc_in_force[PEER2]
    assert pair_classes(ex) == {f"1:{P.PAIR_CLASS_BASE:x}": bps(lim.bg_mbps),
                                f"1:{P.WC_PAIR_CLASS_BASE:x}": bps(lim.wc_mbps)}
    assert ex.slots == {PEER2: 0} and vm.lrc_slots == {PEER2: 0}
    # nothing sent for longer than pair_idle_s (1 s): the pair closes, its classes go
    assert vm.lrc_round([], now=t + 1.5) == "pairs"
    assert vm.lrc_in_force == {} and pair_classes(ex) == {}


def test_same_pairs_take_the_rates_only_path_for_the_moved_pairs_classes():
    vm, ex = vm_with(cfg())
    t = time.monotonic()
    vm.lrc_round(sending(PEER2, PEER3), now=t)
    applies = len(ex.made("apply"))
    before = dict(vm.lrc_in_force)
    # the controller's factor for .2 only: v of .2 moves, .3's does not
    vm.lrc.set_terms({PEER2: [60.0, 2.0, 40.0]}, t)
    assert vm.lrc_round(sending(PEER2, PEER3), now=t + 0.2) == "rates"
    assert len(ex.made("apply")) == applies                     # no whole apply
    changed = ex.made("change_rates")[-1]
    assert changed and all(A._pair_class(c.classid) for c in changed)
    slot2 = vm.lrc_slots[PEER2]
    assert {c.classid for c in changed} <= {f"1:{P.PAIR_CLASS_BASE + s:x}" for s in vm.lrc_slots.values()} | \
        {f"1:{P.WC_PAIR_CLASS_BASE + s:x}" for s in vm.lrc_slots.values()}
    assert vm.lrc_in_force[PEER2] != before[PEER2]
    assert ex.classes[f"1:{P.WC_PAIR_CLASS_BASE + slot2:x}"].rate_bps == bps(vm.lrc_in_force[PEER2].wc_mbps)
    assert ex.made("set_buckets")[-1] == ([], [])               # no marker: no buckets
    # nothing moved by more than 0.5 %: nothing done at all
    n = len(ex.calls)
    vm.lrc_in_force = vm.lrc.limits(t + 0.2)
    assert vm.lrc_round(sending(PEER2, PEER3), now=t + 0.2) == "idle" and len(ex.calls) == n


def test_a_class_not_where_the_apply_left_it_repairs_with_the_whole_plan():
    vm, ex = vm_with(cfg())
    t = time.monotonic()
    vm.lrc_round(sending(PEER2), now=t)
    vm.lrc.set_terms({PEER2: [60.0, 2.0, 40.0]}, t)
    del ex.classes[f"1:{P.WC_PAIR_CLASS_BASE:x}"]          # someone removed it behind the agent's back
    applies = len(ex.made("apply"))
    assert vm.lrc_round(sending(PEER2), now=t + 0.2) == "pairs"
    assert vm.lrc_repairs == 1 and len(ex.made("apply")) == applies + 1
    assert pair_classes(ex)[f"1:{P.WC_PAIR_CLASS_BASE:x}"] == bps(vm.lrc_in_force[PEER2].wc_mbps)


def test_a_failed_apply_for_a_new_pair_keeps_the_limits_in_force_and_raises():
    vm, ex = vm_with(cfg())
    t = time.monotonic()
    vm.lrc_round(sending(PEER2), now=t)
    before = dict(vm.lrc_in_force)
    ex.fail_next.add("apply")
    with pytest.raises(ExecError, match="applying the configuration failed"):
        vm.lrc_round(sending(PEER2, PEER3), now=t + 0.1)
    assert vm.lrc_in_force == before


def test_with_the_marker_pairs_open_and_close_by_their_buckets_alone():
    vm, ex = vm_with(cfg(wc="competition", marker=True))
    t = time.monotonic()
    applies = len(ex.made("apply"))
    assert vm.lrc_round(sending(PEER2), now=t) == "pairs"
    assert len(ex.made("apply")) == applies and vm.lrc_pairs_fast == 1
    buckets, removed = ex.made("set_buckets")[-1]
    assert [(b.src, b.dst) for b in buckets] == [(ME, PEER2)] and removed == []
    assert buckets[0].rate_Bps == max(int(vm.lrc_in_force[PEER2].bg_mbps * 1e6), P.MIN_CLASS_BPS) // 8
    # a second pair: only its bucket is written (the first did not move)
    assert vm.lrc_round(sending(PEER2, PEER3), now=t + 0.05) == "pairs"
    buckets, removed = ex.made("set_buckets")[-1]
    assert PEER3 in {b.dst for b in buckets} and removed == []
    # idle: the closed pairs' buckets are removed, by (src, dst)
    assert vm.lrc_round([], now=t + 2.0) == "pairs"
    buckets, removed = ex.made("set_buckets")[-1]
    assert buckets == [] and sorted(removed) == [(ME, PEER2), (ME, PEER3)]
    assert vm.lrc_in_force == {} and vm.lrc_pairs_fast == 3 and len(ex.made("apply")) == applies
    assert (ME, PEER2) not in ex.buckets and (ME, PEER3) not in ex.buckets


def test_a_bucket_that_is_not_there_falls_back_to_the_whole_plan():
    vm, ex = vm_with(cfg(wc="competition", marker=True))
    t = time.monotonic()
    vm.lrc_round(sending(PEER2), now=t)
    ex.buckets.pop((ME, PEER2))                    # gone behind the agent's back
    applies = len(ex.made("apply"))
    assert vm.lrc_round([], now=t + 2.0) == "pairs"
    assert vm.lrc_repairs == 1 and vm.lrc_pairs_fast == 1 and len(ex.made("apply")) == applies + 1
    assert vm.lrc_in_force == {}


def test_the_marker_with_wc_ceilings_changes_the_htb_tree():
    """A pair with a WC ceiling of its own has an HTB class: not a bucket alone."""
    vm, ex = vm_with(cfg(wc="ceiling", marker=True))
    t = time.monotonic()
    applies = len(ex.made("apply"))
    assert vm.lrc_round(sending(PEER2), now=t) == "pairs"
    assert vm.lrc_pairs_fast == 0 and len(ex.made("apply")) == applies + 1
    assert f"1:{P.WC_PAIR_CLASS_BASE:x}" in ex.classes and (ME, PEER2) in ex.buckets


def test_the_competition_level_is_written_when_it_moves_by_more_than_2_percent():
    vm, ex = vm_with(cfg(wc="competition", marker=True))
    t = time.monotonic()
    vm.lrc_round(sending(PEER2), now=t)
    written = ex.made("apply_bpf")
    # a factor above the guarantee: v climbs past B, the excess (A_l) grows round by round
    vm.lrc.set_terms({PEER2: [90.0, 2.0, 40.0]}, t)
    for k in range(1, 6):
        vm.lrc_round(sending(PEER2), now=t + 0.05 * k)
    a_l = vm.lrc.competition(t + 0.25, vm.config.unit_mbps)
    steps = ex.made("apply_bpf")
    assert len(steps) > len(written)
    last = steps[-1]
    assert (last.map, last.key_ipv4) == (P.BPF_MAP, ME)
    assert last.value == fixed_point(vm.lrc_a_l)
    assert vm.lrc_a_l == pytest.approx(a_l, rel=0.02, abs=0.005)
    # a move under 2 % is not written, one of 5 % is
    assert a_l > 0.5
    n = len(steps)
    vm.lrc_a_l = a_l * 1.01
    vm.lrc_in_force = vm.lrc.limits(t + 0.25)
    assert vm.lrc_round(sending(PEER2), now=t + 0.25) == "idle"
    assert len(ex.made("apply_bpf")) == n
    vm.lrc_a_l = a_l * 1.05
    assert vm.lrc_round(sending(PEER2), now=t + 0.25) == "competition"
    assert len(ex.made("apply_bpf")) == n + 1 and vm.lrc_a_l == pytest.approx(a_l)


def test_the_competition_level_alone_moving_is_reported():
    vm, ex = vm_with(cfg(wc="competition", marker=True))
    t = time.monotonic()
    vm.lrc_round(sending(PEER2), now=t)
    vm.lrc_in_force = vm.lrc.limits(t)
    vm.lrc_a_l = 50.0                                   # far from what LRC computes
    assert vm.lrc_round(sending(PEER2), now=t) == "competition"
    assert ex.made("apply_bpf")[-1].value == fixed_point(vm.lrc_a_l) and vm.lrc_a_l != 50.0


def test_close_is_half_a_percent_relative_and_none_only_equals_none():
    L = P.PairLimit
    assert A._close(L(10.0, 5.0), L(10.05, 5.0))
    assert not A._close(L(10.0, 5.0), L(10.06, 5.0))
    assert A._close(L(10.0, 5.0), L(10.0, 5.025)) and not A._close(L(10.0, 5.0), L(10.0, 5.03))
    assert A._close(L(10.0, None), L(10.0, None))
    assert not A._close(L(10.0, None), L(10.0, 5.0)) and not A._close(L(10.0, 5.0), L(10.0, None))
    assert A._close(L(0.0), L(0.000005)) and not A._close(L(0.0), L(0.00001))
    assert A._close(L(-10.0), L(-10.04)) and not A._close(L(-10.0), L(-10.06))
    # relative to the larger of the two, either way round
    assert A._close(L(10.0), L(9.9502)) and A._close(L(9.9502), L(10.0))
    assert A._close(L(10.0), L(10.0), rel=0.0) and not A._close(L(10.0), L(10.01), rel=0.0005)


def test_pair_classes_are_the_pair_slots_bg_and_wc_only():
    assert A._pair_class(f"1:{P.PAIR_CLASS_BASE:x}") and A._pair_class(f"1:{P.PAIR_CLASS_BASE + 511:x}")
    assert A._pair_class(f"1:{P.WC_PAIR_CLASS_BASE:x}") and A._pair_class(f"1:{P.WC_PAIR_CLASS_BASE + 511:x}")
    assert not A._pair_class(P.CLASS_BG) and not A._pair_class(P.CLASS_WC) and not A._pair_class(P.CLASS_ROOT)
    assert not A._pair_class(f"1:{P.PAIR_CLASS_BASE - 1:x}") and not A._pair_class(f"1:{P.WC_PAIR_CLASS_BASE + 512:x}")


def test_pair_limits_survive_a_reconfiguration_that_keeps_lrc():
    vm, ex = vm_with(cfg())
    t = time.monotonic()
    vm.lrc_round(sending(PEER2), now=t)
    lrc = vm.lrc
    vm.put_with_lrc(cfg(guarantee_mbps=30))
    assert vm.lrc is lrc and set(vm.lrc_in_force) == {PEER2}
    vm.put_with_lrc(cfg(lrc=False))
    assert vm.lrc is None and vm.lrc_in_force == {} and vm.lrc_a_l is None
    ex.fail_next.add("apply")
    with pytest.raises(ExecError):
        vm.put_with_lrc(cfg())
    assert vm.lrc is None and vm.lrc_in_force == {}


# ---- conntrack ------------------------------------------------------------------------------
class FakeTable:
    """hostagent.conntrack.VmConntrack's surface; ``fail`` raises on open or on a dump."""
    opened: list = []

    def __init__(self, address, fail_open=False, fail_dump=False):
        if fail_open:
            raise OSError("netlink: Operation not supported")
        self.address, self.fail_dump, self.closed = address, fail_dump, False
        FakeTable.opened.append(self)

    def entries(self):
        if self.fail_dump:
            raise OSError("netlink dump interrupted")
        return [Entry(self.address, PEER2, UDP, False, False, 30)]

    def close(self):
        self.closed = True


def test_conntrack_by_netlink_then_the_whole_table_when_netlink_fails(monkeypatch):
    import hostagent.conntrack as C
    import hostagent.lrc as L
    FakeTable.opened = []
    whole = [Entry(ME, PEER3, UDP, False, False, 30), Entry("10.9.0.7", "10.9.0.8", UDP, False, False, 30),
             Entry(PEER2, ME, UDP, False, False, 30)]
    monkeypatch.setattr(L, "read_conntrack", lambda: list(whole))
    vm = A.Vm("ns", KernelModel())
    monkeypatch.setattr(C, "VmConntrack", FakeTable)
    assert [e.daddr for e in vm._conntrack(ME)] == [PEER2]
    first = vm.conntrack
    assert vm._conntrack(ME) and vm.conntrack is first and len(FakeTable.opened) == 1   # kept open
    # the address changed: the old one closed, a new one opened
    vm._conntrack("10.9.0.5")
    assert first.closed and vm.conntrack.address == "10.9.0.5" and len(FakeTable.opened) == 2
    # a dump that fails: this round from the whole table (this VM's entries only), reopened next round
    vm.conntrack.fail_dump = True
    failing = vm.conntrack
    assert vm._conntrack("10.9.0.5") == [] and failing.closed and vm.conntrack is None
    assert [(e.saddr, e.daddr) for e in vm._conntrack(ME)] == [(ME, PEER2)]
    assert vm.conntrack is not None and not vm.conntrack_failed


def test_conntrack_without_netlink_filtering_reads_the_whole_table_and_does_not_retry(monkeypatch):
    import hostagent.conntrack as C
    import hostagent.lrc as L
    tried = []
    whole = [Entry(ME, PEER3, UDP, False, False, 30), Entry("10.9.0.7", "10.9.0.8", UDP, False, False, 30),
             Entry(PEER2, ME, UDP, False, False, 30)]

    def unavailable(address):
        tried.append(address)
        raise OSError("kernel before 5.8")
    monkeypatch.setattr(C, "VmConntrack", unavailable)
    monkeypatch.setattr(L, "read_conntrack", lambda: list(whole))
    vm = A.Vm("ns", KernelModel())
    assert [(e.saddr, e.daddr) for e in vm._conntrack(ME)] == [(ME, PEER3), (PEER2, ME)]
    assert vm.conntrack_failed and vm.conntrack is None
    vm._conntrack(ME)
    assert tried == [ME]                               # not tried again
    # a round without entries given reads them itself
    vm.put_with_lrc(cfg())
    assert vm.lrc_round(now=time.monotonic()) == "pairs" and set(vm.lrc_in_force) == {PEER2, PEER3}


def test_removing_a_vm_closes_its_conntrack(monkeypatch):
    import hostagent.conntrack as C
    monkeypatch.setattr(C, "VmConntrack", FakeTable)
    vm, ex = vm_with(cfg())
    vm._conntrack(ME)
    table = vm.conntrack
    vm.remove()
    assert table.closed and vm.conntrack is None and vm.lrc is None and vm.config is None


# ---- Eq. 1's buffer --------------------------------------------------------------------------
SS = ("ESTAB 0 0 10.9.0.1:5001 10.9.0.2:40000\n\t cubic wscale:7,7 rto:300 rtt:{rtt}/2 mss:1448 "
      "cwnd:10 bytes_acked:1000 delivery_rate 25050010bps tcp-ulp-mptcp flags:Jec\n")


def test_the_buffer_round_reapplies_when_eq1_moves_and_not_without_a_config():
    assert A.Vm("x", KernelModel()).refresh_buffer(SS.format(rtt=80.0), now=1.0) is False
    vm, ex = vm_with(cfg(lrc=False))
    applies = len(ex.made("apply"))
    assert vm.refresh_buffer(SS.format(rtt=400.0), now=1.0) is True
    assert vm.rcvbuf is not None and len(ex.made("apply")) == applies + 1
    assert vm.rcvbuf == pytest.approx(vm.config.beta * 0.4 * 100e6 / 8, rel=0.05)
    first = vm.rcvbuf
    sysctls = {s.key: s.value for s in ex.made("apply")[-1].of(P.Sysctl)}
    assert str(first) in " ".join(str(v) for v in sysctls.values())
    # the same RTT: within 20 %, nothing re-applied
    assert vm.refresh_buffer(SS.format(rtt=400.0), now=2.0) is False and len(ex.made("apply")) == applies + 1


# ---- the agent's rounds, per VM --------------------------------------------------------------
def host(tmp_path, *names):
    """An agent with VMs ``names`` in namespaces of their own, each on a KernelModel."""
    models = {}

    def factory(name, ns):
        return models.setdefault(name, KernelModel())
    a = A.Agent("srv", KEY, tmp_path / "state", executor=KernelModel(), executor_factory=factory,
                enter=lambda ns: nullcontext())
    for k, name in enumerate(names):
        c = P.HostConfig.from_dict({"host": "srv", "vm_id": name, "netns": f"ns-{name}", "nic": "eth9",
                                    "interface": "eth0", "address": f"10.9.0.{k + 1}", "nic_mbps": 100,
                                    "guarantee_mbps": 10, "wc_subflows": 1, "join_port_base": 10100,
                                    "lrc": {"mode": "combined", "wc": "ceiling", "weight": 1.0,
                                            "params": {"tau_v_s": 0.01, "pair_idle_s": 1.0},
                                            "peers": {"10.9.0.99": {"weight": 1.0, "guarantee_mbps": 1}}}})
        a._vm(c).put_with_lrc(c)
    return a, models


def recorded(entered: list):
    """A namespace entry that records each namespace entered (none is entered)."""
    @contextmanager
    def enter(ns):
        entered.append(ns)
        yield
    return enter


def test_rounds_name_their_vm_and_stop_when_the_agent_stops(tmp_path):
    a, models = host(tmp_path, "a", "b")
    t = time.monotonic()
    seen = []
    a.vms["a"].lrc_round = lambda entries, now: seen.append(("a", entries, now)) or "rates"
    assert a.lrc_round([1], t, vm="a") == "rates" and seen == [("a", [1], t)]
    assert a.lrc_round(vm="nobody") == "idle"
    assert a.lrc_round() == "idle"                     # two VMs: none named, none chosen
    a.vms["b"].refresh_buffer = lambda text, now: True
    assert a.refresh_buffer("x", vm="b") is True and a.refresh_buffer("x", vm="a") is False
    a.stopping = True
    assert a.lrc_round([1], t, vm="a") == "idle" and len(seen) == 1


def test_the_ese_round_runs_only_for_mptcp_d(tmp_path, monkeypatch):
    import hostagent.ese as E
    made = []

    class Closer:
        def __init__(self, addresses):
            made.append(addresses)
            self.closed, self.failed, self.result = [], 0, True

        def round(self):
            return self.result
    monkeypatch.setattr(E, "EseCloser", Closer)
    a, models = host(tmp_path, "a")
    assert a.ese_round() == "idle" and made == []                 # bgwc: no ESE
    vm = a.vms["a"]
    vm.config = vm.config.model_copy(update={"mptcp_cc": "mptcp_d"})
    assert a.ese_round() == "closed" and made == [["10.9.0.1"]]
    vm.ese.result = False
    assert a.ese_round(vm="a") == "idle" and len(made) == 1         # one closer per address
    vm.config = vm.config.model_copy(update={"address": "10.9.0.7"})
    a.ese_round()
    assert made[-1] == ["10.9.0.7"] and vm.ese_address == "10.9.0.7"
    assert a.status()["vms"]["a"]["ese"]["closed"] == 0


def run_loop(loop, until, timeout=10.0):
    """Run ``loop`` in a thread until ``until()`` holds (or ``timeout``)."""
    th = threading.Thread(target=loop, daemon=True)
    th.start()
    deadline = time.monotonic() + timeout
    while not until() and time.monotonic() < deadline:
        time.sleep(0.01)
    return th


def test_the_lrc_loop_survives_one_vms_failing_rounds_and_ends_at_shutdown(tmp_path, caplog):
    a, models = host(tmp_path, "a", "b")
    rounds = {"a": 0, "b": 0}

    def boom(entries, now):
        rounds["a"] += 1
        raise RuntimeError("conntrack went away")

    def fine(entries, now):
        rounds["b"] += 1
        return "idle"
    a.vms["a"].lrc_round, a.vms["b"].lrc_round = boom, fine
    with caplog.at_level(logging.ERROR, logger="bwfabric.agent"):
        th = run_loop(a.lrc_loop, lambda: rounds["a"] >= 3 and rounds["b"] >= 3)
        assert rounds["a"] >= 3 and rounds["b"] >= 3
        stats = a.lrc_loops.as_dict()
        assert stats["lrc a"]["errors"] >= 3 and "conntrack went away" in stats["lrc a"]["last_error"]
        assert stats["lrc b"]["errors"] == 0 and set(stats) == {"lrc a", "lrc b"}
        # status shows each VM's loop
        assert a.status()["vms"]["a"]["lrc"]["loop"]["errors"] >= 3
        a.shutdown()
        th.join(5)
    assert not th.is_alive()
    assert "lrc a: round" in caplog.text


def test_the_lrc_loop_sleeps_the_shortest_tau_v(tmp_path):
    a, models = host(tmp_path, "a")
    stamps = []
    a.vms["a"].lrc_round = lambda entries, now: stamps.append(time.monotonic()) or "idle"
    th = run_loop(a.lrc_loop, lambda: len(stamps) >= 20)
    a.shutdown()
    th.join(5)
    assert len(stamps) >= 20 and not th.is_alive()
    # τ_v = 10 ms: 20 rounds within a second (the 0.5 s default would take 10 s)
    assert stamps[19] - stamps[0] < 5.0


def test_the_ese_and_buffer_loops_go_on_past_a_failing_round_and_end_at_shutdown(tmp_path):
    a, models = host(tmp_path, "a", "b")
    calls = {"ese": 0, "buffer": 0}

    def ese(vm=None):
        calls["ese"] += 1
        raise OSError("bpf map gone")
    a.ese_round = ese
    th = run_loop(lambda: a.ese_loop(period_s=0.005), lambda: calls["ese"] >= 4)
    assert calls["ese"] >= 4                            # ese_round itself, per VM
    assert a.ese_loops.as_dict()["ese a"]["errors"] >= 2 and a.ese_loops.as_dict()["ese b"]["errors"] >= 1
    texts = []

    def refresh(text, now=None, vm=None):
        calls["buffer"] += 1
        texts.append((vm, text))
        if vm == "a":
            raise ValueError("unparsable")
        return False
    a.refresh_buffer = refresh
    tb = run_loop(lambda: a.buffer_loop(period_s=0.005), lambda: calls["buffer"] >= 4)
    a.shutdown()
    th.join(5)
    tb.join(5)
    assert not th.is_alive() and not tb.is_alive()
    assert {vm for vm, _ in texts} == {"a", "b"} and all(isinstance(t, str) for _, t in texts)
    assert a.buffer_loops.as_dict()["buffer a"]["errors"] >= 1 and a.buffer_loops.as_dict()["buffer b"]["errors"] == 0


def test_the_buffer_loop_skips_vms_without_a_configuration(tmp_path):
    a, models = host(tmp_path, "a", "b")
    a.vms["a"].config = None
    got = []
    a.refresh_buffer = lambda text, now=None, vm=None: got.append(vm)
    th = run_loop(lambda: a.buffer_loop(period_s=0.005), lambda: len(got) >= 3)
    a.shutdown()
    th.join(5)
    assert got and set(got) == {"b"}


# ---- the daemon ------------------------------------------------------------------------------
def test_main_refuses_a_missing_key_by_name(tmp_path, capsys):
    assert A.main("h", str(tmp_path / "nokey"), f"unix:{tmp_path}/a.sock", str(tmp_path / "st")) == 2
    err = capsys.readouterr().err
    assert err.startswith("bwfabric agent:") and "nokey" in err


def _keyfile(tmp_path, mode=0o600):
    from bwcommon.channel import host_key
    key = host_key(bytes(range(32)), "h")
    keyfile = tmp_path / "h.key"
    keyfile.write_bytes(key.hex().encode() + b"\n")
    keyfile.chmod(mode)
    return key, keyfile


def test_main_refuses_a_key_others_may_read(tmp_path, capsys):
    key, keyfile = _keyfile(tmp_path, 0o644)
    assert A.main("h", str(keyfile), f"unix:{tmp_path}/a.sock", str(tmp_path / "st")) == 2
    assert "chmod 600" in capsys.readouterr().err and not (tmp_path / "a.sock").exists()


def test_open_agent_keeps_the_executors_state_in_the_state_dir_and_its_maps_where_told(tmp_path):
    from hostagent.executor import Executor
    key, keyfile = _keyfile(tmp_path)
    agent, server = A.open_agent("h", str(keyfile), f"unix:{tmp_path}/a.sock", str(tmp_path / "st"),
                                 bpf_dir=str(tmp_path / "bpffs"))
    try:
        assert isinstance(agent.executor, Executor) and agent.host == "h"
        assert agent.executor.state_file == tmp_path / "st" / "executor.json"
        assert agent.executor.bpf_pin_dir == tmp_path / "bpffs"
        assert agent.tx.key == key
        assert (tmp_path / "a.sock").exists()
    finally:
        server.close()
    agent, server = A.open_agent("h", str(keyfile), f"unix:{tmp_path}/b.sock", str(tmp_path / "st"))
    server.close()
    assert agent.executor.bpf_pin_dir == Executor(state_file=tmp_path / "x.json").bpf_pin_dir


def _until_signalled(sock_path, during=None):
    """A client of the agent on ``sock_path``: one status request, ``during()``
    while the agent runs, then SIGTERM to this process (once the daemon's
    handler is in place: the default one would end pytest). Returns
    (thread, replies, old handlers)."""
    from bwcommon.channel import Receiver, ReplayGuard, Sender
    from bwcommon.transport import recv_frame, send_frame
    key = _keyfile(sock_path.parent)[0] if not (sock_path.parent / "h.key").exists() else \
        bytes.fromhex((sock_path.parent / "h.key").read_text().strip())
    replies = []
    old = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)

    def client():
        deadline = time.monotonic() + 10
        try:
            while True:           # the file exists from bind(); connections are taken from listen() on
                s = socket.socket(socket.AF_UNIX)
                try:
                    s.connect(str(sock_path))
                    break
                except OSError:
                    s.close()
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.02)
            send_frame(s, Sender(key, "h", direction="c2a").seal("status", {}))
            replies.append(Receiver(key, "h", ReplayGuard(None), direction="a2c").open(recv_frame(s)))
            s.close()
            if during is not None:
                during()
        finally:        # only once main's handler is in place (the default one would end pytest)
            while signal.getsignal(signal.SIGTERM) is old[0] and time.monotonic() < deadline:
                time.sleep(0.02)
            if signal.getsignal(signal.SIGTERM) is not old[0]:
                os.kill(os.getpid(), signal.SIGTERM)
    th = threading.Thread(target=client)
    th.start()
    return th, replies, old


def test_main_serves_until_sigterm_then_removes_its_socket_and_says_so(tmp_path, caplog):
    key, keyfile = _keyfile(tmp_path)
    sock_path = tmp_path / "a.sock"
    threads = []

    def during():                 # the reply came from the channel's thread: the rounds' may still be starting
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            now = [(t.name, t.daemon) for t in threading.enumerate() if t.name.startswith("agent ")]
            if len(now) >= 4:
                break
            time.sleep(0.01)
        threads.extend(now)
    th, replies, old = _until_signalled(sock_path, during)
    try:
        with caplog.at_level(logging.INFO, logger="bwfabric.agent"):
            rc = A.main("h", str(keyfile), f"unix:{sock_path}", str(tmp_path / "st"))
    finally:
        signal.signal(signal.SIGTERM, old[0])
        signal.signal(signal.SIGINT, old[1])
        th.join(5)
    assert rc == 0
    assert replies and replies[0][0] == "reply" and replies[0][1]["ok"] is True and replies[0][1]["host"] == "h"
    assert not sock_path.exists()                    # the socket file is removed on the way out
    # the channel and the three rounds, each a daemon thread (a stuck round never keeps the process)
    assert sorted(threads) == [("agent buffer_loop", True), ("agent ese_loop", True), ("agent lrc_loop", True),
                               ("agent serve", True)]
    msgs = caplog.messages
    assert msgs[0] == f"listening on unix:{sock_path}"
    assert "shutting down: removing what this agent put in force" in msgs
    took = float(msgs[-1].removeprefix("removed; exiting (").removesuffix(" s)"))
    assert 0 <= took < 30
    deadline = time.monotonic() + 5
    while any(t.name.startswith("agent ") for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not [t.name for t in threading.enumerate() if t.name.startswith("agent ")]   # all ended


def test_run_says_when_removing_failed_and_survives_a_socket_file_already_gone(tmp_path, caplog):
    from bwcommon.transport import listen
    key, keyfile = _keyfile(tmp_path)
    sock_path = tmp_path / "a.sock"
    ex = KernelModel()
    ex.fail_next.add("teardown")
    agent = A.Agent("h", key, tmp_path / "st", executor=ex, enter=lambda ns: nullcontext())
    server = listen(f"unix:{sock_path}")
    th, replies, old = _until_signalled(sock_path, during=lambda: sock_path.unlink())
    try:
        with caplog.at_level(logging.ERROR, logger="bwfabric.agent"):
            rc = A.run(agent, server, f"unix:{sock_path}")
    finally:
        signal.signal(signal.SIGTERM, old[0])
        signal.signal(signal.SIGINT, old[1])
        th.join(5)
    assert rc == 1 and replies
    assert caplog.messages == ["teardown: RTNETLINK answers: No such file or directory"]


# ---- what the first mutation pass left (hostagent/agent.py) ----------------------------------
def test_a_round_without_a_time_takes_the_clock_and_keeps_the_buffer_in_force():
    vm, ex = vm_with(cfg())
    vm.rcvbuf = 123456
    assert vm.lrc_round(sending(PEER2)) == "pairs"              # no ``now``: the monotonic clock
    assert vm.lrc.last_active[PEER2] == pytest.approx(time.monotonic(), abs=5)
    assert vm.rcvbuf == 123456                                   # the whole plan kept Eq. 1's buffer
    assert any(s.value.endswith("123456") or "123456" in s.value for s in ex.in_force.of(P.Sysctl))


def test_byte_counts_make_a_pair_only_from_what_this_vm_sends_between_rounds():
    vm, ex = vm_with(cfg())
    t = time.monotonic()
    udp = Timeouts.read().udp

    def entry(mine, theirs):
        return [Entry(ME, PEER2, UDP, False, False, udp, 5000, 9, mine, theirs)]
    assert vm.lrc_round(entry(10_000, 0), now=t) == "idle"          # first sight: no delta yet
    assert vm.lrc_round(entry(10_000 + 50_000, 0), now=t + 0.05) == "pairs"
    assert set(vm.lrc_in_force) == {PEER2}


def test_a_competition_move_of_exactly_the_floor_is_not_written(monkeypatch):
    vm, ex = vm_with(cfg(wc="competition", marker=True))
    t = time.monotonic()
    vm.lrc_round(sending(PEER2), now=t)
    vm.lrc_in_force = vm.lrc.limits(t)
    n = len(ex.made("apply_bpf"))
    monkeypatch.setattr(vm.lrc, "competition", lambda now, unit: 0.005)
    vm.lrc_a_l = 0.0                                   # 2 % of 0 is below the 0.005 floor: a move of 0.005 is not one
    assert vm.lrc_round(sending(PEER2), now=t) == "idle" and len(ex.made("apply_bpf")) == n
    monkeypatch.setattr(vm.lrc, "competition", lambda now, unit: 0.0051)
    assert vm.lrc_round(sending(PEER2), now=t) == "competition" and len(ex.made("apply_bpf")) == n + 1


def test_the_rates_path_uses_the_slots_read_after_the_last_apply():
    """A pair that outlives another keeps its slot: the rates path changes
    the class in that slot (read back once after the apply, not every
    round), not the slot a fresh numbering would give it."""
    vm, ex = vm_with(cfg())
    t = time.monotonic()
    vm.lrc_round(sending(PEER3), now=t)                      # .3 takes slot 0
    vm.lrc_round(sending(PEER2, PEER3), now=t + 0.1)         # .2 slot 1
    assert vm.lrc_slots == {PEER3: 0, PEER2: 1}
    vm.lrc_round(sending(PEER2), now=t + 1.5)                # .3 idle: closes; .2 stays in slot 1
    assert vm.lrc_slots == {PEER2: 1}
    vm.lrc.set_terms({PEER2: [60.0, 2.0, 40.0]}, t + 1.5)
    reads = len(ex.made("pair_slots"))
    assert vm.lrc_round(sending(PEER2), now=t + 1.7) == "rates"
    assert len(ex.made("pair_slots")) == reads                # not read again
    assert {c.classid for c in ex.made("change_rates")[-1]} <= {f"1:{P.PAIR_CLASS_BASE + 1:x}",
                                                                f"1:{P.WC_PAIR_CLASS_BASE + 1:x}"}
    assert vm.lrc_repairs == 0
    # slots unknown (None): read from the kernel, once
    vm.lrc_slots = None
    vm.lrc.set_terms({PEER2: [30.0, 2.0, 40.0]}, t + 1.7)
    assert vm.lrc_round(sending(PEER2), now=t + 2.5) == "rates"
    assert ex.made("pair_slots")[reads:] == ["ag0"] and vm.lrc_repairs == 0


def test_with_the_marker_and_wc_ceilings_the_rates_path_writes_the_moved_pairs_buckets_only():
    vm, ex = vm_with(cfg(wc="ceiling", marker=True))
    t = time.monotonic()
    vm.lrc_round(sending(PEER2, PEER3), now=t)
    vm.lrc.set_terms({PEER2: [90.0, 2.0, 40.0]}, t)
    # .3's limits pinned to what LRC says now, so that only .2's move
    for k in range(1, 4):
        now = t + 0.1 * k
        want = vm.lrc.limits(now)
        vm.lrc_in_force = {**vm.lrc_in_force, PEER3: want[PEER3]}
        did = vm.lrc_round(sending(PEER2, PEER3), now=now)
        if did == "rates":
            break
    assert did == "rates"
    buckets, removed = ex.made("set_buckets")[-1]
    assert [b.dst for b in buckets] == [PEER2] and removed == []
    assert buckets[0].rate_Bps == max(int(vm.lrc_in_force[PEER2].bg_mbps * 1e6), P.MIN_CLASS_BPS) // 8


def test_every_repair_is_counted_and_logged_by_vm(caplog):
    vm, ex = vm_with(cfg())
    t = time.monotonic()
    vm.lrc_round(sending(PEER2), now=t)
    vm.rcvbuf = 4242                      # Eq. 1's buffer: the repair's whole plan keeps it
    with caplog.at_level(logging.WARNING, logger="bwfabric.agent"):
        for k in (1, 2):
            lim = vm.lrc.limits(t + 0.2 * k)[PEER2]
            vm.lrc_in_force = {PEER2: P.PairLimit(lim.bg_mbps / 2, lim.wc_mbps + 1)}    # a move to make
            ex.fail_next.add("change_rates")
            assert vm.lrc_round(sending(PEER2), now=t + 0.2 * k) == "pairs"
    assert vm.lrc_repairs == 2 and vm.rcvbuf == 4242
    assert caplog.messages[-1] == ("LRC rates (ns): change_rates: RTNETLINK answers: No such file or directory; "
                                   "re-applying the configuration")
    vm, ex = vm_with(cfg(wc="competition", marker=True))
    with caplog.at_level(logging.WARNING, logger="bwfabric.agent"):
        for k in (1, 2):
            ex.fail_next.add("set_buckets")
            vm.lrc_round(sending(PEER2) if k == 1 else [], now=t + 3 * k)
    assert vm.lrc_repairs == 2 and vm.lrc_pairs_fast == 0
    assert caplog.messages[-1] == ("LRC pairs (ns): set_buckets: RTNETLINK answers: No such file or directory; "
                                   "re-applying the configuration")


def test_pairs_fast_writes_the_opened_and_moved_buckets_and_removes_the_closed():
    vm, ex = vm_with(cfg(wc="competition", marker=True))
    L = P.PairLimit
    four = "10.9.0.4"
    vm.lrc_in_force = {PEER2: L(10.0), PEER3: L(30.0), four: L(5.0)}
    ex.buckets[(ME, four)] = P.BgBucket(ME, four, 625_000, 1500)
    assert vm._pairs_fast({PEER2: L(10.02), PEER3: L(20.0), "10.9.0.5": L(7.0)}) is True
    buckets, removed = ex.made("set_buckets")[-1]
    assert sorted(b.dst for b in buckets) == [PEER3, "10.9.0.5"]        # .2 moved by 0.2 %: not written
    assert removed == [(ME, four)]
    assert vm.lrc_in_force == {PEER2: L(10.02), PEER3: L(20.0), "10.9.0.5": L(7.0)}


def test_removing_a_vm_checks_the_kernel_is_clean():
    vm, ex = vm_with(cfg())
    ex.leftovers = [f"tc class 1:{k}" for k in range(7)]
    with pytest.raises(ExecError) as err:
        vm.remove()
    assert str(err.value) == "removing everything left: " + "; ".join(f"tc class 1:{k}" for k in range(5))
    assert vm.config is not None                        # not forgotten: it is still (partly) there


def test_conntrack_fallbacks_are_logged(monkeypatch, caplog):
    import hostagent.conntrack as C
    import hostagent.lrc as L
    monkeypatch.setattr(L, "read_conntrack", lambda: [])
    vm = A.Vm("ns", KernelModel())

    def unavailable(address):
        raise OSError("kernel before 5.8")
    with caplog.at_level(logging.WARNING, logger="bwfabric.agent"):
        monkeypatch.setattr(C, "VmConntrack", lambda a: FakeTable(a, fail_dump=True))
        vm._conntrack(ME)
        monkeypatch.setattr(C, "VmConntrack", unavailable)
        vm._conntrack(ME)
    assert caplog.messages == ["conntrack dump failed (netlink dump interrupted): reading the whole table this round",
                               "conntrack over netlink unavailable (kernel before 5.8): reading the whole table"]


def test_the_buffer_is_eq1_exactly_with_the_rtt_hint_as_its_floor_over_a_30s_window(caplog):
    from hostagent.observe import receive_buffer_bytes
    vm, ex = vm_with(cfg(lrc=False, rtt_hint_ms=50.0))
    with caplog.at_level(logging.INFO, logger="bwfabric.agent"):
        assert vm.refresh_buffer(SS.format(rtt=10.0), now=1.0) is True       # 10 ms live, 50 ms floor
    assert vm.rcvbuf == receive_buffer_bytes(0.05, 100e6, vm.config.beta)
    assert caplog.messages[-1] == (f"ns: receive/send buffer {vm.rcvbuf} B (Eq. 1: maxRTT 10.0 ms, NIC 100 Mb/s; "
                                   "measured sum BW 25.1 Mb/s)")
    with caplog.at_level(logging.INFO, logger="bwfabric.agent"):
        assert vm.refresh_buffer(SS.format(rtt=400.0), now=2.0) is True
    assert vm.rcvbuf == receive_buffer_bytes(0.4, 100e6, vm.config.beta)
    assert "(Eq. 1: maxRTT 400.0 ms, NIC 100 Mb/s;" in caplog.messages[-1]
    # 400 ms stays the max for 30 s, then the 10 ms samples alone: back to the floor
    assert vm.refresh_buffer(SS.format(rtt=10.0), now=31.0) is False
    assert vm.refresh_buffer(SS.format(rtt=10.0), now=33.0) is True
    assert vm.rcvbuf == receive_buffer_bytes(0.05, 100e6, vm.config.beta)
    # the clock when no time is given
    vm2, _ = vm_with(cfg(lrc=False))
    vm2.refresh_buffer(SS.format(rtt=400.0))
    assert vm2.sizer.samples[0][0] == pytest.approx(time.monotonic(), abs=5)


def test_vm_status_reads_the_kernel_against_the_plan_with_its_buffer():
    vm, ex = vm_with(cfg(lrc=False))
    vm.refresh_buffer(SS.format(rtt=400.0), now=1.0)
    st = vm.status()
    assert st["in_force"] is True and st["differences"] == []
    assert (st["netns"], st["rcvbuf_bytes"]) == (None, vm.rcvbuf)
    assert st["config"] == json.loads(json.dumps(vm.config.model_dump(mode="json")))
    ex.in_force = P.Plan(tuple(s for s in ex.in_force.steps if not isinstance(s, P.Sysctl)))
    assert vm.status()["in_force"] is False


def test_naming_a_vm_on_a_host_of_several_says_how_many(tmp_path):
    a, models = host(tmp_path, "a", "b")
    with pytest.raises(KeyError, match="agent srv has 2 VMs: name one"):
        a.vm()
    assert a.vm("b").name == "b"


def test_a_vm_whose_state_directory_is_gone_is_still_forgotten(tmp_path):
    import shutil
    a, models = host(tmp_path, "a", "b")
    shutil.rmtree(a._vm_dir("a"))
    a._forget(a.vms["a"])
    assert set(a.vms) == {"b"}


def test_rounds_and_applies_run_inside_the_vms_namespace(tmp_path):
    entered = []
    a, models = host(tmp_path, "a", "b")
    a.inside = recorded(entered)
    c = a.vms["b"].config
    a.put_in_force(c, 4242)
    assert entered == ["ns-b"] and a.vms["b"].rcvbuf == 4242
    entered.clear()
    a.lrc_round([], time.monotonic(), vm="a")
    a.refresh_buffer("", vm="b")
    a.ese_round(vm="a")
    assert entered == ["ns-a", "ns-b", "ns-a"]
    got = []
    a.vms["b"].refresh_buffer = lambda text, now: got.append(now)
    a.refresh_buffer("", now=7.0, vm="b")
    assert got == [7.0]


def test_the_ese_round_runs_for_the_named_vm(tmp_path, monkeypatch):
    a, models = host(tmp_path, "a", "b")
    ran = []
    for name in ("a", "b"):
        vm = a.vms[name]
        vm.config = vm.config.model_copy(update={"mptcp_cc": "mptcp_d"})
        monkeypatch.setattr(vm, "ese_closer", lambda c, n=name: ran.append(n) or type("C", (), {"round": lambda s: 1})())
    assert a.ese_round(vm="b") == "closed" and ran == ["b"]


def test_the_buffer_loop_runs_ss_inside_each_vms_namespace(tmp_path):
    entered = []
    a, models = host(tmp_path, "a", "b")
    a.inside = recorded(entered)
    th = run_loop(lambda: a.buffer_loop(period_s=0.005), lambda: {"ns-a", "ns-b"} <= set(entered))
    a.shutdown()
    th.join(5)
    assert {"ns-a", "ns-b"} <= set(entered)


def test_shutdown_removes_anyway_when_an_operation_holds_the_agent(tmp_path, caplog):
    a, models = host(tmp_path, "a", "b")
    held = threading.Event()
    release = threading.Event()

    def hold():
        with a.lock:
            held.set()
            release.wait(10)
    th = threading.Thread(target=hold)
    th.start()
    held.wait(5)
    try:
        with caplog.at_level(logging.ERROR, logger="bwfabric.agent"):
            a.shutdown(wait_s=0.05)
    finally:
        release.set()
        th.join(5)
    assert caplog.messages == ["an operation still holds the agent after 0.05 s; removing what is in force anyway"]
    assert models["a"].made("teardown") and models["b"].made("teardown") and a.stopping
    a.lock.acquire(timeout=1)                   # shutdown did not release a lock it did not hold
    a.lock.release()


def test_shutdown_names_every_vm_that_could_not_be_removed_and_goes_on(tmp_path):
    a, models = host(tmp_path, "a", "b", "c")
    models["a"].fail_next.add("teardown")
    models["b"].fail_next.add("teardown")
    a.executor.fail_next.add("teardown")
    with pytest.raises(ExecError) as err:
        a.shutdown()
    assert str(err.value) == ("VM a: teardown: RTNETLINK answers: No such file or directory; "
                              "VM b: teardown: RTNETLINK answers: No such file or directory; "
                              "teardown: RTNETLINK answers: No such file or directory")
    assert models["c"].made("teardown")


def test_shutdown_skips_the_host_namespaces_vm_and_removes_the_others_after_it(tmp_path):
    a, models = host(tmp_path, "b", "c")
    a.vms["a"] = A.Vm("a", a.executor)               # the host's own namespace's executor: torn down last, once
    a.shutdown()
    assert models["b"].made("teardown") and models["c"].made("teardown")
    assert len(a.executor.made("teardown")) == 1


# ---- the agent's status, whole ---------------------------------------------------------------
def test_status_of_a_host_of_several_vms_names_each_difference_and_a_vanished_namespace(tmp_path):
    a, models = host(tmp_path, "a", "b")
    a.nic_in_force = ("eth9", 100.0)
    models["a"].in_force = P.Plan(models["a"].in_force.steps[1:])       # one step of a's plan is gone

    class Enter:
        def __init__(self, ns):
            if ns == "ns-b":
                raise OSError(f"netns {ns}: No such file or directory")

        def __enter__(self):
            return None

        def __exit__(self, *exc):
            return False
    a.inside = Enter
    st = a.status()
    first = A.Vm.plan_for(a.vms["a"], a.vms["a"].config, None).steps[0]
    nic = [f"NIC: missing {s}" for s in A._nic_plan("eth9", 100.0).steps]
    assert st["differences"] == [f"a: missing {first}", "b: netns ns-b: No such file or directory", *nic]
    assert st["in_force"] is False
    assert st["vms"]["b"] == {"netns": "ns-b", "config": None, "in_force": False,
                              "differences": ["netns ns-b: No such file or directory"], "degraded": None,
                              "rcvbuf_bytes": None, "class_bytes": {}, "lrc": None, "ese": None}
    assert st["vms"]["a"]["in_force"] is False and st["vms"]["a"]["netns"] == "ns-a"
    # several VMs: nothing of one VM's at the top
    assert (st["config"], st["class_bytes"], st["lrc"], st["ese"], st["rcvbuf_bytes"]) == (None, {}, None, None, None)
    assert st["host"] == "srv" and st["connections"] is None and st["degraded"] is None
    a.vms["a"].degraded = "rollback failed"
    a.inside = lambda ns: nullcontext()
    assert a.status()["degraded"] == "a: rollback failed"


def test_status_of_a_host_that_is_its_own_vm_has_its_fields_at_the_top(tmp_path):
    ex = KernelModel()
    a = A.Agent("ns", b"k" * 32, tmp_path / "st", executor=ex, enter=lambda ns: nullcontext())
    st = a.status()
    assert (st["in_force"], st["differences"], st["vms"]) == (True, [], {})
    ex.leftovers = ["nft table bwfabric"]
    st = a.status()
    assert (st["in_force"], st["differences"]) == (False, ["nft table bwfabric"])
    c = cfg()
    a.put_in_force(c, 5000)
    a.vms["ns"].lrc = A.Vm("x", ex)._lrc_for(c)
    st = a.status()
    one = st["vms"]["ns"]
    assert st["in_force"] is True and st["differences"] == [] and one["in_force"] is True
    for key in ("config", "class_bytes", "lrc", "ese", "rcvbuf_bytes", "degraded"):
        assert st[key] == one[key], key
    assert st["rcvbuf_bytes"] == 5000 and st["config"] == c.model_dump(mode="json") and st["lrc"]["loop"] is None
    a.lrc_loops.run("lrc ns", lambda: 1 / 0)
    assert a.status()["lrc"]["loop"]["errors"] == 1
    ex.in_force = P.Plan(ex.in_force.steps[1:])
    st = a.status()
    assert st["differences"] == [f"missing {A.Vm.plan_for(a.vms['ns'], c, 5000).steps[0]}"]   # no VM name: one VM


def test_status_counts_the_channels_connections_once_it_serves(tmp_path):
    from bwcommon.transport import listen
    a, models = host(tmp_path, "a")
    sock = listen(f"unix:{tmp_path}/s.sock")
    th = threading.Thread(target=a.serve, args=(sock,), kwargs={"max_connections": 3}, daemon=True)
    th.start()
    deadline = time.monotonic() + 5
    while getattr(a, "server", None) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        conns = a.status()["connections"]
        assert conns == {"accepted": 0, "refused_busy": 0, "accept_errors": 0, "handler_errors": 0, "timeouts": 0,
                         "bad_frames": 0, "active": 0, "last_error": None}
        assert a.server.max_connections == 3
    finally:
        a.server.stop.set()
        a.server.close_all()
        th.join(5)                     # serve() has seen stop: the socket is no longer its
        sock.close()


# ---- the channel's end: every reply, exactly -------------------------------------------------
class Wire:
    """The controller's side of one agent's channel, in-process."""

    def __init__(self, agent, key=KEY):
        from bwcommon.channel import Receiver, ReplayGuard, Sender
        self.agent, self.tx = agent, Sender(key, agent.host, direction="c2a")
        self.rx = Receiver(KEY, agent.host, ReplayGuard(None), direction="a2c")

    def ask(self, msg_type, body) -> dict:
        kind, reply = self.rx.open(self.agent.handle(self.tx.seal(msg_type, body)))
        assert kind == "reply"
        return reply


def test_a_forged_message_is_refused_counted_logged_and_answered(tmp_path, caplog):
    ex = KernelModel()
    a = A.Agent("ns", KEY, tmp_path / "st", executor=ex, enter=lambda ns: nullcontext())
    forger = Wire(a, key=bytes(32))
    with caplog.at_level(logging.WARNING, logger="bwfabric.agent"):
        reply = forger.ask("config", {"generation": 1, "version": 1, "config": None})
        forger.ask("status", {})
    why = "bad MAC: forged, corrupted, or signed with another host's key"
    assert reply == {"ok": False, "error": f"rejected: {why}"}
    assert a.rejected == 2 and ex.calls == []
    assert caplog.messages == [f"rejected a message: {why}"] * 2
    assert Wire(a).ask("status", {})["rejected"] == 2


def test_replies_while_stopping_on_a_bad_request_and_on_a_bug(tmp_path, monkeypatch):
    ex = KernelModel()
    a = A.Agent("ns", KEY, tmp_path / "st", executor=ex, enter=lambda ns: nullcontext())
    w = Wire(a)
    assert w.ask("hello", {}) == {"ok": False, "error": "unknown message type 'hello' (config, rates, status)",
                                  "max_generation": 0}
    monkeypatch.setattr(a, "status", lambda: 1 / 0)
    assert w.ask("status", {}) == {"ok": False, "error": "internal error: ZeroDivisionError: division by zero"}
    a.stopping = True
    assert w.ask("status", {}) == {"ok": False, "error": "the agent is shutting down"}


def test_without_a_persisted_replay_guard_only_status_is_answered(tmp_path, caplog):
    ex = KernelModel()
    a = A.Agent("ns", KEY, tmp_path / "st", executor=ex, enter=lambda ns: nullcontext())
    w = Wire(a)
    a.rx.guard.state_file = tmp_path / "gone" / "last-seq"           # its directory vanished
    with caplog.at_level(logging.ERROR, logger="bwfabric.agent"):
        reply = w.ask("config", {"generation": 1, "version": 1, "config": None})
    unsaved = f"{tmp_path}/gone/last-seq: No such file or directory"
    assert reply == {"ok": False, "error": f"state dir: cannot persist the replay guard ({unsaved}); only status "
                                           "is answered until it can"}
    assert caplog.messages == [f"config refused: cannot persist the replay guard: {unsaved}"]
    assert w.ask("status", {})["ok"] is True and ex.calls == []


def test_a_lower_version_of_the_same_generation_is_refused_by_name(tmp_path):
    a = A.Agent("ns", KEY, tmp_path / "st", executor=KernelModel(), enter=lambda ns: nullcontext())
    w = Wire(a)
    assert w.ask("config", {"generation": 3, "version": 5, "config": None})["ok"] is True
    assert w.ask("config", {"generation": 3, "version": 4, "config": None}) == {
        "ok": False, "max_generation": 3,
        "error": "configuration version 4 refused: version 5 of the same controller is in force"}
    assert sorted(p.name for p in (tmp_path / "st").iterdir()) == ["generation", "last-seq"]
    assert (tmp_path / "st" / "generation").read_text() == "3\n"


def vms_config(*names, g=10.0, **over):
    return {"vms": {n: {"host": "srv", "vm_id": n, "netns": f"ns-{n}", "nic": "eth9", "interface": "eth0",
                        "address": f"10.9.0.{k + 1}", "nic_mbps": 100, "guarantee_mbps": g, "wc_subflows": 1,
                        **over} for k, n in enumerate(names)}}


def test_configure_counts_every_change_and_logs_each_vm(tmp_path, caplog):
    a, models = host(tmp_path)
    with caplog.at_level(logging.INFO, logger="bwfabric.agent"):
        with a.lock:
            reply = a._dispatch("config", {"generation": 1, "version": 1, "config": vms_config("a", "b")})
    plans = [models[n].in_force for n in ("a", "b")]
    nic = A._nic_plan("eth9", 100.0)
    assert reply["changes"] == len(plans[0].steps) + len(plans[1].steps) + len(nic.steps)
    assert a.nic_in_force == ("eth9", 100.0) and a.executor.in_force == nic
    assert caplog.messages[:2] == [f"a in force ({len(plans[0].steps)} changes): guarantee 10 Mb/s, 1 WC subflows, "
                                   f"A_l {a.vms['a'].config.a_l:.3g}",
                                   f"b in force ({len(plans[1].steps)} changes): guarantee 10 Mb/s, 1 WC subflows, "
                                   f"A_l {a.vms['b'].config.a_l:.3g}"]
    assert caplog.messages[2] == f"configuration in force (generation 1, version 1, {reply['changes']} changes, 2 VMs)"
    # a host that is its own VM: its plan's changes alone (no NIC plan)
    b = A.Agent("ns", KEY, tmp_path / "st2", executor=KernelModel(), enter=lambda ns: nullcontext())
    with b.lock:
        reply = b._dispatch("config", {"generation": 1, "version": 1, "config": cfg().model_dump(mode="json")["vm"]
                                       | cfg().model_dump(mode="json")["settings"]})
    assert reply["changes"] == len(b.executor.in_force.steps) and b.nic_in_force is None


def test_one_vms_failure_is_named_only_among_several(tmp_path):
    a, models = host(tmp_path)
    with a.lock:
        a._dispatch("config", {"generation": 1, "version": 1, "config": vms_config("a", "b")})
    models["b"].fail_next.add("apply")
    with a.lock, pytest.raises(ExecError) as err:
        a._configure(A._desired(vms_config("a", "b", g=20.0)))
    assert str(err.value).startswith("VM b: applying the configuration failed (apply: RTNETLINK answers")
    assert a.vms["b"].config.guarantee_mbps == 10.0              # rolled back, still known
    # a VM never in force that fails is forgotten; one alone is named without its name
    models.clear()
    c, = A._desired(vms_config("c")).values()
    a2, models2 = host(tmp_path / "two")
    a2.executor_factory = lambda name, ns: models2.setdefault(name, KernelModel())
    models2["c"] = KernelModel()
    models2["c"].fail_next.add("apply")
    with a2.lock, pytest.raises(ExecError) as err:
        a2._configure({"c": c})
    assert str(err.value).startswith("applying the configuration failed (apply:") and "c" not in a2.vms


def test_removing_vms_inside_their_namespaces_names_a_failure_and_keeps_the_rest(tmp_path):
    a, models = host(tmp_path)
    with a.lock:
        a._dispatch("config", {"generation": 1, "version": 1, "config": vms_config("a", "b", "c")})
    entered = []
    a.inside = recorded(entered)
    models["b"].leftovers = ["tc qdisc eth0"]
    with a.lock, pytest.raises(ExecError) as err:
        a._configure(A._desired(vms_config("c")))
    assert str(err.value) == "VM b: removing it: removing everything left: tc qdisc eth0"
    assert set(a.vms) == {"b", "c"} and entered[:2] == ["ns-a", "ns-b"]


def test_nothing_desired_tears_the_host_down_once_and_checks_it(tmp_path):
    ex = KernelModel()
    a = A.Agent("ns", KEY, tmp_path / "st", executor=ex, enter=lambda ns: nullcontext())
    a.nic_in_force = ("eth9", 100.0)
    ex.leftovers = [f"x{k}" for k in range(7)]
    with a.lock, pytest.raises(ExecError) as err:
        a._configure(None)
    assert str(err.value) == "removing everything left: x0; x1; x2; x3; x4"
    assert ex.made("teardown") == [None] and a.nic_in_force is None
    # the host's own VM removed first and a VM of its own namespace after it: the host is not torn down again
    a2, models = host(tmp_path / "two", "b")
    a2.vms["a"] = A.Vm("a", a2.executor)
    with a2.lock:
        assert a2._configure(None) == 0
    assert len(a2.executor.made("teardown")) == 1 and a2.vms == {}


def test_the_hosts_nic_failing_is_named(tmp_path):
    a, models = host(tmp_path)
    a.executor.fail_next.add("apply")
    with a.lock, pytest.raises(ExecError) as err:
        a._configure(A._desired(vms_config("a")))
    assert str(err.value) == "the host's NIC: apply: RTNETLINK answers: No such file or directory"
    assert a.vms["a"].config is not None and a.nic_in_force is None


def test_config_replies_and_logs_exactly(tmp_path, caplog):
    a, models = host(tmp_path)
    w = Wire(a)
    with caplog.at_level(logging.INFO, logger="bwfabric.agent"):
        reply = w.ask("config", {"generation": 2, "version": 7, "config": vms_config("a")})
        assert reply == {"ok": True, "changes": reply["changes"], "generation": 2, "version": 7}
        assert reply["changes"] > 0
        caplog.clear()
        assert w.ask("config", {"generation": 2, "version": 8, "config": None}) == {
            "ok": True, "changes": 0, "generation": 2, "version": 8}
    assert caplog.messages[-1] == "configuration removed (generation 2, version 8)"
    assert (a.generation, a.version, a.max_generation) == (2, 8, 2)


@pytest.mark.parametrize("config, why", [
    (vms_config("a") | {"vms": {"a": {**vms_config("a")["vms"]["a"], "host": "other"}}},
     "configuration for host 'other' sent to agent 'srv'"),
    ({"vms": {**vms_config("a")["vms"], "b": {**vms_config("b")["vms"]["b"], "netns": "ns-a"}}},
     "two VMs in one network namespace (ns-a; None: the agent's)"),
    ({"vms": {**vms_config("a")["vms"], "b": {k: v for k, v in vms_config("b")["vms"]["b"].items() if k != "nic"}
              | {"netns": None}}},
     "a VM in the host's own namespace beside VMs in namespaces of their own: give each a namespace "
     "(the host's NIC then carries them all)"),
])
def test_configs_that_cannot_be_one_hosts_are_refused_by_name_and_logged(tmp_path, caplog, config, why):
    a, models = host(tmp_path)
    with caplog.at_level(logging.WARNING, logger="bwfabric.agent"):
        reply = Wire(a).ask("config", {"generation": 1, "version": 1, "config": config})
    assert reply == {"ok": False, "error": why, "max_generation": 0}
    assert caplog.messages == [f"config refused: {why}"] and a.vms == {}


def test_a_bug_is_logged_with_its_traceback(tmp_path, caplog, monkeypatch):
    a, models = host(tmp_path)
    monkeypatch.setattr(a, "status", lambda: 1 / 0)
    with caplog.at_level(logging.ERROR, logger="bwfabric.agent"):
        Wire(a).ask("status", {})
    assert caplog.messages == ["status failed"] and "ZeroDivisionError" in caplog.text


@pytest.mark.parametrize("body", [{"generation": 1}, {"factors": {}}, {"generation": True, "factors": {}},
                                  {"generation": 1, "factors": []}, {"generation": -1, "vms": {}}])
def test_malformed_rates_are_refused_by_name(tmp_path, body):
    a, models = host(tmp_path, "a")
    assert Wire(a).ask("rates", body) == {
        "ok": False, "max_generation": 0,
        "error": "rates: needs generation (integer) and factors (object; or vms: {VM: factors})"}


def test_rates_reach_an_lrc_vm_at_the_agents_clock(tmp_path):
    a, models = host(tmp_path, "a")
    vm = a.vms["a"]
    vm.lrc.observe({"10.9.0.99"}, time.monotonic())
    reply = Wire(a).ask("rates", {"generation": 0, "vms": {"a": {"10.9.0.99": [5.0, 2.0, 1.0]}}})
    assert reply["ok"] is True and set(reply["vms"]["a"]) == {"10.9.0.99"}
    assert reply["pairs"] == reply["vms"]["a"]                      # one VM: its pairs in the flat form too
    assert vm.lrc.terms_received == 1 and vm.lrc.rates.pairs["10.9.0.99"].received_at == pytest.approx(
        time.monotonic(), abs=5)
    assert a.rates == {"a": {"10.9.0.99": [5.0, 2.0, 1.0]}} and a.rates_received == 1


def test_the_hosts_nic_plan_is_bg_before_wc_at_its_rate():
    rate = 100e6
    assert A._nic_plan("eth9", 100.0) == P.Plan(tuple(P.nic_plan("eth9", rate, P.nic_queue_bytes(rate))))
    assert A._nic_plan("eth9", 100.0).of(P.TcClass)[0].rate_bps == 100_000_000
    assert A._nic_plan("eth9", 100.0).of(P.TcLeaf)[0].limit_bytes == P.nic_queue_bytes(100e6)
    assert A._nic_plan("eth9", 10_000.0).of(P.TcLeaf)[0].limit_bytes == 25_000_000      # 20 ms at 10 Gb/s


def test_a_vm_of_its_own_namespace_gets_an_executor_of_its_own_beside_the_hosts(tmp_path):
    from hostagent.executor import Executor
    host_ex = Executor(state_file=tmp_path / "st" / "executor.json", bpf_pin_dir=tmp_path / "bpffs")
    a = A.Agent("srv", KEY, tmp_path / "st", executor=host_ex, enter=lambda ns: nullcontext())
    ex = a._executor_for("t/v1", "ns-v1")
    assert isinstance(ex, Executor) and ex is not host_ex
    assert ex.state_file == tmp_path / "st" / "vms" / "t~v1" / "executor.json"
    assert ex.bpf_pin_dir == tmp_path / "bpffs"
    plain = A.Agent("srv", KEY, tmp_path / "st2", executor=KernelModel(), enter=lambda ns: nullcontext())
    assert plain._executor_for("v", "ns").bpf_pin_dir == Executor(state_file=tmp_path / "x.json").bpf_pin_dir


def test_main_wires_the_bpf_directory_and_loads_the_bpf_side_when_asked(tmp_path, monkeypatch, caplog):
    import hostagent.cc as cc
    key, keyfile = _keyfile(tmp_path)
    ran = []
    monkeypatch.setattr(A, "run", lambda agent, server, address: ran.append((agent, address)) or server.close() or 7)
    monkeypatch.setattr(cc, "load", lambda: {"programs": ["bwf_wc"]})
    with caplog.at_level(logging.INFO, logger="bwfabric.agent"):
        assert A.main("h", str(keyfile), f"unix:{tmp_path}/a.sock", str(tmp_path / "st"), load_cc=True,
                      bpf_dir=str(tmp_path / "bpffs")) == 7
    agent, address = ran[0]
    assert agent.executor.bpf_pin_dir == tmp_path / "bpffs" and address == f"unix:{tmp_path}/a.sock"
    assert caplog.messages == ['BPF side: {"programs": ["bwf_wc"]}']
    caplog.clear()
    assert A.main("h", str(keyfile), f"unix:{tmp_path}/b.sock", str(tmp_path / "st")) == 7
    assert caplog.messages == []                       # no BPF side loaded unless asked


def test_config_envelopes_are_refused_by_name(tmp_path):
    good = vms_config("a")
    assert A.config_envelope({"generation": 2**63 - 1, "version": 0, "config": None}) == (2**63 - 1, 0, None)
    for body, why in [
        ([], "a configuration message must be an object"),
        ({"generation": 1, "version": 1, "config": None, "x": 1},
         "configuration envelope: unknown keys ['x'] (generation, version, config)"),
        ({"generation": 2**63, "version": 0, "config": None},
         "configuration envelope: generation 9223372036854775808 and version 0 must be integers in 0..2^63-1"),
        ({"generation": 1, "version": -1, "config": None},
         "configuration envelope: generation 1 and version -1 must be integers in 0..2^63-1"),
        ({"generation": 1, "version": 1, "config": []}, "configuration envelope: config must be an object or null"),
        ({"generation": 1, "version": 1, "config": {"vms": {}, "x": 1}},
         'a configuration of several VMs is {"vms": {name: HostConfig}} and nothing else'),
    ]:
        with pytest.raises(P.PlanError) as err:
            A.config_envelope(body)
        assert str(err.value) == why
    with pytest.raises(P.PlanError, match="^a configuration must be an object$"):
        A._desired([])
    # a bare HostConfig (manual use): generation 0, version 0
    gen, ver, desired = A.config_envelope(good["vms"]["a"])
    assert (gen, ver, list(desired)) == (0, 0, ["a"])


def test_every_bad_vm_is_named_and_at_most_max_vms_are_taken():
    bad = {"vms": {"a": {"host": "srv"}, "b": {"host": "srv"}}}
    with pytest.raises(P.PlanError) as err:
        A._desired(bad)
    assert str(err.value).startswith("vms['a']: ") and "; vms['b']: " in str(err.value)
    many = {f"v{k}": vms_config("a")["vms"]["a"] | {"vm_id": f"v{k}", "netns": f"n{k}"} for k in range(A.MAX_VMS)}
    assert len(A._desired({"vms": many})) == A.MAX_VMS
    with pytest.raises(P.PlanError, match=f"^{A.MAX_VMS + 1} VMs: one agent configures at most {A.MAX_VMS}$"):
        A._desired({"vms": {**many, "w": many["v0"] | {"vm_id": "w"}}})


def test_the_flat_reply_is_the_one_vms_pairs_only(tmp_path):
    a, models = host(tmp_path, "a")
    a.vms["a"].lrc = None                             # a host of one VM without LRC
    reply = Wire(a).ask("rates", {"generation": 0, "factors": {}})
    assert reply == {"ok": True, "pairs": {}, "vms": {}}
    b, models = host(tmp_path / "b", "a", "b")
    b.vms["b"].lrc = None                             # two VMs, one with LRC: no flat form
    reply = Wire(b).ask("rates", {"generation": 0, "vms": {"a": {}}})
    assert reply["pairs"] == {} and set(reply["vms"]) == {"a"}


def test_bad_terms_are_named_per_vm_only_among_several(tmp_path):
    a, models = host(tmp_path, "a")
    one = Wire(a).ask("rates", {"generation": 0, "factors": {"10.9.0.7": [1.0, 1.0, 1.0]}})
    assert one["error"] == "factors for '10.9.0.7', not a peer of this VM"
    b, models = host(tmp_path / "b", "a", "b")
    two = Wire(b).ask("rates", {"generation": 0, "vms": {"a": {"10.9.0.7": [1.0, 1.0, 1.0]},
                                                         "b": {"10.9.0.8": [1.0, 1.0, 1.0]}}})
    assert two["error"] == ("VM a: factors for '10.9.0.7', not a peer of this VM; "
                            "VM b: factors for '10.9.0.8', not a peer of this VM")


def test_a_vm_whose_namespace_changed_is_refused_by_name_and_kept(tmp_path):
    a, models = host(tmp_path, "a")
    moved = vms_config("a")["vms"]["a"] | {"netns": "ns-x"}
    reply = Wire(a).ask("config", {"generation": 0, "version": 1, "config": moved})
    assert reply["ok"] is False
    assert reply["error"] == "VM a: its network namespace changed (ns-a -> ns-x); remove it first"
    assert a.vms["a"].netns == "ns-a" and a.vms["a"].config is not None


def test_vms_sharing_namespaces_are_all_named(tmp_path):
    a, models = host(tmp_path)
    v = vms_config("a", "b", "c", "d")["vms"]
    cfg4 = {"vms": {"a": v["a"], "b": v["b"] | {"netns": "ns-a"}, "c": v["c"], "d": v["d"] | {"netns": "ns-c"}}}
    assert Wire(a).ask("config", {"generation": 0, "version": 1, "config": cfg4})["error"] == \
        "two VMs in one network namespace (ns-a, ns-c; None: the agent's)"


def test_two_vms_failing_are_both_named(tmp_path):
    a, models = host(tmp_path)
    for n in ("a", "b"):
        models[n] = KernelModel()
        models[n].fail_next.add("apply")
    with a.lock, pytest.raises(ExecError) as err:
        a._configure(A._desired(vms_config("a", "b")))
    assert str(err.value).count("applying the configuration failed") == 2 and "; VM b: " in str(err.value)


def test_an_equal_generation_does_not_rewrite_the_persisted_one(tmp_path):
    a, models = host(tmp_path)
    w = Wire(a)
    assert w.ask("config", {"generation": 4, "version": 1, "config": None})["ok"] is True
    a.generation_file = tmp_path / "gone" / "generation"          # writing it now would fail
    assert w.ask("config", {"generation": 4, "version": 2, "config": None})["ok"] is True
    assert w.ask("config", {"generation": 5, "version": 0, "config": None})["ok"] is False


def test_shutdown_removes_each_vm_inside_its_namespace(tmp_path):
    entered = []
    a, models = host(tmp_path, "a", "b")
    a.inside = recorded(entered)
    a.shutdown()
    assert entered == ["ns-a", "ns-b"]


def test_vm_status_shows_lrc_and_ese_as_they_are(tmp_path, monkeypatch):
    vm, ex = vm_with(cfg())
    ex.class_bytes = lambda dev: {"1:10": 1500} if dev == "ag0" else {}
    t = time.monotonic()
    vm.lrc_round(sending(PEER2), now=t)
    vm.lrc.set_terms({PEER2: [5.0, 1.0, 40.0]}, t)
    with pytest.raises(Exception):
        vm.lrc.set_terms({PEER2: [-1.0, 1.0, 40.0]}, t)
    now = time.monotonic() + 0.5
    # the status reads the clock once; the expected report is taken at that same instant (two clock reads
    # apart made the factor's age differ now and then)
    monkeypatch.setattr(A, "time", types.SimpleNamespace(monotonic=lambda: now))
    st = vm.status(lrc_loop={"rounds": 3}, ese_loop={"rounds": 4})
    monkeypatch.undo()
    assert st["class_bytes"] == {"1:10": 1500}
    assert st["lrc"] == {"pairs": vm.lrc.report(now), "terms_received": 1, "terms_refused": 1,
                         "loop": {"rounds": 3}}
    assert st["lrc"]["pairs"][PEER2]["factor_age_s"] >= 0
    assert st["ese"] is None
    vm.ese = type("Closer", (), {"closed": [1, 2], "failed": 1})()
    assert vm.status(ese_loop={"rounds": 4})["ese"] == {"closed": 2, "not_destroyed": 1, "loop": {"rounds": 4}}


def test_status_carries_every_field_an_operator_reads(tmp_path):
    ex = KernelModel()
    ex.class_bytes = lambda dev: {"1:10": 99}
    a = A.Agent("ns", KEY, tmp_path / "st", executor=ex, enter=lambda ns: nullcontext())
    w = Wire(a)
    w.ask("config", {"generation": 1, "version": 3, "config": cfg().model_dump(mode="json")["vm"]
                     | cfg().model_dump(mode="json")["settings"]})
    w.ask("rates", {"generation": 1, "factors": {}})
    a.ese_loops.run("ese ns", lambda: None)
    a.vms["ns"].degraded = "rollback failed"
    st = a.status()
    assert set(st) == {"host", "rejected", "rcvbuf_bytes", "generation", "version", "rates_received", "connections",
                       "config", "class_bytes", "lrc", "ese", "in_force", "differences", "degraded", "vms"}
    assert (st["generation"], st["version"], st["rates_received"]) == (1, 3, 1)
    assert st["class_bytes"] == {"1:10": 99} and st["degraded"] == "rollback failed" and st["in_force"] is False
    a.vms["ns"].ese = type("Closer", (), {"closed": [], "failed": 0})()
    assert a.status()["ese"]["loop"]["rounds"] == 1


def test_several_vms_degraded_are_each_named(tmp_path):
    a, models = host(tmp_path, "a", "b", "c")
    a.vms["a"].degraded, a.vms["c"].degraded = "x failed", "y failed"
    assert a.status()["degraded"] == "a: x failed; c: y failed"
    a.vms["a"].degraded = a.vms["c"].degraded = None
    assert a.status()["degraded"] is None


def test_a_restarted_agent_remembers_its_vms_namespaces_and_removes_them_when_left_out(tmp_path):
    state = tmp_path / "state"
    (state / "vms" / "b").mkdir(parents=True)          # a directory an interrupted run left, without vm.json
    a, models = host(tmp_path, "a", "b")
    assert json.loads((state / "vms" / "a" / "vm.json").read_text()) == {"name": "a", "netns": "ns-a"}
    again = {}
    b = A.Agent("srv", KEY, state, executor=KernelModel(), enter=lambda ns: nullcontext(),
                executor_factory=lambda name, ns: again.setdefault(name, KernelModel()))
    assert {n: (v.netns, v.config) for n, v in b.vms.items()} == {"a": ("ns-a", None), "b": ("ns-b", None)}
    with b.lock:
        b._dispatch("config", {"generation": 1, "version": 1, "config": vms_config("b")})
    assert set(b.vms) == {"b"} and again["a"].made("teardown") and not (state / "vms" / "a").exists()
