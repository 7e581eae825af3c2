"""Agents' replies are input like any other (issue #31 §3): a bad LRC
report or status reply is refused, counted and named against its host;
the LRC round and the metrics scrape go on for everyone else."""

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from apps.lrc.logic import LrcController
from controller import metrics
from controller.agent_sessions import AgentState, check_pair_reports, status_problems
from controller.network_view import NetworkView
from tests.unit.test_lrc_controller import TENANTS, TOPO, ip, loaded

L = loaded(TOPO, TENANTS)
GOOD = {"v_mbps": 25.0, "limit_mbps": 30.0, "guarantee_mbps": 10.0, "weight": 2.5, "factor_age_s": 0.1}


def _ctrl():
    c = LrcController(NetworkView(L.topology), L.cfg.lrc.params(), "ecmp")
    c.configure(L)
    return c


def _finite_factors(out):
    return all(math.isfinite(x) and x >= 0 for pairs in out.values() for terms in pairs.values() for x in terms)


def test_one_hosts_absurd_report_cannot_stop_the_round_for_everyone():
    """v = 1e308 with weight 1e-308 made every LRC round fail for good
    (v/w = inf seeded the links); now the sessions refuse the pair by name,
    and the round itself would still leave it out."""
    evil = {ip(L, "s5"): {"v_mbps": 1e308, "weight": 1e-308}}
    kept, problems = check_pair_reports(evil)
    assert kept == {} and "v_mbps 1e+308" in problems[0] and "weight 1e-308" in problems[0]
    ctrl = _ctrl()
    out = ctrl.round({}, {"s1": evil, "s2": {ip(L, "s7"): dict(GOOD)}})
    assert ctrl.refused_reports == 1 and _finite_factors(out)
    assert ip(L, "s7") in out["s2"]                                          # the good host goes on
    for _ in range(3):
        out = ctrl.round({("sl", "sm"): 50e6}, {"s1": {ip(L, "s5"): dict(GOOD)}, "s2": {ip(L, "s7"): dict(GOOD)}})
        assert _finite_factors(out) and all(math.isfinite(r) for r in ctrl.factors.r.values())


_number = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**400, 10**400),
                    st.booleans(), st.none(), st.text(max_size=4))
_report = st.fixed_dictionaries({}, optional={k: _number for k in GOOD})
_peer = st.one_of(st.sampled_from([ip(L, h) for h in ("s5", "s6", "s7", "s2")]), st.text(max_size=12),
                  st.just("999.1.1.1"))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(_peer, st.one_of(_report, _number, st.lists(_number, max_size=2)), max_size=5),
       st.one_of(st.none(), st.floats(allow_nan=True), st.integers(-10**30, 10**30)))
def test_any_report_leaves_the_round_finite_and_the_other_hosts_served(pairs, load):
    kept, problems = check_pair_reports(pairs)
    assert set(kept) <= set(pairs) and len(kept) + len(problems) == len(pairs)
    for rep in kept.values():
        for k in ("v_mbps", "limit_mbps", "guarantee_mbps"):
            assert k not in rep or (math.isfinite(rep[k]) and 0 <= rep[k] <= 400_000)
    ctrl = _ctrl()
    good = {"s2": {ip(L, "s7"): dict(GOOD)}}
    for reports in ({"s1": kept, **good}, {"s1": pairs, **good}):       # filtered, and raw into the round
        out = ctrl.round({("sl", "sm"): load}, reports)
        assert _finite_factors(out) and ip(L, "s7") in out["s2"]


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["class_bytes", "generation", "version", "in_force", "differences",
                                        "degraded", "ok"]),
                       st.one_of(_number, st.dictionaries(st.one_of(st.text(max_size=20), st.integers()), _number,
                                                          max_size=3), st.lists(_number, max_size=2)), max_size=7))
