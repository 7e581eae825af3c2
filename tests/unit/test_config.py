"""The declared configuration: the examples pass; every kind of mistake is
named with its path and refused; the reference in docs/ is the schema's."""

import copy
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from controller import config, tenancy

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
BASE = yaml.safe_load((ROOT / "examples" / "fattree4.yaml").read_text())
BASE["fabric"]["topology"] = str(ROOT / "examples" / "fattree4.json")


def problems_of(data) -> list[str]:
    with pytest.raises(config.ConfigError) as exc:
        config.from_data(data)
    return exc.value.problems


def mutate(fn):
    data = copy.deepcopy(BASE)
    fn(data)
    return data


def setin(path, value):
    def fn(data):
        node = data
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return fn


def delin(path):
    def fn(data):
        node = data
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]
    return fn


VM = ("tenants", "analytics", "vms", "a3")
BROKEN = {
    "negative guarantee": (setin(VM + ("guarantee_mbps",), -1), "tenants.analytics.vms.a3.guarantee_mbps",
                           "greater than or equal to 0.001"),
    "zero guarantee": (setin(VM + ("guarantee_mbps",), 0), "tenants.analytics.vms.a3.guarantee_mbps",
                       "greater than or equal to 0.001"),
    # issue #31: accepted before, then prio_queues failed on "guarantee 0.0" (a meter of 0 kb/s)
    "subnormal guarantee": (setin(VM + ("guarantee_mbps",), 5e-324), "tenants.analytics.vms.a3.guarantee_mbps",
                            "greater than or equal to 0.001"),
    "1e-9 guarantee": (setin(VM + ("guarantee_mbps",), 1e-9), "tenants.analytics.vms.a3.guarantee_mbps",
                       "greater than or equal to 0.001"),
    "unit_mbps 1e-300": (setin(("agents", "defaults", "unit_mbps"), 1e-300), "agents.defaults.unit_mbps",
                         "greater than or equal to 0.001"),
    # a VM larger than its own NIC while its peers are small: the NIC cut counts the VM's own B
    "guarantee over its NIC": (setin(VM + ("guarantee_mbps",), 9.5), "admission: host", "guarantees of its VMs 9.5"),
    "NaN guarantee": (setin(VM + ("guarantee_mbps",), math.nan), "tenants.analytics.vms.a3.guarantee_mbps", "finite"),
    "infinite weight": (setin(VM + ("weight",), math.inf), "tenants.analytics.vms.a3.weight", "finite"),
    "string guarantee": (setin(VM + ("guarantee_mbps",), "lots"), "tenants.analytics.vms.a3.guarantee_mbps", "number"),
    "missing guarantee": (delin(VM + ("guarantee_mbps",)), "tenants.analytics.vms.a3.guarantee_mbps", "required"),
    "unknown key": (setin(("lessor", "epsilom"), 0.1), "lessor.epsilom", "unknown key"),
    "unknown section": (setin(("openflow",), {}), "openflow", "unknown key"),
    "unknown host": (setin(VM + ("host",), "h99"), "tenants.analytics.vms.a3.host", "not a host of the topology"),
    "two VMs on one host": (setin(VM + ("host",), "h1"), "tenants.analytics.vms.a3.netns",
                            "more VMs on a host need a netns each"),
    "NIC over-subscribed": (setin(VM + ("guarantee_mbps",), 9.5), "admission: host h9 NIC", "exceed mu 0.9"),
    "ToR over-subscribed": (lambda d: (setin(("fabric", "topology"), str(ROOT / "examples" / "bgwc-testbed.json"))(d),
                                       d.__setitem__("tenants", {"t": {"vms": {
                                           f"v{i}": {"host": f"s{i}", "guarantee_mbps": 30} for i in range(1, 9)}}})),
                            "admission: ToR sl uplinks", "exceed mu 0.9 x 100 = 90"),
    "routing app": (setin(("controller", "routing"), "ospf"), "controller.routing", "'lessor'"),
    "epsilon range": (setin(("lessor", "epsilon"), 0.7), "lessor.epsilon", "less than 0.5"),
    "polling order": (setin(("lessor", "polling", "initial_s"), 0.1), "lessor.polling", "min_s"),
    "OpenFlow port": (setin(("controller", "openflow", "port"), 70000), "controller.openflow.port", "65535"),
    "OpenFlow address": (setin(("controller", "openflow", "listen"), "localhost:6653"),
                         "controller.openflow.listen", "IP"),
    "agent address template": (setin(("agents", "address_template"), "unix:/run/x.sock"),
                               "agents.address_template", "{host}"),
    "agent address": (setin(("agents", "hosts"), {"h1": {"address": "tcp::7000"}}), "agents.hosts.h1.address",
                      "name the address"),
    "agent on a host without a VM": (setin(("agents", "hosts"), {"h4": {"address": "unix:/x/h4.sock"}}),
                                     "agents.hosts.h4", "no VM runs on h4"),
    "explicit policy without levels": (setin(("tenants", "batch", "policy"), "explicit"), "tenants.batch",
                                       "competition"),
    "too many WC subflows": (setin(("tenants", "web", "wc_subflows"), 9), "tenants.web.wc_subflows", "8"),
    "unknown MPTCP congestion control": (setin(("tenants", "web", "mptcp_cc"), "olia"), "tenants.web.mptcp_cc",
                                         "lia_vm"),
    "tuning key": (setin(("agents", "defaults", "colour"), "red"), "agents.defaults.colour", "unknown key"),
    "tuning range": (setin(("agents", "defaults", "beta"), 0), "agents.defaults.beta", "greater than 0"),
    "mu": (setin(("admission", "mu"), 1.5), "admission.mu", "less than or equal to 1"),
    "API listener": (setin(("api", "listen"), "8080"), "api.listen", "ADDR:PORT"),
    "tenant name": (lambda d: d["tenants"].__setitem__("a b", {"vms": {}}), "tenants.a b", "letters, digits"),
    "version": (setin(("version",), 2), "version", "must be 1"),
    "topology file": (setin(("fabric", "topology"), "/nonexistent/t.json"), "fabric.topology", "cannot read"),
    "inline topology": (setin(("fabric", "topology"), {"name": "x", "switches": [], "hosts": [], "links": []}),
                        "fabric.topology", "at least one switch"),
    "no fabric": (delin(("fabric",)), "fabric", "required"),
    "state file without LESSOR": (lambda d: (setin(("controller", "routing"), "ecmp")(d),
                                             setin(("controller", "state_file"), "/tmp/s.json")(d)),
                                  "controller.state_file", "only LESSOR"),
}


