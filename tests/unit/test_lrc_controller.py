"""LRC's controller round on a declared configuration: pairs from the
agents' reports (one tenant at a time), Eqs. 1 and 2, the links a pair may
use, factors from loads, resuming from the hosts' v, the delay estimate."""

import pytest

from bwcommon import lrc as M
from apps.lrc.logic import LrcController, pair_links
from controller import config, tenancy
from controller.network_view import NetworkView
from mininet_topos.builders import bgwc_testbed, fattree


def loaded(topo, tenants, **lrc):
    return config.from_data({"fabric": {"topology": topo.to_dict()},
                             "agents": {"master_key_file": "/nonexistent", "address_template": "unix:/tmp/{host}"},
                             "tenants": tenants, "lrc": {"enabled": True, **lrc}})


TOPO = bgwc_testbed(link_mbps=100)
TENANTS = {"a": {"vms": {"x1": {"host": "s1", "guarantee_mbps": 30, "weight": 1},
                         "y1": {"host": "s5", "guarantee_mbps": 20, "weight": 2},
                         "y2": {"host": "s6", "guarantee_mbps": 40, "weight": 1}}},
           "b": {"vms": {"z": {"host": "s2", "guarantee_mbps": 10}, "w": {"host": "s7", "guarantee_mbps": 10}}}}


def ip(l, host):
    return l.topology.host(host).ip


def test_pairs_terms_and_links():
    l = loaded(TOPO, TENANTS)
    ctrl = LrcController(NetworkView(l.topology), l.cfg.lrc.params(), "ecmp")
    ctrl.configure(l)
    reports = {"s1": {ip(l, "s5"): {}, ip(l, "s6"): {}, ip(l, "s7"): {}},      # s7 is tenant b's: refused
               "s2": {ip(l, "s7"): {}}}
    out = ctrl.round({}, reports)
    assert ctrl.refused_reports == 1
    # x1 sends to y1 (w 2) and y2 (w 1): Eq. 1 w = 1/2 + w_y/1; Eq. 2 B = min(30·w_y/3, B_y·1/1)
    r_y1, w_y1, b_y1 = out["s1"][ip(l, "s5")]
    r_y2, w_y2, b_y2 = out["s1"][ip(l, "s6")]
    assert (w_y1, b_y1) == pytest.approx((0.5 + 2, min(30 * 2 / 3, 20)))
    assert (w_y2, b_y2) == pytest.approx((0.5 + 1, min(30 * 1 / 3, 40)))
    assert set(out) == {"s1", "s2"} and out["s2"][ip(l, "s7")][2] == pytest.approx(10)
    # the links of s1 -> s5: host link, sl -> sm, sm -> sr, sr -> s5
    assert ctrl.links_of[("s1", "s5")] == {("s1", "sl"), ("sl", "sm"), ("sm", "sr"), ("sr", "s5")}
    # first round, no loads and nothing to resume from: Eq. 7/equilibrium seeds; r̃ the least on the path
    assert r_y1 == pytest.approx(ctrl.factors.pair_factor((ip(l, "s1"), ip(l, "s5"))))


def test_factors_follow_the_loads_and_the_hosts_limits_resume():
    l = loaded(TOPO, {"a": TENANTS["a"]}, beta=1.0, wc="ceiling")
    view = NetworkView(l.topology)
    ctrl = LrcController(view, l.cfg.lrc.params(), "ecmp")
    ctrl.configure(l)
    y1 = ip(l, "s5")
    # a restarted controller: the host reports v = 50 for a pair of weight 2.5 -> r = 20 on its links
    ctrl.round({}, {"s1": {y1: {"v_mbps": 50.0, "weight": 2.5}}})
    r0 = ctrl.factors.r[("sl", "sm")]
    # the pair's links carry 100 Mb/s, above μC = 90: r falls; an idle round: r rises
    loads = {link: 100e6 for link in ctrl.links_of[("s1", "s5")]}
    ctrl.round(loads, {"s1": {y1: {}}})
    assert ctrl.factors.r[("sl", "sm")] < r0
    r1 = ctrl.factors.r[("sl", "sm")]
    ctrl.round({link: 0.0 for link in loads}, {"s1": {y1: {}}})
    assert ctrl.factors.r[("sl", "sm")] > r1
    # a NaN or negative load is not taken
    ctrl.round({("sl", "sm"): float("nan"), ("sm", "sr"): -5.0}, {"s1": {y1: {}}})
    # no pairs reported: nothing pushed, factors dropped
    assert ctrl.round({}, {"s1": {}}) == {} and ctrl.factors.r == {}


def test_resume_seeds_from_reported_v():
    l = loaded(TOPO, {"a": TENANTS["a"]}, anti_windup=False)
    ctrl = LrcController(NetworkView(l.topology), l.cfg.lrc.params(), "ecmp")
    ctrl.configure(l)
    y1 = ip(l, "s5")
    ctrl.round({link: 90e6 for link in [("s1", "sl"), ("sl", "sm"), ("sm", "sr"), ("sr", "s5")]},
               {"s1": {y1: {"v_mbps": 50.0, "weight": 2.5}}})
    # seeded at 50/2.5 = 20 on every link of the path, then one step at load = μC: unchanged
    assert ctrl.factors.r[("sl", "sm")] == pytest.approx(20)