def test_any_status_reply_is_taken_whole_or_refused_and_the_scrape_never_fails(reply):
    """A status reply with a string class counter made /metrics answer 500
    for everyone; now it is refused, and the collector drops any malformed
    sample a provider still yields."""
    problems = status_problems(reply)
    st_ = AgentState("h1", "unix:/x")
    if not problems:
        st_.class_bytes = reply.get("class_bytes") or {}
    collector = metrics.Collector()
    collector.register("agents", lambda: [("bwfabric_agent_class_bytes", {"host": "h1", "class": c}, n)
                                          for c, n in (reply.get("class_bytes") or {}).items()]
                       if isinstance(reply.get("class_bytes"), dict) else [])
    collector.register("runtime", lambda: [("bwfabric_config_version", {}, 3)])
    reg = metrics.CollectorRegistry(auto_describe=False)
    reg.register(collector)
    text = generate_latest(reg).decode()                                      # never raises
    assert "bwfabric_config_version 3.0" in text
    counts = reply.get("class_bytes")
    good_counts = counts is None or (isinstance(counts, dict) and all(
        isinstance(c, str) and type(n) is int and 0 <= n < 2 ** 64 for c, n in counts.items()))
    assert good_counts or any(p.startswith("class_bytes") for p in problems), (reply, problems)
    for line in text.split("\n"):                  # whatever was exported is a finite number (the exposition
        # format's lines end in \n only; str.splitlines would also cut at a label's \x85 or \u2028)
        if line.startswith("bwfabric_agent_class_bytes"):
            assert math.isfinite(float(line.rsplit(" ", 1)[1]))


def test_a_malformed_sample_is_dropped_and_counted_not_a_failed_scrape():
    collector = metrics.Collector()
    collector.register("bad", lambda: [("bwfabric_agent_class_bytes", {"host": "h1", "class": "1:2"}, "12"),
                                       ("bwfabric_nonsense", {}, 1),
                                       ("bwfabric_agent_class_bytes", {"host": "h1"}, 5),
                                       ("bwfabric_agent_pushes", {"host": "h1"}, math.nan)])
    collector.register("good", lambda: [("bwfabric_config_version", {}, 2)])
    reg = metrics.CollectorRegistry(auto_describe=False)
    reg.register(collector)
    text = generate_latest(reg).decode()
    assert "bwfabric_config_version 2.0" in text
    assert 'bwfabric_metrics_provider_errors_total{provider="bad"} 4.0' in text
    assert not [line for line in text.splitlines() if line.startswith(("bwfabric_agent_class_bytes", "bwfabric_nonsense",
                                                                       "bwfabric_agent_pushes"))]


# ---- hosts of several VMs (issue #32 §4) --------------------------------------------------------
def test_a_rates_reply_per_vm_is_checked_per_vm_and_the_flat_one_is_the_hosts_own():
    from controller.agent_sessions import check_vm_reports
    peer = ip(L, "s5")
    kept, problems = check_vm_reports({"pairs": {peer: dict(GOOD)}}, "s1")        # an agent before #32 §4
    assert kept == {"s1": {peer: GOOD}} and not problems
    kept, problems = check_vm_reports({"pairs": {}, "vms": {"t/a": {peer: dict(GOOD)},
                                                           "t/b": {peer: {"v_mbps": math.inf}},
                                                           "../x": {}, "t/c": 5}}, "s1")
    assert kept == {"t/a": {peer: GOOD}, "t/b": {}, "t/c": {}} and len(problems) == 3, problems
    assert any("VM t/b: pair" in p for p in problems) and any("'../x'" in p for p in problems)
    assert any("VM t/c: pairs must be an object" in p for p in problems)
    assert check_vm_reports({"vms": {f"t/v{i}": {} for i in range(300)}}, "s1") == ({}, ["300 VMs, at most 256"])
    assert check_vm_reports({"vms": []}, "s1")[1] == ["vms must be an object, got list"]


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.one_of(st.sampled_from(["t/a", "s1", "x/y/z", ""]), st.text(max_size=8)),
                       st.one_of(_number, st.dictionaries(st.sampled_from(["in_force", "class_bytes", "degraded",
                                                                           "vms", "differences"]),
                                                          st.one_of(_number, st.lists(_number, max_size=2),
                                                                    st.dictionaries(st.text(max_size=6), _number,
                                                                                    max_size=2)), max_size=4)),
                       max_size=4))
def test_a_status_replys_vms_are_each_checked_like_a_status_reply(vms):
    problems = status_problems({"in_force": True, "vms": vms})
    for name, one in vms.items():
        bad_name = not isinstance(name, str) or not name or name.count("/") > 1
        if bad_name or not isinstance(one, dict) or "vms" in one or status_problems(one):
            assert any(f"vms[{name!r:.40}]" in p or f"vms[{name}]" in p for p in problems), (name, one, problems)
    if not problems:
        assert all(isinstance(v, dict) and not status_problems(v) for v in vms.values())