def test_the_examples_pass():
    assert EXAMPLES
    for path in EXAMPLES:
        loaded = config.load(path)
        assert loaded.vms()


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_broken_config_is_refused_by_name(name):
    fn, where, phrase = BROKEN[name]
    problems = problems_of(mutate(fn))
    assert any(p.startswith(where) and phrase in p for p in problems), problems


def test_every_problem_is_reported_at_once():
    data = mutate(lambda d: (setin(VM + ("guarantee_mbps",), -1)(d), setin(("lessor", "epsilon"), 2)(d),
                             setin(("bogus",), 1)(d)))
    paths = sorted(p.split(":")[0] for p in problems_of(data))
    assert paths == ["bogus", "lessor.epsilon", "tenants.analytics.vms.a3.guarantee_mbps"]


@pytest.mark.parametrize("text,phrase", [
    (b"\xff\xfeversion: 1", "not UTF-8"),
    (b"a: &x 1\nb: *x\n", "anchors and aliases"),
    (b"version: 1\nversion: 1\n", "duplicate key 'version'"),
    (b"version: 1\nadmission: {mu: 0.9}\nversion: 2\n", "duplicate key 'version'"),      # not adjacent
    (b"version: " + b"9" * 5000 + b"\n", "digits"),                                       # int() refuses it
    (b"- 1\n- 2\n", "must be a mapping"),
    (b"version: [1\n", "line 2 column 1"),
    (b"x" * (config.MAX_CONFIG_BYTES + 1), "more than"),
])
def test_a_file_that_is_not_a_config_is_refused(tmp_path, text, phrase):
    path = tmp_path / "c.yaml"
    path.write_bytes(text)
    with pytest.raises(config.ConfigError) as exc:
        config.load(path)
    assert any(phrase in p for p in exc.value.problems), exc.value.problems


