"""The flow-level simulator (experiments/flowsim, issue #34 §1): its
kernel is max-min, its routes are the ones the product's apps install,
its VM-pair terms are LRC's Eqs. 1-2, its event loop gives the exact
completion times of hand-solvable cases, and every input is refused by
name."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.lrc._kernels import maxmin_csr, waterfill_csr, wmaxmin_csr
from apps.routing.logic import DestinationRouting
from bwcommon import lrc
from controller import ofmsg
from controller.pipeline import TABLE_FORWARD
from experiments.flowsim.engine import Engine, Flows
from experiments.flowsim.net import SimError, SimNet
from experiments.flowsim.routing import TeRouter, flow_hash, make_router
from experiments.flowsim.sharing import BG, WC, allocate, pair_terms
from experiments.flowsim.workload import open_loop, summarize
from experiments.workloads import SizeCdf
from mininet_topos.builders import fattree, with_vm_blocks

MB = 1e6


@pytest.fixture(scope="module")
def k4():
    return SimNet(fattree(4, link_mbps=10.0))


def _csr(paths):
    ptr = np.zeros(len(paths) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(p) for p in paths])
    links = np.array([x for p in paths for x in p], dtype=np.int64)
    return ptr, links


# ---- the kernel ------------------------------------------------------------------------------

@st.composite
def instances(draw):
    n_links = draw(st.integers(1, 12))
    paths = draw(st.lists(st.lists(st.integers(0, n_links - 1), min_size=0, max_size=5, unique=True),
                          min_size=1, max_size=40))
    caps = draw(st.lists(st.one_of(st.just(math.inf), st.floats(0, 20)), min_size=len(paths),
                         max_size=len(paths)))
    capacity = draw(st.lists(st.floats(0, 50), min_size=n_links, max_size=n_links))
    return paths, np.array(caps, float), np.array(capacity, float)


@settings(max_examples=300, deadline=None)
@given(instances())
def test_maxmin_kernel_is_the_weighted_kernel_with_unit_weights(inst):
    paths, caps, capacity = inst
    ptr, links = _csr(paths)
    n = len(paths)
    want = waterfill_csr(ptr, links, np.ones(n), np.zeros(n), caps, capacity)
    got = maxmin_csr(ptr, links, caps, capacity)
    assert np.allclose(got, want, rtol=1e-9, atol=1e-9)
    # max-min itself: feasible, and every flow meets its cap or a full link where it is among the largest
    load = np.zeros(capacity.size)
    for p, r in zip(paths, got):
        load[p] += r
    assert np.all(load <= capacity * (1 + 1e-9) + 1e-9)
    for i, (p, r) in enumerate(zip(paths, got)):
        if not p:
            assert r == 0.0
            continue
        if r >= caps[i] - 1e-9:
            continue
        full = [lk for lk in p if load[lk] >= capacity[lk] - 1e-7]
        assert full, f"flow {i} below its cap with no full link"
        assert any(all(got[j] <= r + 1e-7 for j, q in enumerate(paths) if lk in q) for lk in full)


@settings(max_examples=300, deadline=None)
@given(instances(), st.lists(st.floats(0.05, 20), min_size=40, max_size=40))
def test_weighted_heap_kernel_is_the_weighted_kernel_without_floors(inst, weights):
    paths, caps, capacity = inst
    ptr, links = _csr(paths)
    n = len(paths)
    w = np.array(weights[:n])
    want = waterfill_csr(ptr, links, w, np.zeros(n), caps, capacity)
    got = wmaxmin_csr(ptr, links, w, caps, capacity)
    assert np.allclose(got, want, rtol=1e-9, atol=1e-9)


def test_maxmin_kernel_hand_case():
    # link 0 (10) shared by flows 0,1,2; flow 2 also crosses link 1 (2): flow 2 gets 2, the others 4 each
    ptr, links = _csr([[0], [0], [0, 1]])
    got = maxmin_csr(ptr, links, np.full(3, np.inf), np.array([10.0, 2.0]))
    assert got.tolist() == [4.0, 4.0, 2.0]
    got = maxmin_csr(ptr, links, np.array([1.0, np.inf, np.inf]), np.array([10.0, 2.0]))
    assert got.tolist() == [1.0, 7.0, 2.0]


# ---- VM-pair terms ----------------------------------------------------------------------------

@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)).filter(lambda p: p[0] != p[1]), min_size=1,
                max_size=25),
       st.lists(st.floats(0, 100), min_size=6, max_size=6), st.lists(st.floats(0.1, 8), min_size=6, max_size=6))
def test_vectorised_pair_terms_are_lrcs(conns, g, w):
    src = np.array([a for a, _ in conns])
    dst = np.array([b for _, b in conns])
    inv, w_i, b_i = pair_terms(src, dst, np.array(g), np.array(w))
    want = lrc.pair_terms(conns, {v: lrc.Vm(g[v], w[v]) for v in range(6)})
    for j, (a, b) in enumerate(conns):
        ww, bb = want[(a, b)]
        assert w_i[inv[j]] == pytest.approx(ww, rel=1e-12)
        assert b_i[inv[j]] == pytest.approx(bb, rel=1e-12, abs=1e-12)


# ---- routes: what the apps install -------------------------------------------------------------

def _follow(msgs_by_switch, net, src, dst, h):
    """Walks the OpenFlow entries and groups the routing app sends (its
    forward table, exact ipv4_dst matches), choosing group buckets by
    ``h`` as the simulator says the switch does."""
    view = net.view
    node, path = net.tor_of[src], [src, net.tor_of[src]]
    while node != dst:
        flows, groups = msgs_by_switch[node]
        fm = flows[view.ip(dst)]
        act = [a for ins in fm.instructions if isinstance(ins, ofmsg.ApplyActions) for a in ins.actions
               if isinstance(a, (ofmsg.Output, ofmsg.GroupAction))][0]
        if isinstance(act, ofmsg.GroupAction):
            buckets = groups[act.group_id].buckets
            act = [a for a in buckets[h % len(buckets)].actions if isinstance(a, ofmsg.Output)][0]
        node = view.peer(node, act.port)
        path.append(node)
    return tuple(path)


@pytest.mark.parametrize("multipath", [True, False])
def test_routes_are_the_installed_entries(k4, multipath):
    routing = DestinationRouting(k4.view, multipath=multipath)
    tables = {}
    for sw in k4.view.switches:
        flows, groups = {}, {}
        for m in routing.switch_connected(sw):
            if isinstance(m, ofmsg.GroupMod):
                groups[m.group_id] = m
            elif isinstance(m, ofmsg.FlowMod) and m.table_id == TABLE_FORWARD and m.command == "add":
                fields = dict(m.match.fields)
                if "ipv4_dst" in fields and "ipv4_src" not in fields:
                    flows[fields["ipv4_dst"]] = m
        tables[sw] = (flows, groups)
    router = make_router(k4, "ecmp" if multipath else "single_path")
    rng = np.random.default_rng(3)
    hosts = k4.view.hosts
    seen = set()
    for _ in range(300):
        a, b = rng.choice(len(hosts), 2, replace=False)
        h = int(rng.integers(0, 2**63))
        got = router.path(None, h, hosts[a], hosts[b])
        assert got == _follow(tables, k4, hosts[a], hosts[b], h)
        seen.add(got)
    if multipath:   # the layered buckets use all four core paths between pods
        cores = {p[3] for p in seen if len(p) == 7}
        assert len(cores) == 4


def test_flow_hash_is_deterministic_and_spreads():
    hs = [flow_hash(1, 2, 6, s, 7000) for s in range(4096)]
    assert hs == [flow_hash(1, 2, 6, s, 7000) for s in range(4096)]
    counts = np.bincount([h % 4 for h in hs], minlength=4)
    assert counts.min() > 900


# ---- the event loop: hand-solved cases --------------------------------------------------------

def _flows(net, specs):
    src = np.array([net.endpoint(a) for a, _, _, _ in specs])
    dst = np.array([net.endpoint(b) for _, b, _, _ in specs])
    return Flows(src, dst, np.array([t for _, _, t, _ in specs], float), np.array([s for *_, s in specs], float))


def test_two_flows_into_one_host_finish_when_max_min_says(k4):
    # 10 Mb/s NICs: 1 MB and 2 MB into h3 at t = 0 -> 5 + 5 Mb/s until 1.6 s, then 10 for the last 8 Mb: 2.4 s
    eng = Engine(k4, make_router(k4, "ecmp"), "fair", 0.0)
    res = eng.run(_flows(k4, [("h1", "h3", 0.0, 1 * MB), ("h2", "h3", 0.0, 2 * MB)]), 10.0)
    assert res.fct_s == pytest.approx([1.6, 2.4], abs=1e-9)
    assert res.events == 4 and res.allocations == 2        # two arrivals (one allocation), two completions
    # every bit arrives, in the slots it arrived in: 5 + 5 in slot 0, 5 + 5 (to 1.6) + 4 in slot 1, 4 in slot 2
    assert res.rx_bits.sum() == pytest.approx(24e6)
    assert res.rx_bits[:3, k4.endpoint("h3")] == pytest.approx([10e6, 10e6, 4e6])


def test_a_late_arrival_takes_its_share_from_its_arrival(k4):
    # h1 -> h3 alone at 10 Mb/s; h2 -> h3 (1 MB) joins at 0.5 s: both at 5 until h2's ends at 2.1 s
    eng = Engine(k4, make_router(k4, "ecmp"), "fair", 0.0)
    res = eng.run(_flows(k4, [("h1", "h3", 0.0, 3 * MB), ("h2", "h3", 0.5, 1 * MB)]), 10.0)
    # h1: 5 Mb by 0.5, 8 Mb more by 2.1, 11 Mb left at 10: 3.2 s
    assert res.fct_s == pytest.approx([3.2, 1.6], abs=1e-9)


def test_the_window_moves_completion_times_by_less_than_a_window(k4):
    fl = open_loop(k4, SizeCdf.load("websearch"), 0.5, 4.0, seed=2)
    exact = Engine(k4, make_router(k4, "ecmp"), "fair", 0.0).run(fl, 30.0)
    coarse = Engine(k4, make_router(k4, "ecmp"), "fair", 0.002).run(fl, 30.0)
    assert coarse.allocations < exact.allocations
    done = np.isfinite(exact.fct_s) & np.isfinite(coarse.fct_s)
    assert done.sum() == fl.src.size
    rel = abs(np.mean(coarse.fct_s) - np.mean(exact.fct_s)) / np.mean(exact.fct_s)
    assert rel < 0.05
    assert exact.rx_bits.sum() == pytest.approx(fl.size_bytes.sum() * 8, rel=1e-9)
    assert coarse.rx_bits.sum() == pytest.approx(fl.size_bytes.sum() * 8, rel=1e-9)


def test_a_flow_arriving_inside_a_window_starts_at_its_arrival(k4):
    # window 0.1 s: h5 -> h7 arrives at 0.05, inside the window allocated at 0; alone on its path it needs
    # exactly 1.6 s for 2 MB at 10 Mb/s -- not less (started at the window) nor more (waiting for the next)
    eng = Engine(k4, make_router(k4, "ecmp"), "fair", 0.1)
    res = eng.run(_flows(k4, [("h1", "h3", 0.0, 1 * MB), ("h5", "h7", 0.05, 2 * MB)]), 5.0)
    assert res.fct_s == pytest.approx([0.8, 1.6], abs=1e-9)
    assert res.rx_bits[:2, k4.endpoint("h7")] == pytest.approx([9.5e6, 6.5e6])


def test_same_seed_same_run_other_seed_other_run(k4):
    cdf = SizeCdf.load("websearch")
    runs = [Engine(k4, make_router(k4, "ecmp"), "fair", 0.0005).run(open_loop(k4, cdf, 0.4, 2.0, s), 20.0)
            for s in (5, 5, 6)]
    assert np.array_equal(runs[0].fct_s, runs[1].fct_s)
    assert runs[0].fct_s.size != runs[2].fct_s.size or not np.array_equal(runs[0].fct_s, runs[2].fct_s)


# ---- guarantees: BG first, WC over the rest -----------------------------------------------------

def test_bg_then_wc_on_one_link():
    # one 10-unit link; pairs A (B = 6) and B (B = 1): BG 6 and 1, WC shares the 3 left: 1.5 each
    links = np.array([[0, -1], [0, -1], [0, -1], [0, -1]])
    hops = np.array([1, 1, 1, 1])
    klass = np.array([BG, WC, BG, WC])
    pair = np.array([0, 0, 1, 1])
    rate = allocate(links, hops, klass, np.full(4, np.inf), np.array([10.0]), pair=pair,
                    pair_cap=np.array([6.0, 1.0]))
    assert rate.tolist() == [6.0, 1.5, 1.0, 1.5]


def test_sharing_policies_on_a_shared_nic(k4):
    # h1 (guarantee 8) and h2 (guarantee 2) both send 1 MB to h3 (guarantee 10): the NIC into h3 is the cut
    g = np.zeros(len(k4.endpoints))
    g[[k4.endpoint("h1"), k4.endpoint("h2"), k4.endpoint("h3")]] = [8e6, 2e6, 10e6]
    fl = _flows(k4, [("h1", "h3", 0.0, 1 * MB), ("h2", "h3", 0.0, 1 * MB)])
    out = {}
    for sharing in ("fair", "reservation", "bgwc", "lrc"):
        eng = Engine(k4, make_router(k4, "ecmp"), sharing, 0.0, guarantee_bps=g)
        out[sharing] = eng.run(fl, 30.0).fct_s
    assert out["fair"] == pytest.approx([1.6, 1.6])
    # B_i = min(8, 10 * 1/2) = 5 and min(2, 5) = 2: h1 alone at 5 (1.6 s), h2 at 2 (4 s)
    assert out["reservation"] == pytest.approx([1.6, 4.0])
    # BG 5 + 2, WC splits the 3 left: 6.5 / 3.5 until h1 ends at 8/6.5; then h2 takes the NIC
    t1 = 8 / 6.5
    assert out["bgwc"] == pytest.approx([t1, t1 + (8 - 3.5 * t1) / 10])
    # LRC's equilibrium: max(B_i, w x) with equal weights -> 5 / 5 here (both floors below the level)
    assert out["lrc"] == pytest.approx([1.6, 1.6])


def test_vms_of_one_host_share_its_nic_and_talk_without_the_fabric():
    net = SimNet(with_vm_blocks(fattree(4, link_mbps=10.0)), vms_per_host=2)
    assert len(net.endpoints) == 32
    eng = Engine(net, make_router(net, "ecmp"), "fair", 0.0)
    # two VMs of h1 send to h3's two VMs: one NIC -> 5 + 5; a VM-to-VM copy inside h2 leaves the fabric alone
    res = eng.run(_flows(net, [("h1v0", "h3v0", 0.0, 1 * MB), ("h1v1", "h3v1", 0.0, 1 * MB),
                               ("h2v0", "h2v1", 0.0, 1 * MB)]), 10.0)
    assert res.fct_s[:2] == pytest.approx([1.6, 1.6])
    assert res.fct_s[2] == pytest.approx(8 / 100)      # ten times the NIC


# ---- the controllers in the loop ----------------------------------------------------------------

def test_lessor_runs_on_pres_schedule_and_places_the_long_flows(k4):
    pairs = [(f"h{i}", f"h{(i + 4) % 16 + 1}") for i in range(1, 17)]   # every host to the next pod
    fl = _flows(k4, [(a, b, 0.0, 40 * MB) for a, b in pairs])
    router = make_router(k4, "lessor", cpu=0.0, rtt_s=0.001)
    res = Engine(k4, router, "fair", 0.0).run(fl, 20.0)
    d = res.decisions
    # Algorithm 1 with an idle controller: the period halves from 5 s to its 0.5 s floor; the first poll at
    # 1 s, its decision T/2 after the first reply (T = 5: 3.501 s), each later poll a period after the last
    assert d[0]["t"] == pytest.approx(1.0 + 0.001 + 2.5)
    assert [x["period_s"] for x in d[:4]] == [2.5, 1.25, 0.625, 0.5]
    assert d[0]["long_flows"] == 16 and d[0]["pmpt_s"] > 0
    assert router.logic.allocations >= 1
    # placed: every flow at its NIC rate once installed; ECMP's collisions are gone
    ecmp = Engine(k4, make_router(k4, "ecmp"), "fair", 0.0).run(fl, 20.0)
    assert res.aggregate_bps((6, 12)) == pytest.approx(160e6, rel=1e-6)
    assert ecmp.aggregate_bps((6, 12)) < 0.9 * 160e6


def test_hedera_polls_every_five_seconds(k4):
    fl = _flows(k4, [(f"h{i}", f"h{(i + 4) % 16 + 1}", 0.0, 40 * MB) for i in range(1, 17)])
    router = make_router(k4, "hedera", cpu=0.0)
    Engine(k4, router, "fair", 0.0).run(fl, 16.0)
    assert {x["period_s"] for x in router.decisions} == {5.0}


def test_measured_cpu_feeds_algorithm_1(k4):
    router = make_router(k4, "lessor", cpu=None)
    fl = _flows(k4, [(f"h{i}", f"h{(i + 4) % 16 + 1}", 0.0, 10 * MB) for i in range(1, 17)])
    Engine(k4, router, "fair", 0.0).run(fl, 10.0)
    cpus = [x["cpu"] for x in router.decisions]
    assert all(0 <= c <= 1 for c in cpus) and any(c > 0 for c in cpus)


# ---- input refused by name ------------------------------------------------------------------------

@pytest.mark.parametrize("bad, word", [
    (dict(start=[0.0, math.nan]), "start"), (dict(start=[0.0, math.inf]), "start"), (dict(start=[1.0, 0.5]), "start"),
    (dict(size=[1.0, 0.0]), "sizes"), (dict(size=[1.0, math.nan]), "sizes"), (dict(dst=[0, 0]), "endpoints"),
])
def test_bad_flows_are_refused(bad, word):
    kw = dict(src=[0, 1], dst=[1, 2], start=[0.0, 0.0], size=[1.0, 1.0]) | bad
    with pytest.raises(SimError, match=word):
        Flows(np.array(kw["src"]), np.array(kw["dst"]), np.array(kw["start"], float), np.array(kw["size"], float))


@pytest.mark.parametrize("make, word", [
    (lambda n: Engine(n, make_router(n, "ecmp"), "best", 0.0), "sharing"),
    (lambda n: Engine(n, make_router(n, "ecmp"), "fair", math.nan), "window_s"),
    (lambda n: Engine(n, make_router(n, "ecmp"), "fair", -1.0), "window_s"),
    (lambda n: Engine(n, make_router(n, "ecmp"), "bgwc", 0.0), "guarantee"),
    (lambda n: Engine(n, make_router(n, "ecmp"), "bgwc", 0.0, guarantee_bps=np.full(16, math.nan)), "guarantee"),
    (lambda n: Engine(n, make_router(n, "ecmp"), "fair", 0.0, vm_weight=np.zeros(16)), "vm_weight"),
    (lambda n: make_router(n, "ospf"), "routing"),
    (lambda n: make_router(n, "lessor", rtt_s=math.inf), "rtt_s"),
    (lambda n: make_router(n, "lessor", cpu=1.5), "cpu"),
    (lambda n: TeRouter(n, "ecmp"), "routing"),
    (lambda n: SimNet(n.topo, vms_per_host=2), "VM block"),
    (lambda n: SimNet(n.topo, vms_per_host=-1), "vms_per_host"),
    (lambda n: Engine(n, make_router(n, "ecmp"), "fair", 0.0).run(Flows(*[np.zeros(0)] * 4), math.nan), "end_s"),
    (lambda n: open_loop(n, SizeCdf.load("websearch"), 1.5, 1.0, 1), "load"),
    (lambda n: open_loop(n, SizeCdf.load("websearch"), 0.5, math.inf, 1), "seconds"),
    (lambda n: n.endpoint("h99"), "h99"),
])
def test_bad_settings_are_refused(k4, make, word):
    with pytest.raises(SimError, match=word):
        make(k4)


def test_summary_counts_unfinished_and_buckets(k4):
    fl = _flows(k4, [("h1", "h3", 0.5, 50e3), ("h2", "h3", 0.5, 100 * MB)])
    res = Engine(k4, make_router(k4, "ecmp"), "fair", 0.0).run(fl, 5.0)
    s = summarize(fl, res, (0, 5))
    assert s["unfinished"] == 1 and s["connections"] == 2
    assert s["by_size"]["< 100 KB"]["n"] == 1 and s["by_size"][">= 10 MB"]["n"] == 0
    with pytest.raises(SimError, match="window"):
        summarize(fl, res, (3, 3))


# ---- validation against emulated runs: the inputs are the emulator's own ---------------------------

def _lessor_eval_results(tmp_path, planned_delta=0):
    from dataclasses import asdict

    from experiments.lessor_eval import Config
    from experiments.workloads import SizeCdf, on_off_flows
    cfg = Config(apps=("single_path",), loads=(0.3,), seeds=(4,), duration=6.0, drain=10.0)
    hosts = [h.name for h in cfg.topo().hosts]
    specs = on_off_flows(hosts, SizeCdf.load(cfg.workload), 0.3, cfg.link_mbps, cfg.duration, 4, cfg.model())
    # an "emulated" run that is the exact single-path max-min: every connection 10 % slower
    from experiments.flowsim.validate import lessor_eval_rows  # noqa: F401 (imported where it is used)
    net = SimNet(cfg.topo())
    res = Engine(net, make_router(net, "single_path"), "fair", 0.0).run(Flows.from_specs(net, specs), 16.0)
    order = np.argsort([f.start_s for f in specs], kind="stable")
    fct = np.full(len(specs), np.nan)
    fct[order] = res.fct_s
    run = {"aggregate_mbps": res.aggregate_bps((2.0, 6.0)) / 1e6 / 1.25, "planned": len(specs) + planned_delta,
           "flows": [{"id": i, "size": s.size, "fct": None if not np.isfinite(fct[i]) else fct[i] * 1.1,
                      "complete": bool(np.isfinite(fct[i]))} for i, s in enumerate(specs)]}
    path = tmp_path / "results.json"
    import json
    path.write_text(json.dumps({"config": asdict(cfg), "runs": {"4/0.3/single_path": run}}))
    return path


def test_validation_reads_the_emulators_inputs_and_compares(tmp_path):
    from experiments.flowsim.validate import rows_for
    rows = rows_for(_lessor_eval_results(tmp_path))
    assert len(rows) == 1
    r = rows[0]
    assert r["aggregate_ratio"] == pytest.approx(1.25) and r["fct_ratio"] == pytest.approx(1 / 1.1)
    assert r["within"] is False and r["both_finished"] == r["emu_finished"] == r["sim_finished"]


def test_validation_refuses_results_whose_flows_it_cannot_regenerate(tmp_path):
    from experiments.flowsim.validate import rows_for
    with pytest.raises(SimError, match="planned"):
        rows_for(_lessor_eval_results(tmp_path, planned_delta=1))


# ---- seed 000's study: jobs on slots -------------------------------------------------------------

def test_bgwc_large_is_the_papers_fabric():
    from mininet_topos.builders import bgwc_large
    topo = bgwc_large()
    roles = [sw.role for sw in topo.switches]
    assert len(topo.hosts) == 400 and roles.count("core") == 2 and roles.count("aggregation") == 8 \
        and roles.count("edge") == 16
    speeds = sorted({lk.capacity_mbps for lk in topo.links})
    assert speeds == [1000.0, 10000.0, 20000.0]
    assert topo.params["tor_oversubscription"] == 1.25


def test_jobs_wait_for_slots_and_a_shuffle_ends_with_its_last_connection():
    from experiments.flowsim.shuffle import ShuffleJobs, SLOTS
    net = SimNet(with_vm_blocks(fattree(4, link_mbps=10.0)), vms_per_host=2 * SLOTS)
    # the cluster has 32 mapper slots: job 0 takes 30, job 1 (arriving later) needs 4 and waits for job 0
    jobs = [{"id": 0, "arrival_s": 0.0, "shuffle_bytes": 30 * 30 * 1e4, "mappers": 30, "reducers": 30},
            {"id": 1, "arrival_s": 0.1, "shuffle_bytes": 16 * 1e5, "mappers": 4, "reducers": 4}]
    src = ShuffleJobs(net, jobs, seed=1)
    eng = Engine(net, make_router(net, "ecmp"), "fair", 0.0)
    res = eng.run(src, 60.0)
    assert set(src.shuffle_s) == {0, 1}
    assert src.placed_at[1] == pytest.approx(src.placed_at[0] + src.shuffle_s[0])     # when job 0's slots came back
    assert res.fct_s.size == 30 * 30 + 16
    first = [g for g, j in enumerate(src.job_of) if j == 0]
    assert src.shuffle_s[0] == pytest.approx(np.max(res.fct_s[first]))
    # every connection runs mapper VM -> reducer VM: even slots send, odd slots receive
    assert len(src.job_of) == eng.store.n == res.fct_s.size
    assert all(s % 4 < 2 and d % 4 >= 2 for s, d in zip(eng.store.src[:eng.store.n], eng.store.dst[:eng.store.n]))


def test_bgwc_beats_full_competition_and_reservation_on_a_small_cluster():
    from experiments.flowsim.shuffle import SCHEMES, make_jobs
    from experiments.flowsim import shuffle as S
    net = SimNet(with_vm_blocks(fattree(4, link_mbps=1000.0)), vms_per_host=2 * S.SLOTS)
    jobs = make_jobs(60, seed=3, arrival_per_s=4.0, max_tasks=8)
    mean = {s: np.mean(list(S.simulate(s, jobs, 3, 0.005, net=net)["shuffle_s"].values())) for s in SCHEMES}
    assert mean["BG+WC"] < mean["BGOnly"]          # work conservation: the spare capacity is used
    assert mean["WCOnly"] != pytest.approx(mean["FullCompetition"])   # per-VM WC against per-connection TCP


@pytest.mark.parametrize("per_vm, want", [(False, 3.2), (True, 1.6)])
def test_the_wc_policy_weighs_a_vm_not_its_connections(k4, per_vm, want):
    # h1 opens three connections to h3, h2 one: per connection h2 gets a quarter of h3's 10 Mb/s, per VM half
    fl = _flows(k4, [("h1", "h3", 0.0, 10 * MB)] * 3 + [("h2", "h3", 0.0, 1 * MB)])
    res = Engine(k4, make_router(k4, "ecmp"), "wc-only", 0.0, wc_per_vm=per_vm).run(fl, 60.0)
    assert res.fct_s[3] == pytest.approx(want)


def test_jobs_are_refused_by_name():
    from experiments.flowsim.shuffle import make_jobs
    with pytest.raises(SimError, match="jobs"):
        make_jobs(0, 1, 1.0)
    with pytest.raises(SimError, match="arrival_per_s"):
        make_jobs(5, 1, math.nan)
    with pytest.raises(SimError, match="max_tasks"):
        make_jobs(5, 1, 1.0, max_tasks=0)


def test_a_shuffle_time_is_its_latest_connection_not_the_last_reported():
    from experiments.flowsim.shuffle import ShuffleJobs, SLOTS
    net = SimNet(with_vm_blocks(fattree(4, link_mbps=10.0)), vms_per_host=2 * SLOTS)
    src = ShuffleJobs(net, [{"id": 7, "arrival_s": 1.0, "shuffle_bytes": 4e6, "mappers": 2, "reducers": 2}], 1)
    got = src.take(2.0, inclusive=False)
    assert len(got[0]) == 4 and np.all(got[2] == 1.0) and np.all(got[3] == 1e6)
    src.completed(np.array([3, 2]), np.array([4.0, 9.0]), 9.0)
    assert 7 not in src.shuffle_s
    src.completed(np.array([1, 0]), np.array([6.0, 5.0]), 9.0)
    assert src.shuffle_s[7] == pytest.approx(8.0) and src.exhausted()
    assert len(src.free_map) == 32 and len(src.free_red) == 32


def test_a_controller_event_a_hair_after_a_window_boundary_does_not_stall_the_loop(k4):
    # a tiny flow ends inside the first window, so the next allocation is at the window's end (t = W); the
    # first poll falls 1e-13 s after it: not due at W, run at the window after
    router = make_router(k4, "lessor", cpu=0.0, rtt_s=0.0)
    window = 0.0005
    router.next_poll = window + 1e-13
    fl = _flows(k4, [("h1", "h16", 0.0, 4 * MB), ("h5", "h6", 0.0, 312.5)])
    res = Engine(k4, router, "fair", window).run(fl, 6.0)
    assert res.fct_s == pytest.approx([3.2, window / 2]) and router.decisions
    assert router.decisions[0]["t"] == pytest.approx(2 * window + 2.5)


# ---- the command ----------------------------------------------------------------------------------

@pytest.mark.parametrize("pairs, word", [
    (["colour=red"], "KEY=VALUE"), (["k=5"], "k"), (["k=x"], "not a int"), (["loads=0.5,nan"], "loads"),
    (["loads=1.5"], "loads"), (["seconds=inf"], "seconds"), (["routings=ospf"], "routings"),
    (["sharing=bgwc"], "sharing"), (["cpu=2"], "cpu"), (["warmup=20", "seconds=10"], "warmup"),
    (["window_ms=-1"], "window_ms"), (["workload=mystery"], "workload"),
])
def test_fabric_settings_are_refused_by_name(pairs, word):
    from experiments.flowsim.command import FabricConfig
    with pytest.raises(SimError, match=word):
        FabricConfig.parse(pairs)


def test_fabric_command_compares_schemes_on_the_same_connections(tmp_path):
    import json

    from experiments.flowsim.command import FabricConfig, run
    cfg = FabricConfig.parse(["k=4", "link_mbps=10", "routings=ecmp,lessor", "loads=0.5", "seconds=6", "cpu=0",
                              "warmup=1"])
    doc = run(cfg, tmp_path, quiet=True)
    saved = json.loads((tmp_path / "fabric.json").read_text())
    assert set(saved["runs"]) == {"0.5/ecmp", "0.5/lessor"} and (tmp_path / "fabric.png").stat().st_size > 0
    e, le = doc["runs"]["0.5/ecmp"], doc["runs"]["0.5/lessor"]
    assert e["connections"] == le["connections"] and e["fct_common"]["n"] == le["fct_common"]["n"] > 0
    assert le["controller"]["decisions"] > 0 and "controller" not in e


def test_ecmp_beyond_64_buckets_still_spreads_over_the_cores():
    """At k = 32 an aggregation switch has 16 up-ports and a layer radix of
    16: the layered layout needs 256 buckets, OVS holds 64. One bucket per
    next hop made the aggregation read the same hash digit as the ToR: a
    host's inter-pod flows met 16 of the 256 cores. Repeating each next hop
    as often as fits reaches 64."""
    net = SimNet(fattree(32, link_mbps=10.0))
    router = make_router(net, "ecmp")
    assert max(len(router._layout(sw, net.view.hosts[-1])) for sw in ("e0_0", "a0_0")) == 64
    rng = np.random.default_rng(1)
    hosts = net.view.hosts
    cores = {router.path(None, int(rng.integers(0, 2**63)), hosts[0], hosts[-1 - int(rng.integers(0, 4000))])[3]
             for _ in range(3000)}
    assert len(cores) == 64


@pytest.mark.parametrize("batch, word", [
    (([0], [99], [0.0], [1.0]), "outside"), (([0], [0], [0.0], [1.0]), "two different"),
    (([0], [1], [math.nan], [1.0]), "start time"), (([0], [1], [-1.0], [1.0]), "start time"),
    (([0], [1], [0.0], [math.inf]), "sizes"), (([0], [1], [0.0], [0.0]), "sizes"),
])
def test_a_sources_bad_connections_are_refused_by_name(k4, batch, word):
    class Once:
        def __init__(self):
            self.given = False

        def next_start(self):
            return math.inf

        def take(self, until, inclusive):
            if self.given:
                return [], [], [], []
            self.given = True
            return batch

        def completed(self, gids, times, now):
            pass

        def exhausted(self):
            return self.given

    eng = Engine(k4, make_router(k4, "ecmp"), "fair", 0.0)
    with pytest.raises(SimError, match=word):
        eng.run(Once(), 5.0)
    assert eng.store.n == 0          # nothing of the batch was added


@pytest.mark.parametrize("sets", [["colour=red"], ["jobs=x"], ["jobs=0"], ["arrival_per_s=nan"],
                                  ["window_ms=inf"], ["max_tasks=0"]])
def test_bgwc_fig19_settings_are_refused_and_nothing_is_written(tmp_path, sets, capsys):
    from experiments.flowsim import shuffle
    assert shuffle.main(tmp_path / "out", sets, as_json=True) == 2
    assert "bwfabric simulate bgwc-fig19" in capsys.readouterr().err
    assert not (tmp_path / "out" / "bgwc_fig19.json").exists()
