"""Default BG routes (apps.lessor.bg_routes) and their entries
(apps.routing.logic), checked on the fake fabric's tables: what the packing
promises of every link (the per-tenant hose bound) holds for the traffic the
installed entries actually forward."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.lessor.bg import BgPolicy
from apps.lessor.bg_routes import BgRoutes, HoseVm, pack, up_paths
from apps.lessor.logic import LessorLogic
from apps.lessor.paths import PathDictionary
from apps.lessor.pmpt import LongFlow, pmpt
from controller import ofmsg
from bwtesting.fakenet import FakeNetwork
from controller.network_view import NetworkView
from controller.pipeline import PRIO_BG_BELOW, PRIO_BG_UP
from mininet_topos import builders

MU = 0.9
ANALYTICS, BATCH = ("h1", "h5", "h9", "h13"), ("h2", "h6", "h10", "h14")
WEB = ("h3", "h4", "h7", "h8", "h11", "h12", "h15", "h16")


def _view():
    return NetworkView(builders.fattree(4, link_mbps=10, fabric_mbps=5))


def _main_job(view, g=4e6):
    """The main job at guarantees 4,4: an analytics and a batch VM of 4 Mb/s
    behind every mixed ToR (5 Mb/s uplinks, mu x 5 = 4.5 each), web at 1."""
    return [HoseVm(view.ip(h), h, t, gb) for t, hosts, gb in
            (("analytics", ANALYTICS, g), ("batch", BATCH, g), ("web", WEB, 1e6)) for h in hosts]


def _policy(vms, mu=MU):
    return BgPolicy({v.address: v.guarantee_bps for v in vms}, {v.address: 10100 for v in vms}, mu,
                    host={v.address: v.host for v in vms}, tenant={v.address: v.tenant for v in vms})


def _fabric(view, vms, mu=MU):
    logic = LessorLogic(view)
    net = FakeNetwork(view)
    for sw in view.switches:
        net.apply(sw, logic.switch_connected(sw))
    for sw, msgs in logic.set_bg(_policy(vms, mu)).items():
        net.apply(sw, msgs)
    assert net.errors() == {}
    return logic, net


def _links(path):
    return list(zip(path, path[1:]))


# ---- the packing --------------------------------------------------------------------------
def test_up_paths_of_a_fat_tree_tor_are_its_four_cores():
    view = _view()
    paths = up_paths(view, "e0_0")
    assert [p[-1] for p in paths] == ["c1", "c2", "c3", "c4"]
    assert all(p[0] == "e0_0" and view.graph.nodes[p[1]]["role"] == "aggregation" for p in paths)
    # a core that lost its link down to pod 3 is no way up for anyone: BG through it to pod 3 would
    # turn down and up again (a valley), longer than a shortest path
    view.set_link_state("a3_0", "c1", False)
    for tor in ("e0_0", "e1_1", "e2_0"):
        assert [p[-1] for p in up_paths(view, tor)] == ["c2", "c3", "c4"]


def test_main_job_guarantees_fit_every_link_and_the_two_vms_of_a_tor_go_apart():
    view = _view()
    routes = pack(view, _main_job(view), MU)
    assert routes.over == []
    assert max(routes.load.values()) <= MU * 5e6 * (1 + 1e-9)
    for a, b in zip(ANALYTICS, BATCH):       # the two 4 Mb/s VMs of a mixed ToR: different uplinks
        assert routes.up[view.ip(a)][1] != routes.up[view.ip(b)][1]


def test_hashing_them_would_not_fit_one_uplink():
    """What the routes are for: the same two VMs on one uplink put 8 Mb/s of
    BG bound on 4.5."""
    view = _view()
    routes = pack(view, _main_job(view), MU)
    both = dict(routes.up)
    both[view.ip("h2")] = routes.up[view.ip("h1")]
    forced = pack(view, _main_job(view), MU, previous=both)   # kept only while it fits: it does not
    assert forced.up[view.ip("h2")][1] != forced.up[view.ip("h1")][1]


def test_the_bound_is_per_tenant_min_of_senders_and_receivers():
    view = _view()
    vms = [HoseVm(view.ip("h1"), "h1", "t", 3e6), HoseVm(view.ip("h2"), "h2", "t", 3e6),
           HoseVm(view.ip("h9"), "h9", "t", 1e6)]
    routes = pack(view, vms, 1.0)
    # everything that leaves e0_0 goes to h9 (1 Mb/s of receivers) or stays below it: min(6, 1) on one
    # uplink, the second VM on the first's adds nothing there
    up = {lk: b for lk, b in routes.load.items() if lk[0] == "e0_0"}
    assert list(up.values()) == [pytest.approx(1e6)]
    assert routes.up[view.ip("h1")] == routes.up[view.ip("h2")]
    # h9 -> h1/h2: senders 1, receivers 6 -> 1 on the one uplink it uses
    assert sum(b for lk, b in routes.load.items() if lk[0] == "e2_0") == pytest.approx(1e6)


def test_another_tenant_adds_its_own_bound():
    view = _view()
    vms = [HoseVm(view.ip("h1"), "h1", "a", 2e6), HoseVm(view.ip("h9"), "h9", "a", 2e6),
           HoseVm(view.ip("h2"), "h2", "b", 2e6), HoseVm(view.ip("h10"), "h10", "b", 2e6)]
    routes = pack(view, vms, MU, previous={view.ip("h1"): ("e0_0", "a0_0", "c1"),
                                           view.ip("h2"): ("e0_0", "a0_0", "c1")})
    assert routes.load[("e0_0", "a0_0")] == pytest.approx(4e6)    # kept (4 <= 4.5): 2 + 2


@pytest.mark.parametrize("victim", ["h1", "h3", "h16"])
def test_a_link_down_moves_only_the_vms_that_used_it_while_that_fits(victim):
    """After a failure the VMs whose up-paths are still up-paths (working,
    and a shortest way to every destination above each switch: an
    aggregation-core link down takes that core from every pod) keep them if
    the result fits mu x C; when it does not, the packing is redone and fits."""
    from apps.lessor.bg_routes import _pack
    view = _view()
    vms = _main_job(view)
    before = pack(view, vms, MU)
    u, v = before.up[view.ip(victim)][1:3]
    view.set_link_state(u, v, False)
    after = pack(view, vms, MU, previous=before.up)
    assert all((u, v) not in _links(p) for p in after.up.values())
    users = {a for a, p in before.up.items() if p not in up_paths(view, p[0])}
    moved = {a for a in after.up if after.up[a] != before.up[a]}
    kept = _pack(view, vms, MU, before.up)
    if kept.over:
        assert after.over == [] and after.up != kept.up
    else:
        assert view.ip(victim) in moved and moved <= users, (moved, users)
    view.set_link_state(u, v, True)
    assert pack(view, vms, MU, previous=after.up).up == after.up      # back up: no churn


def test_tor_path_is_what_the_switches_do():
    view = _view()
    logic, net = _fabric(view, _main_job(view))
    for a in (*ANALYTICS, *BATCH, *WEB):
        for b in view.hosts:
            if a == b:
                continue
            for proto in ("tcp", "udp"):
                trace = net.trace(a, net.packet(a, b, proto=proto, dscp=0))
                assert trace.delivered_to == b
                want = logic.bg_routes.tor_path(view, view.ip(a), view.ip(b))
                assert want == trace.path, (a, b, trace.path, want)


def test_wc_is_not_routed_by_it():
    view = _view()
    _, net = _fabric(view, _main_job(view))
    cores = {net.trace("h1", net.packet("h1", "h9", sport=s, dscp=8)).path[2] for s in range(40000, 40200)}
    assert cores == {"c1", "c2", "c3", "c4"}
    bg = {net.trace("h1", net.packet("h1", "h9", sport=s, dscp=0)).path[2] for s in range(40000, 40200)}
    assert len(bg) == 1


def test_destinations_below_never_climb():
    view = _view()
    _, net = _fabric(view, _main_job(view))
    assert net.trace("h1", net.packet("h1", "h2", dscp=0)).path == ("e0_0",)
    assert len(net.trace("h1", net.packet("h1", "h3", dscp=0)).path) == 3       # e0_0, an aggregation, e0_1
    entries = net.switches["e0_0"].flows(1)
    assert {fm.priority for fm in entries} >= {PRIO_BG_UP, PRIO_BG_BELOW}
    below = {fm.match.as_dict().get("ipv4_dst") for fm in entries if fm.priority == PRIO_BG_BELOW}
    assert below == {view.ip("h1"), view.ip("h2")}


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["h%d" % i for i in range(1, 17)]), st.sampled_from("xyz"),
                          st.floats(0.1, 5.0)), min_size=2, max_size=12, unique_by=lambda t: t[0]),
       st.lists(st.floats(0.0, 1.0), min_size=144, max_size=144))
def test_property_no_hose_matrix_puts_more_on_a_link_than_its_bound(placed, weights):
    """Any traffic matrix within every VM's hose (and its tenant) that the
    installed entries forward puts on each link at most the packing's bound
    for it, whatever the packing chose."""
    view = _view()
    vms = [HoseVm(view.ip(h), h, t, g * 1e6) for h, t, g in placed]
    logic, net = _fabric(view, vms, 1.0)
    # a random matrix among tenant peers, scaled into every hose (sender and receiver side)
    rate, i = {}, 0
    for s in vms:
        for d in vms:
            if s is not d and s.tenant == d.tenant:
                rate[(s, d)] = weights[i % len(weights)]
                i += 1
    for vm in vms:
        for side in (0, 1):
            total = sum(r for k, r in rate.items() if k[side] is vm)
            if total > vm.guarantee_bps:
                for k in [k for k in rate if k[side] is vm]:
                    rate[k] *= vm.guarantee_bps / total
    scale = min([vm.guarantee_bps / max(sum(r for k, r in rate.items() if k[side] is vm), 1e-12)
                 for vm in vms for side in (0, 1)] or [1.0])
    on: dict = {}
    for (s, d), r in rate.items():
        path = net.trace(s.host, net.packet(s.host, d.host, dscp=0)).path
        for lk in _links(path):
            on[lk] = on.get(lk, 0.0) + r * scale
    for lk, b in on.items():
        assert b <= logic.bg_routes.load.get(lk, 0.0) * (1 + 1e-9) + 1e-6, (lk, b, logic.bg_routes.load.get(lk))


# ---- refusals -----------------------------------------------------------------------------
@pytest.mark.parametrize("g", [math.nan, math.inf, -1.0, 0.0, True, "4"])
def test_a_bad_guarantee_is_refused_by_name(g):
    with pytest.raises(ValueError, match="10.0.0.1"):
        HoseVm("10.0.0.1", "h1", "t", g)


@pytest.mark.parametrize("field", ["host", "tenant"])
@pytest.mark.parametrize("bad", ["", None, 3])
def test_a_bad_host_or_tenant_is_refused(field, bad):
    kw = {"address": "10.0.0.1", "host": "h1", "tenant": "t", "guarantee_bps": 1e6, field: bad}
    with pytest.raises(ValueError, match=field):
        HoseVm(**kw)


@pytest.mark.parametrize("mu", [math.nan, math.inf, 0.0, 1.5, -0.1])
def test_a_bad_mu_is_refused(mu):
    view = _view()
    with pytest.raises(ValueError, match="mu"):
        pack(view, _main_job(view), mu)


def test_unknown_host_and_duplicate_address_are_refused():
    view = _view()
    with pytest.raises(ValueError, match="h99"):
        pack(view, [HoseVm("10.9.9.9", "h99", "t", 1e6)], MU)
    with pytest.raises(ValueError, match="twice"):
        pack(view, [HoseVm(view.ip("h1"), "h1", "t", 1e6), HoseVm(view.ip("h1"), "h1", "u", 1e6)], MU)
    with pytest.raises(TypeError):
        pack(view, [("10.0.0.1", "h1", "t", 1e6)], MU)


def test_policy_refuses_a_host_or_tenant_without_a_guarantee():
    with pytest.raises(ValueError, match="without its guarantee"):
        BgPolicy({"10.0.0.1": 1e6}, host={"10.0.0.2": "h2"})
    with pytest.raises(ValueError, match="tenant"):
        BgPolicy({"10.0.0.1": 1e6}, tenant={"10.0.0.1": ""})


@pytest.mark.parametrize("bad", [["e0_0", "a0_0"], ("e0_0", "c1"), ("e0_0", "h1"), ("nope",), (1, 2), ()])
def test_routing_refuses_a_bad_up_path_and_keeps_what_is_in_force(bad):
    view = _view()
    logic, _ = _fabric(view, _main_job(view))
    before = dict(logic.routing.bg_up)
    with pytest.raises(ValueError, match="up-path"):
        logic.routing.set_bg_up({view.ip("h1"): bad})
    assert logic.routing.bg_up == before


# ---- LESSOR keeps BG where the switches send it ------------------------------------------
def test_pmpt_places_bg_on_its_fixed_path_and_the_rest_around_it():
    view = _view()
    paths = PathDictionary(view)
    cands = paths.paths("e0_0", "e2_0")[0]
    fixed = cands[-1]
    flows = [LongFlow("bg", "e0_0", "e2_0", 4e6, bg=4e6, fixed_path=fixed),
             LongFlow("wc", "e0_0", "e2_0", 5e6)]
    alloc = pmpt(flows, paths, mu=MU)
    assert alloc.flow_path["bg"] == fixed
    assert alloc.flow_path["wc"][1] != fixed[1]          # WC away from the uplink BG fills
    assert alloc.bg_load[(fixed[0], fixed[1])] == pytest.approx(4e6)


def test_pmpt_places_bg_itself_when_its_fixed_path_is_down():
    view = _view()
    paths = PathDictionary(view)
    fixed = paths.paths("e0_0", "e2_0")[0][0]
    view.set_link_state(fixed[1], fixed[2], False)
    alloc = pmpt([LongFlow("bg", "e0_0", "e2_0", 4e6, bg=4e6, fixed_path=fixed)], paths, mu=MU)
    assert alloc.flow_path["bg"] != fixed and (fixed[1], fixed[2]) not in _links(alloc.flow_path["bg"])


def test_pmpt_places_kept_flows_on_their_paths_and_the_others_around_them():
    """A flow LESSOR keeps where it is (not BG) is placed on its fixed path,
    its demand counted there: the flow that could take either uplink goes
    where the kept one is not (with or without BG in the same allocation);
    a kept path that went down is placed afresh."""
    view = _view()
    paths = PathDictionary(view)
    cands = paths.paths("e0_0", "e2_0")[0]
    a = cands[0]
    b = next(p for p in cands if p[1] != a[1])            # the other uplink (5 Mb/s each)
    for extra in ([], [LongFlow("bg", "e0_1", "e3_0", 1e6, bg=1e6)]):
        for kept in (a, b):
            flows = [LongFlow("kept", "e0_0", "e2_0", 5e6, fixed_path=kept), LongFlow("free", "e0_0", "e2_0", 5e6),
                     *extra]
            alloc = pmpt(flows, paths, mu=MU)
            assert alloc.flow_path["kept"] == kept and alloc.flow_rate["kept"] == 5e6
            assert alloc.flow_path["free"][1] != kept[1], (kept, alloc.flow_path)
    view.set_link_state(a[1], a[2], False)
    alloc = pmpt([LongFlow("kept", "e0_0", "e2_0", 5e6, fixed_path=a)], paths, mu=MU)
    assert (a[1], a[2]) not in _links(alloc.flow_path["kept"])


@pytest.mark.parametrize("kw,match", [
    (dict(bg=0.0, fixed_path=("e0_0", "a0_0", "c1", "a2_1", "e2_0")), "fixed path"),
    (dict(bg=1e6, fixed_path=("e0_1", "a0_0", "c1", "a2_0", "e2_0")), "fixed path"),
    (dict(bg=1e6, fixed_path=("e0_0", "c1", "e2_0")), "fixed path"),
    (dict(bg=1e6, fixed_path=["e0_0", "a0_0", "c1", "a2_0", "e2_0"]), "fixed path"),
])
def test_pmpt_refuses_a_bad_fixed_path_by_name(kw, match):
    view = _view()
    with pytest.raises(ValueError, match=match):
        pmpt([LongFlow("f", "e0_0", "e2_0", 1e6, **kw)], PathDictionary(view), mu=MU)


def test_lessor_installs_bg_long_flows_on_their_default_route():
    view = _view()
    logic, net = _fabric(view, _main_job(view))
    keys = [(view.ip("h1"), view.ip("h9"), 6, 40000, 7100), (view.ip("h2"), view.ip("h10"), 17, 43000, 7200),
            (view.ip("h1"), view.ip("h9"), 6, 40001, 10101)]
    for step in range(1, 5):
        for key in keys:
            logic.table.update(key, "e0_0", "e2_0", int(step * 4e6 / 8), float(step))
    flows = logic.long_flows()
    fixed = {f.key: f.fixed_path for f in flows}
    assert fixed[keys[0]] == logic.bg_routes.tor_path(view, keys[0][0], keys[0][1]) is not None
    assert fixed[keys[1]] is not None and fixed[keys[2]] is None     # a join (WC) is LESSOR's to place
    logic.install(logic.allocate(flows), flows)
    for key in keys[:2]:
        assert logic.installed[key].path[1:-1] == fixed[key]
    assert logic.bg_over(logic.installed) == []


@pytest.mark.parametrize("victim", ["h1", "h13"])
def test_lessor_reroutes_bg_defaults_when_a_link_fails(victim):
    view = _view()
    logic, net = _fabric(view, _main_job(view))
    path = logic.bg_routes.up[view.ip(victim)]
    sw = path[1]
    for s, msgs in logic.link_changed(sw, view.port(sw, path[2]), False).items():
        net.apply(s, msgs)
    assert net.errors() == {}
    new = logic.bg_routes.up[view.ip(victim)]
    assert (path[1], path[2]) not in _links(new)
    assert logic.state()["bg_routes"]["up"][view.ip(victim)] == list(new)
    # every VM's BG still takes a shortest way: no up-path keeps the core that lost its way down to a pod
    for a in (*ANALYTICS, *BATCH, *WEB):
        for b in view.hosts:
            if a != b:
                got = net.trace(a, net.packet(a, b, dscp=0))
                assert got.delivered_to == b
                assert len(got.path) == len(view.equal_cost_paths(view.host_switch(a)[0], view.host_switch(b)[0])[0])


def test_no_routes_without_hosts_and_tenants():
    view = _view()
    logic = LessorLogic(view)
    vms = _main_job(view)
    assert logic.set_bg(BgPolicy({v.address: v.guarantee_bps for v in vms}, mu=MU)) == {}
    assert logic.bg_routes.up == {} and logic.routing.bg_up == {}
    assert isinstance(logic.bg_routes, BgRoutes)
    assert not any(fm.priority == PRIO_BG_UP for fm in logic.switch_connected("e0_0")
                   if isinstance(fm, ofmsg.FlowMod))