def test_check_config_command(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(mutate(setin(VM + ("guarantee_mbps",), 0))))
    run = subprocess.run([sys.executable, "-m", "bwfabric.cli", "check-config", str(EXAMPLES[0]), str(bad)],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 1
    assert f"ok: {EXAMPLES[0]}" in run.stdout
    assert f"{bad}: tenants.analytics.vms.a3.guarantee_mbps: must be greater than or equal to 0.001" in run.stderr


def test_the_api_overlay_adds_replaces_and_deletes_tenants(tmp_path):
    over = {"tenants": {"web": None, "new": {"vms": {"n1": {"host": "h4", "guarantee_mbps": 3}}},
                        "batch": {"vms": {"b1": {"host": "h3", "guarantee_mbps": 2}}}}}
    loaded = config.from_data(copy.deepcopy(BASE), overlay=over)
    assert sorted(loaded.cfg.tenants) == ["analytics", "batch", "new"]
    assert loaded.host_vms()["h3"][0].vm.guarantee_mbps == 2 and "h7" not in loaded.host_vms()
    assert loaded.digest != config.from_data(copy.deepcopy(BASE)).digest


def test_host_configs_come_from_the_tenants():
    loaded = config.from_data(mutate(setin(("agents", "hosts"), {"h5": {"address": "unix:/x/h5.sock",
                                                                        "tuning": {"beta": 7}}})))
    cfgs = tenancy.host_configs(loaded)
    assert sorted(cfgs) == sorted(loaded.host_vms())
    h5, h3 = cfgs["h5"]["h5"], cfgs["h3"]["h3"]
    assert (h5.guarantee_mbps, h5.beta, h5.address, h5.nic_mbps) == (4, 7, "10.0.0.5", 10.0)
    assert (h3.policy, h3.guarantee_mbps, h3.beta, h3.unit_mbps) == ("equal", 1, 3, 0.75)
    assert tenancy.meter_rates(loaded)["h5"] == pytest.approx(4 * 1.05)
    assert tenancy.agent_endpoints(loaded)["h5"].address == "unix:/x/h5.sock"
    assert tenancy.agent_endpoints(loaded)["h1"].address == "unix:/run/bwfabric/agents/h1.sock"


def test_the_reference_in_docs_is_the_schema():
    assert (ROOT / "docs" / "config.md").read_text() == config.reference_markdown() + "\n", \
        "docs/config.md is stale: bwfabric config-reference > docs/config.md"


def test_every_key_of_the_reference_says_what_it_means():
    rows = [line for line in config.reference_markdown().splitlines() if line.startswith("| `")]
    meanings = [row.rstrip(" |").rsplit(" | ", 1)[1] for row in rows]
    assert len(rows) > 50 and all(m and m != "None" for m in meanings), [r for r, m in zip(rows, meanings)
                                                                        if not m or m == "None"]
    headers = [line for line in config.reference_markdown().splitlines() if line.startswith("## ")]
    assert headers[0] == "## `(top level)`" and "## `controller`" in headers
    assert not any(h.endswith(".`") for h in headers)


def test_a_topology_file_alone_runs_ecmp_without_priority_queues(tmp_path):
    from mininet_topos.builders import fattree
    fattree(4).save(tmp_path / "t.json")
    loaded = config.for_topology(tmp_path / "t.json")
    assert (loaded.cfg.controller.routing, loaded.cfg.controller.prio_queues) == ("ecmp", False)


_leaf = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12),
                  st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
_value = st.recursive(_leaf, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                     st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=8)
_PATHS = [("version",), ("controller", "routing"), ("controller", "openflow"), ("lessor",), ("lessor", "polling"),
          ("prio_queues",), ("agents",), ("agents", "defaults"), ("tenants",), ("tenants", "web"),
          ("tenants", "web", "vms", "w1"), VM + ("guarantee_mbps",), VM + ("weight",), ("admission", "mu"),
          ("api",), ("fabric", "topology")]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(_PATHS), _value)
