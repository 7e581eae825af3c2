"""Property-based tests (Hypothesis) at bwfabric's boundaries: agent
configurations, topology files, app settings, PRE inputs and OpenFlow
events through the fake network. Each asserts: no crash, a named error for
bad input, and nothing in force changed by refused input."""

import copy
import json
import math

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from apps.lessor.pre import AdaptivePolling, FlowTable, PollingConfig, predict_rate
from controller.topology import TopologyDescription, TopologyError
from hostagent.plan import HostConfig, PlanError, host_plan
from mininet_topos import builders

ANY_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                       st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30))
ANY_JSON = st.recursive(ANY_SCALAR, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=10), c,
                                                                                       max_size=3), max_leaves=10)

GOOD = dict(host="h1", interface="h1-eth0", address="10.0.0.1", nic_mbps=100, guarantee_mbps=30, wc_subflows=2)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(list(HostConfig.FIELDS) + ["bogus"]), ANY_JSON)
def test_agent_configs_are_valid_or_refused_by_name(key, value):
    data = {**GOOD, key: value}
    try:
        cfg = HostConfig.from_dict(data)
    except PlanError as exc:
        assert key in str(exc) or "configuration" in str(exc)
        return
    plan = host_plan(cfg)                       # an accepted config always plans
    for s in plan.steps:
        for v in vars(s).values():
            if isinstance(v, float):
                assert math.isfinite(v)
            if isinstance(v, int):
                assert -2**63 < v < 2**64


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=6), st.floats(allow_nan=True, allow_infinity=True) | st.integers(-5, 10**7),
                       max_size=4))
def test_pair_limits_are_valid_or_refused(pairs):
    try:
        cfg = HostConfig.from_dict({**GOOD, "pair_limits_mbps": pairs})
    except PlanError as exc:
        assert "pair_limits_mbps" in str(exc)
        return
    assert all(0 < v <= cfg.nic_mbps and math.isfinite(v) for v in cfg.pair_limits_mbps.values())


@pytest.fixture(scope="module")
def fattree():
    return builders.fattree(4).to_dict()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["switches", "hosts", "links"]), st.integers(0, 40), st.text(max_size=12), ANY_JSON)
def test_topology_files_are_valid_or_refused_naming_the_entry(fattree, section, index, key, value):
    data = copy.deepcopy(fattree)
    items = data[section]
    item = items[index % len(items)]
    field = key if key else next(iter(item))
    item[field] = value
    try:
        text = json.dumps(data, allow_nan=True)
    except (TypeError, ValueError):
        return
    try:
        topo = TopologyDescription.from_dict(json.loads(text))
    except TopologyError as exc:
        assert exc.problems and all(isinstance(p, str) and p for p in exc.problems)
        return
    for lk in topo.links:
        assert math.isfinite(lk.capacity_mbps) and lk.capacity_mbps > 0


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_topology_file_bytes_never_give_a_traceback(tmp_path_factory, raw):
    path = tmp_path_factory.mktemp("t") / "t.json"
    path.write_bytes(raw)
    with pytest.raises(TopologyError):
        TopologyDescription.load(path)