def test_single_path_is_one_path_ecmp_the_union():
    topo = fattree(k=4, link_mbps=10)
    view = NetworkView(topo)
    hosts = [h.name for h in topo.hosts]
    src, dst = hosts[0], hosts[-1]               # different pods: 4 equal-cost paths
    one = pair_links(view, "single_path", src, dst)
    union = pair_links(view, "ecmp", src, dst)
    # host -> edge -> agg -> core -> agg -> edge -> host: 6 links; the union has every agg/core choice
    assert len(one) == 6 and one < union
    assert len(union) == 2 + 2 * 2 + 4 * 2        # host links, edge<->agg (2 each side), agg<->core (4 each side)


def test_the_delay_estimate_moves_the_model():
    l = loaded(TOPO, {"a": TENANTS["a"]})
    ctrl = LrcController(NetworkView(l.topology), l.cfg.lrc.params(), "ecmp")
    for _ in range(60):
        ctrl.observe_delay(0.05)
    assert ctrl.delay_s == pytest.approx(0.05, rel=0.01)
    assert ctrl.factors.params.feedback_delay_s == pytest.approx(0.05, rel=0.06)
    ctrl.observe_delay(float("nan"))
    ctrl.observe_delay(-1)
    assert ctrl.delay_s == pytest.approx(0.05, rel=0.01)


def test_tenancy_gives_each_agent_its_peers():
    l = loaded(TOPO, TENANTS, mode="combined")
    cfgs = tenancy.host_configs(l)
    pol = cfgs["s1"]["s1"].vm.lrc
    assert pol.weight == 1 and set(pol.peers) == {ip(l, "s5"), ip(l, "s6")}
    assert pol.peers[ip(l, "s5")].weight == 2 and pol.params.tau_r_s == l.cfg.lrc.tau_r_s
    off = config.from_data({"fabric": {"topology": TOPO.to_dict()}, "tenants": TENANTS,
                            "agents": {"master_key_file": "/nonexistent", "address_template": "unix:/tmp/{host}"}})
    assert tenancy.host_configs(off)["s1"]["s1"].vm.lrc is None


def test_paper_mode_needs_single_subflow_tenants():
    with pytest.raises(config.ConfigError, match=r"tenants\.a\.wc_subflows: must be 0"):
        loaded(TOPO, TENANTS, mode="paper")
    with pytest.raises(config.ConfigError, match=r"lrc\.beta"):
        loaded(TOPO, TENANTS, beta=float("inf"))
    ok = {t: {**v, "wc_subflows": 0} for t, v in TENANTS.items()}
    assert tenancy.host_configs(loaded(TOPO, ok, mode="paper"))["s1"]["s1"].vm.lrc.mode == "paper"
    assert M.LrcParams().tau_v_s == 0.05


def test_two_vms_of_one_host_are_lrc_senders_of_their_own():
    """Issue #32 §4: x1 and x2 share s1, each in a namespace of its own;
    their pairs are reported, terms computed and answered per VM (by its
    name at the agent), and s1's other tenant's VM never sees them."""
    d = TOPO.to_dict()
    for h in d["hosts"]:
        if h["name"] == "s1":
            h["vm_prefix"] = "10.7.1.0/28"
    from controller.topology import TopologyDescription
    topo = TopologyDescription.from_dict(d)
    tenants = {"a": {"vms": {"x1": {"host": "s1", "guarantee_mbps": 30, "netns": "x1", "address": "10.7.1.1"},
                             "x2": {"host": "s1", "guarantee_mbps": 20, "netns": "x2", "address": "10.7.1.2"},
                             "y1": {"host": "s5", "guarantee_mbps": 20}}},
               "b": {"vms": {"z": {"host": "s1", "guarantee_mbps": 10, "netns": "z", "address": "10.7.1.3"},
                             "w": {"host": "s7", "guarantee_mbps": 10}}}}
    l = loaded(topo, tenants)
    cfgs = tenancy.host_configs(l)["s1"]
    assert set(cfgs) == {"a/x1", "a/x2", "b/z"}
    assert set(cfgs["a/x1"].vm.lrc.peers) == {"10.7.1.2", ip(l, "s5")}      # its tenant's, by VM address
    assert set(cfgs["b/z"].vm.lrc.peers) == {ip(l, "s7")}
    ctrl = LrcController(NetworkView(l.topology), l.cfg.lrc.params(), "ecmp")
    ctrl.configure(l)
    out = ctrl.round({}, {"a/x1": {ip(l, "s5"): {}}, "a/x2": {ip(l, "s5"): {}, "10.7.1.1": {}},
                          "b/z": {ip(l, "s5"): {}}})                      # z -> y1 crosses tenants: refused
    assert ctrl.refused_reports == 1
    assert set(out) == {"a/x1", "a/x2"} and set(out["a/x2"]) == {ip(l, "s5")}   # x2 -> x1 stays in s1: no links
    assert out["a/x1"][ip(l, "s5")][2] == pytest.approx(min(30 * 1 / 2, 20 * 1 / 2))   # Eq. 2, y1's B shared