def test_any_value_anywhere_is_accepted_whole_or_refused_by_name(path, value):
    """Property: the loader never raises anything but ConfigError, and an
    accepted config holds only finite numbers where numbers go."""
    data = mutate(setin(path, value))
    try:
        loaded = config.from_data(data)
    except config.ConfigError as exc:
        assert exc.problems and all(isinstance(p, str) and p for p in exc.problems)
        return
    dumped = json.dumps(loaded.cfg.model_dump(mode="json"), allow_nan=False)   # raises on NaN/Infinity
    assert dumped


_TUNING_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-10, 70000),
                           st.floats(allow_nan=True, allow_infinity=True), st.floats(-10, 1e6),
                           st.sampled_from([0, 1, 4, 100, 1000, 1023, 1024, 10_000, 65000, 65001, 65536, 0.5, 1e-9]))


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(sorted(config.AgentTuning.model_fields)), _TUNING_VALUES)
def test_the_controllers_tuning_schema_and_the_agents_checks_agree(name, value):
    """The controller refuses a tuning value exactly when the agent would:
    the two boundaries cannot drift apart unnoticed."""
    from hostagent.plan import HostConfig, PlanError
    try:
        config.AgentTuning(**{name: value})
        controller_ok = True
    except Exception:      # noqa: BLE001 - pydantic's ValidationError
        controller_ok = False
    try:
        HostConfig.from_dict(dict(host="h1", interface="h1-eth0", address="10.0.0.1", nic_mbps=100,
                                  guarantee_mbps=1, **{name: value}))
        agent_ok = True
    except PlanError:
        agent_ok = False
    assert controller_ok == agent_ok, (name, value, controller_ok, agent_ok)


def test_a_tenants_mptcp_congestion_control_reaches_its_agents():
    loaded = config.from_data(mutate(setin(("tenants", "web", "mptcp_cc"), "mptcp_d")))
    cfgs = tenancy.host_configs(loaded)
    web = set(loaded.cfg.tenants["web"].vms.values())
    kinds = {h: c[h].mptcp_cc for h, c in cfgs.items()}
    assert {kinds[vm.host] for vm in web} == {"mptcp_d"}
    assert set(kinds.values()) == {"mptcp_d", "bgwc"}          # the other tenants keep BG/WC


# ---- several VMs on one host (issue #32 §4) ------------------------------------------------------
def with_prefixes(data, **prefixes):
    """The topology inline, hosts given VM blocks (host=CIDR)."""
    topo = json.loads((ROOT / "examples" / "fattree4.json").read_text())
    for h in topo["hosts"]:
        if h["name"] in prefixes:
            h["vm_prefix"] = prefixes[h["name"]]
    data["fabric"]["topology"] = topo


def two_on_h9(data, prefix="10.1.9.0/28", **b_over):
    """a3 and a new web VM w9 on h9, each in a namespace of its own."""
    with_prefixes(data, h9=prefix)
    data["tenants"]["analytics"]["vms"]["a3"].update(netns="vm-a3", address="10.1.9.1")
    data["tenants"]["web"]["vms"]["w9"] = {"host": "h9", "guarantee_mbps": 2, "netns": "vm-w9",
                                           "address": "10.1.9.2", **b_over}


def test_several_vms_on_one_host_each_get_their_own_agent_configuration():
    loaded = config.from_data(mutate(two_on_h9))
    assert [p.id for p in loaded.host_vms()["h9"]] == ["analytics/a3", "web/w9"]
    assert loaded.guarantees()["h9"] == 6                                    # the NIC cut sums its VMs
    cfgs = tenancy.host_configs(loaded)["h9"]
    assert set(cfgs) == {"analytics/a3", "web/w9"}
    a3, w9 = cfgs["analytics/a3"], cfgs["web/w9"]
    assert (a3.netns, a3.address, a3.interface, a3.vm_name, a3.nic_mbps) == ("vm-a3", "10.1.9.1", "eth0",
                                                                             "analytics/a3", 10.0)
    assert (w9.netns, w9.address, w9.guarantee_mbps) == ("vm-w9", "10.1.9.2", 2)
    wire = tenancy.wire(cfgs)
    assert set(wire) == {"vms"} and set(wire["vms"]) == {"analytics/a3", "web/w9"}
    assert "vms" not in tenancy.wire(tenancy.host_configs(loaded)["h1"])   # a host that is its own VM: flat
    assert tenancy.meter_rates(loaded)["h9"] == pytest.approx(6 * 1.05)   # the host port carries both
    from apps.lrc.logic import vms_by_ip
    assert {"10.1.9.1", "10.1.9.2"} <= set(vms_by_ip(loaded))