@pytest.mark.parametrize("text,problem", [
    ('{"name":"x","switches":[],"hosts":[],"links":[]}', "at least one switch"),
    (json.dumps({"name": "x", "switches": [{"name": "s1", "dpid": 1, "role": "edge"}],
                 "hosts": [{"name": "h1\n", "ip": "10.0.0.1", "mac": "02:00:00:00:00:01"}], "links": []}),
     "name must be"),
    (json.dumps({"name": "x", "switches": [{"name": "s1", "dpid": 1, "role": "edge"}],
                 "hosts": [{"name": "h1", "ip": "255.255.255.255", "mac": "02:00:00:00:00:01"}],
                 "links": [{"a": "h1", "a_port": 0, "b": "s1", "b_port": 1, "capacity_mbps": 10}]}), "broadcast"),
    (json.dumps({"name": "x", "switches": [{"name": "s1", "dpid": 1, "role": "edge"}],
                 "hosts": [{"name": "h1", "ip": "224.0.0.5", "mac": "02:00:00:00:00:01"}],
                 "links": [{"a": "h1", "a_port": 0, "b": "s1", "b_port": 1, "capacity_mbps": 10}]}), "multicast"),
    ('{"name":"x","switches":[{"name":"s1","dpid":1,"role":"edge"}],"hosts":[{"name":"h1","ip":"10.0.0.1",'
     '"mac":"02:00:00:00:00:01"}],"links":[{"a":"h1","a_port":0,"b":"s1","b_port":1,"capacity_mbps":Infinity}]}',
     "Infinity"),
    ("[" * 500 + "]" * 500, "nested"),
])
def test_topology_files_the_landed_code_accepted_are_refused(tmp_path, text, problem):
    path = tmp_path / "t.json"
    path.write_text(text)
    with pytest.raises(TopologyError, match=problem):
        TopologyDescription.load(path)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["lower", "upper", "initial_s", "alpha", "alpha_min", "alpha_step",
                                        "min_s", "max_s", "rtt_factor", "x"]), ANY_SCALAR, max_size=4),
       ANY_SCALAR)
def test_lessor_settings_are_valid_or_refused(polling, epsilon):
    from controller import config
    data = {"fabric": {"topology": {"name": "x", "switches": [{"name": "s1", "dpid": 1, "role": "edge"}],
                                    "hosts": [{"name": "h1", "ip": "10.0.0.1", "mac": "02:00:00:00:00:01"}],
                                    "links": [{"a": "h1", "a_port": 0, "b": "s1", "b_port": 1,
                                               "capacity_mbps": 10}]}},
            "lessor": {"polling": polling, "epsilon": epsilon}}
    try:
        loaded = config.from_data(data)
    except config.ConfigError as exc:
        assert all(p.startswith("lessor.") for p in exc.problems), exc.problems
        return
    assert 0 < loaded.cfg.lessor.epsilon < 0.5
    for v in vars(loaded.cfg.lessor.polling.polling_config()).values():
        assert math.isfinite(v)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.floats(allow_nan=True, allow_infinity=True), st.one_of(
    st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True))), max_size=20))
@example(samples=[(-8.670224781002118e-305, 0), (0.0, 1949)])   # found by Hypothesis: a rate over 1e-304 s
def test_pre_flow_table_never_predicts_a_negative_or_non_finite_rate(samples):
    table = FlowTable()
    for t, count in samples:
        if not isinstance(count, int) or isinstance(count, bool):
            continue
        try:
            table.update("f", "e0_0", "e1_0", count, t)
        except ValueError as exc:
            assert "flow" in str(exc)
    st_ = table.flows.get("f")
    if st_ is not None and st_.predicted is not None:
        assert math.isfinite(st_.predicted) and st_.predicted >= 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(allow_nan=True, allow_infinity=True),
                          st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True))), max_size=30))
def test_adaptive_polling_stays_within_its_bounds_whatever_it_is_fed(inputs):
    pol = AdaptivePolling(PollingConfig())
    for cpu, rtt in inputs:
        try:
            pol.decide(cpu, rtt)
        except ValueError as exc:
            assert "cpu" in str(exc) or "rtt" in str(exc)
        if rtt is not None:
            try:
                pol.record_rtt(rtt)
            except ValueError as exc:
                assert "rtt" in str(exc)
        assert pol.config.min_s <= pol.period_s <= pol.config.max_s
        avg = pol.rtt_average
        assert avg is None or math.isfinite(avg)


def test_predict_rate_is_eq_4():
    assert predict_rate(10, 10.5) == 10.25
    assert predict_rate(10, 20) is None and predict_rate(10, 20, 12) == 14