def test_several_vms_on_one_host_are_admitted_against_its_nic_together():
    problems = problems_of(mutate(lambda d: two_on_h9(d, guarantee_mbps=6)))   # 4 + 6 > 0.9 x 10
    assert any(p.startswith("admission: host h9 NIC") for p in problems), problems


@pytest.mark.parametrize("over, where, phrase", [
    ({"netns": "vm-a3"}, "tenants.web.vms.w9.netns", "already carries tenants.analytics.vms.a3 in namespace vm-a3"),
    ({"address": None}, "tenants.web.vms.w9.address", "required with netns"),
    ({"address": "10.1.9.1"}, "tenants.web.vms.w9.address", "is also tenants.analytics.vms.a3's"),
    ({"address": "10.0.0.2"}, "tenants.web.vms.w9.address", "is host h2's address"),
    ({"address": "224.0.0.1"}, "tenants.web.vms.w9.address", "multicast"),
    ({"netns": None, "address": None, "host": "h1"}, "tenants.web.vms.w9.netns", "own namespace"),
    ({"netns": None, "address": "10.1.9.2", "host": "h4"}, "tenants.web.vms.w9.address", "has the host's address"),
    ({"netns": None, "address": None, "host": "h4", "interface": "eth1"}, "tenants.web.vms.w9.interface",
     "only with netns"),
    ({"netns": "a b"}, "tenants.web.vms.w9.netns", "should match pattern"),
    ({"netns": None, "address": None}, "tenants.web.vms.w9.netns", "one in its own namespace: give each a netns"),
    ({"address": "not-an-ip"}, "tenants.web.vms.w9.address", ""),
    ({"address": "10.1.8.2"}, "tenants.web.vms.w9.address", "not in host h9's vm_prefix 10.1.9.0/28"),
    ({"prefix": None}, "tenants.analytics.vms.a3.netns", "host h9 has no vm_prefix"),
    ({"prefix": "10.1.9.0/33"}, "fabric.topology: hosts[8] (h9): vm_prefix", "not an IPv4 network"),
    ({"prefix": "10.1.9.1/28"}, "fabric.topology: hosts[8] (h9): vm_prefix", "not an IPv4 network"),
    ({"prefix": "10.0.0.0/24"}, "fabric.topology: hosts[8] (h9): vm_prefix", "holds host h1's address"),
])
def test_a_vm_of_a_shared_host_is_refused_by_name(over, where, phrase):
    """(each names its path; the topology's own problems too)"""
    problems = problems_of(mutate(lambda d: two_on_h9(d, **over)))
    assert any(p.startswith(where) and phrase in p for p in problems), problems


def test_vm_blocks_of_two_hosts_may_not_overlap_and_the_fabric_finds_each_address_s_host():
    problems = problems_of(mutate(lambda d: with_prefixes(d, h9="10.1.9.0/28", h10="10.1.9.0/24")))
    assert any("hosts[9] (h10): vm_prefix 10.1.9.0/24 overlaps h9's 10.1.9.0/28" in p for p in problems), problems
    loaded = config.from_data(mutate(two_on_h9))
    topo = loaded.topology
    assert [topo.host_of_address(a) for a in ("10.1.9.2", "10.0.0.9", "10.1.9.99", "x")] == ["h9", "h9", None, None]
    assert "vm_prefix" not in json.dumps(config.from_data(copy.deepcopy(BASE)).topology.to_dict())  # unchanged


def test_a_validator_the_reference_cannot_name_stops_it():
    """Every field validator the schema uses has its words in the reference;
    one without them fails the reference build by name (not "(checked)")."""
    from pydantic import AfterValidator

    from bwcommon.validate import _ip

    def _odd(v):
        return v
    assert config._constraint(AfterValidator(_ip)) == "(an IP address)"
    with pytest.raises(ValueError, match="say what validator _odd checks"):
        config._constraint(AfterValidator(_odd))
    assert config._constraint("gt=0") == "gt=0"


def test_schema_errors_read_as_the_reference_words_them():
    """Every pydantic error an operator can cause, as one line: the path
    (union and validator steps left out) and the problem in our words."""
    from pydantic import ValidationError

    def problems(model, data, prefix=""):
        with pytest.raises(ValidationError) as exc:
            model.model_validate(data)
        return config.schema_errors(exc.value, prefix)
    vm = {"host": "h1", "guarantee_mbps": 1}
    assert problems(config.Vm, {**vm, "colour": 2}, "tenants.t.vms.v") == ["tenants.t.vms.v.colour: unknown key"]
    assert problems(config.Vm, {"guarantee_mbps": 1}) == ["host: required"]
    assert problems(config.Vm, {**vm, "guarantee_mbps": float("nan")}) == [
        "guarantee_mbps: must be a finite number (NaN and Infinity are refused)"]
    assert problems(config.Vm, {**vm, "guarantee_mbps": "x"}) == ["guarantee_mbps: must be a valid number"]
    assert problems(config.Vm, {**vm, "address": "1.2.3"}) == [
        "address: '1.2.3' does not appear to be an IPv4 or IPv6 address"]
    assert problems(config.Tenant, {"vms": {"bad name!": vm}}, "tenants.t") == [
        "tenants.t.vms.bad name!: names are 1-32 letters, digits, '_', '.' or '-', starting with a letter or digit"]
    assert problems(config.Tenant, {"policy": "nope", "vms": {}}) == ["policy: must be 'guarantee', 'equal' or 'explicit'"]
    assert problems(config.Vm, [1]) == ["(top level): must be a valid dictionary or instance of Vm"]


def test_error_paths_and_messages_drop_pydantics_internals():
    assert config._loc(("vms", "function-after[_ip()]", "literal['a']", "[key]", "a1", 0)) == "vms.a1.0"
    assert config._loc(("functional", "literally", "key")) == "functional.literally.key"
    msg = lambda kind, text, **ctx: config._message({"type": kind, "msg": text, "ctx": ctx})    # noqa: E731
    assert msg("value_error", "Value error, Guarantee too big") == "guarantee too big"
    assert msg("assertion_error", "Assertion failed, Out of range") == "out of range"
    assert msg("value_error", "A Value error, inside") == "a Value error, inside"      # only a prefix goes
    assert msg("x", "Input should be greater than 0") == "must be greater than 0"
    assert msg("x", "") == ""
    assert msg("string_pattern_mismatch", "String should match pattern 'x'", pattern="x") == \
        "string should match pattern 'x'"


def test_a_config_error_lists_every_problem_on_its_own_line():
    exc = config.ConfigError(["a: required", "b: unknown key"])
    assert str(exc) == "invalid configuration:\n  a: required\n  b: unknown key" and exc.problems == [
        "a: required", "b: unknown key"]


def test_private_files_are_written_whole_sorted_into_new_directories(tmp_path):
    path = tmp_path / "new" / "deeper" / "state.yaml"
    config.write_private(path, "# header\n", {"b": 1, "a": {"d": 2, "c": 3}})
    assert path.read_text() == "# header\na:\n  c: 3\n  d: 2\nb: 1\n"
    assert path.stat().st_mode & 0o777 == 0o600 and sorted(p.name for p in path.parent.iterdir()) == ["state.yaml"]


def test_a_side_file_lists_every_reason(tmp_path):
    state = tmp_path / "state.yaml"
    state.write_text("tenants: {}\n")
    loaded = config.Loaded.__new__(config.Loaded)
    loaded.set_aside = config.SetAside(state, {"t": {"vms": {}}}, ["first reason", "second reason"])
    loaded.overlay = {}
    side = config.set_aside(loaded, now=86400.0)
    assert side.name == "state.yaml.rejected-19700102T000000Z"
    assert side.read_text().startswith("# set aside by the controller at start; why:\n#   first reason\n"
                                       "#   second reason\ntenants:\n")
