"""The REST API: authentication, every refusal leaving everything as it
was (the configuration in force, the persisted state, the switches' rules,
what the listeners were told), persistence across a restart, reload."""

import json
import math
import os
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from werkzeug.test import Client

from apps.prio_queues.logic import PrioQueuesLogic
from controller import config, runtime, tenancy
from controller.api import Api
from bwtesting.fakenet import FakeNetwork
from controller.network_view import NetworkView

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "s3cret-token-for-tests-0123456789"


class Controller:
    """A runtime with the API in front and, behind it, the ToR meters on a
    fake fabric (what the prio_queues app does on a change)."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.rt = runtime.start(config.load(workdir / "bwfabric.yaml"))
        self.api = Api(self.rt, token=TOKEN)
        self.client = Client(self.api)
        self.net = FakeNetwork(NetworkView(self.rt.loaded.topology))
        self.meters = PrioQueuesLogic(self.net.view, tenancy.meter_rates(self.rt.loaded))
        for sw in self.net.view.switches:
            self.net.apply(sw, self.meters.switch_connected(sw))
        self.calls = []
        self.rt.subscribe("meters", self._changed)

    def _changed(self, old, new):
        self.calls.append(new.digest)
        for sw, msgs in self.meters.update(tenancy.meter_rates(new)).items():
            self.net.apply(sw, msgs)

    def snapshot(self):
        """Everything a refused change must leave as it was."""
        state = self.workdir / "api-state.yaml"
        return (self.rt.loaded.digest, self.rt.version, state.read_bytes() if state.exists() else None,
                self.net.tables_snapshot(), list(self.calls))

    def req(self, method, path, body=None, token=TOKEN, raw=None):
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        data = raw if raw is not None else (None if body is None else json.dumps(body))
        resp = self.client.open(path, method=method, headers=headers, data=data,
                                content_type="application/json")
        return resp.status_code, json.loads(resp.data) if resp.data and path != "/metrics" else resp.data


@pytest.fixture
def ctl(tmp_path):
    data = yaml.safe_load((ROOT / "examples" / "fattree4.yaml").read_text())
    data["fabric"]["topology"] = str(ROOT / "examples" / "fattree4.json")
    data["api"] = {"listen": "127.0.0.1:0", "token_file": "api.token", "state_file": "api-state.yaml"}
    (tmp_path / "bwfabric.yaml").write_text(yaml.safe_dump(data))
    (tmp_path / "api.token").write_text(TOKEN)
    os.chmod(tmp_path / "api.token", 0o600)
    c = Controller(tmp_path)
    yield c
    runtime.stop()


def test_no_token_or_a_wrong_one_is_401_and_nothing_happens(ctl):
    before = ctl.snapshot()
    for token in (None, "wrong", TOKEN + "x", ""):
        assert ctl.req("PUT", "/v1/tenants/new", {"vms": {"n": {"host": "h4", "guarantee_mbps": 1}}},
                       token=token)[0] == 401
        assert ctl.req("GET", "/v1/tenants", token=token)[0] == 401
        assert ctl.req("POST", "/v1/reload", token=token)[0] == 401
    assert ctl.snapshot() == before


def test_an_accepted_change_is_persisted_applied_and_survives_a_restart(ctl):
    code, body = ctl.req("PUT", "/v1/tenants/new", {"vms": {"n1": {"host": "h4", "guarantee_mbps": 3}}})
    assert code == 200 and body["changed"] and body["version"] == 2
    state = ctl.workdir / "api-state.yaml"
    assert state.stat().st_mode & 0o777 == 0o600
    port = ctl.net.view.host_switch("h4")[1]
    assert ctl.net.switches["e0_1"].meters[port].rate_kbps == int(3 * 1.05 * 1000)   # the meter followed
    code, body = ctl.req("PUT", "/v1/tenants/analytics/vms/a1", {"host": "h1", "guarantee_mbps": 5})
    assert code == 200
    assert ctl.req("DELETE", "/v1/tenants/web")[0] == 200
    # a restarted controller reads the operator's file with the API's state over it
    again = config.load(ctl.workdir / "bwfabric.yaml")
    assert again.digest == ctl.rt.loaded.digest
    assert "web" not in again.cfg.tenants and again.cfg.tenants["analytics"].vms["a1"].guarantee_mbps == 5
    assert yaml.safe_load((ctl.workdir / "bwfabric.yaml").read_text())["tenants"]["web"]   # never rewritten


@pytest.mark.parametrize("method,path,body,code,phrase", [
    ("PUT", "/v1/tenants/x", {"vms": {"v": {"host": "h4", "guarantee_mbps": -1}}}, 422, "guarantee_mbps"),
    ("PUT", "/v1/tenants/x", {"vms": {"v": {"host": "h99", "guarantee_mbps": 1}}}, 422, "not a host"),
    ("PUT", "/v1/tenants/x", {"vms": {"v": {"host": "h1", "guarantee_mbps": 1}}}, 422, "already carries"),
    ("PUT", "/v1/tenants/x", {"vms": {"v": {"host": "h4", "guarantee_mbps": 1}}, "colour": 1}, 422, "colour"),
    ("PUT", "/v1/tenants/x", [1, 2], 422, "tenants.x"),
    ("PUT", "/v1/tenants/x", [1, 2], 422, '"error": "invalid tenant"'),
    ("PUT", "/v1/tenants/x", {"vms": {"v": {"host": "h4", "guarantee_mbps": 9.5}}}, 409, "host h4 NIC"),
    ("PUT", "/v1/tenants/analytics/vms/a1", {"host": "h1", "guarantee_mbps": 9.1}, 409, "exceed mu 0.9"),
    ("PUT", "/v1/tenants/nobody/vms/v", {"host": "h4", "guarantee_mbps": 1}, 404, "no tenant"),
    ("DELETE", "/v1/tenants/nobody", None, 404, "no tenant"),
    ("DELETE", "/v1/tenants/web/vms/nope", None, 404, "no VM"),
    ("PUT", "/v1/tenants/bad name", {"vms": {}}, 422, "names are"),
    ("POST", "/v1/tenants", None, 405, "not allowed"),
])
def test_a_refused_change_says_why_and_changes_nothing(ctl, method, path, body, code, phrase):
    before = ctl.snapshot()
    got, reply = ctl.req(method, path, body)
    assert got == code, reply
    assert phrase in json.dumps(reply), reply
    assert ctl.snapshot() == before


@pytest.mark.parametrize("raw,phrase", [(b'{"host": "h4", "guarantee_mbps": NaN}', "non-finite"),
                                        (b'{"host": "h4", "guarantee_mbps": Infinity}', "non-finite"),
                                        (b"\xff\xfe", "UTF-8"), (b"{" * 100, "nested"), (b"", "")])
def test_a_body_that_is_not_json_is_422(ctl, raw, phrase):
    before = ctl.snapshot()
    code, reply = ctl.req("PUT", "/v1/tenants/web/vms/w1", raw=raw)
    assert code == 422 and phrase in json.dumps(reply)
    assert ctl.snapshot() == before


_scalar = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True,
                                                                                     allow_infinity=True),
                    st.text(max_size=6), st.sampled_from(["h4", "h1", "h16", "h99"]))
_vm = st.fixed_dictionaries({}, optional={"host": _scalar, "guarantee_mbps": _scalar, "weight": _scalar,
                                          "competition": _scalar, "extra": _scalar})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_vm)
def test_any_vm_body_is_applied_whole_or_refused_with_nothing_changed(ctl, body):
    before = ctl.snapshot()
    raw = json.dumps(body, allow_nan=True).encode()
    code, reply = ctl.req("PUT", "/v1/tenants/web/vms/w9", raw=raw)
    if code == 200:
        vm = ctl.rt.loaded.cfg.tenants["web"].vms["w9"]
        assert math.isfinite(vm.guarantee_mbps) and vm.guarantee_mbps > 0
        assert ctl.calls[-1] == ctl.rt.loaded.digest
        ctl.req("DELETE", "/v1/tenants/web/vms/w9")
    else:
        assert code in (409, 422), reply
        assert reply["problems"] and ctl.snapshot() == before


def test_reload_bad_file_changes_nothing_good_file_changes_the_difference(ctl):
    path = ctl.workdir / "bwfabric.yaml"
    good = path.read_text()
    before = ctl.snapshot()
    path.write_text(good.replace("guarantee_mbps: 4", "guarantee_mbps: -4", 1))
    code, reply = ctl.req("POST", "/v1/reload")
    assert code == 422 and "must be greater than or equal to 0.001" in json.dumps(reply)
    assert ctl.snapshot() == before and ctl.rt.load_errors == 1
    path.write_text(good.replace("routing: lessor", "routing: ecmp"))
    code, reply = ctl.req("POST", "/v1/reload")
    assert code == 422 and "controller.routing: takes effect at start only" in json.dumps(reply)
    assert ctl.snapshot() == before
    tables = ctl.net.tables_snapshot()
    data = yaml.safe_load(good)
    data["tenants"]["web"]["vms"]["w2"]["guarantee_mbps"] = 3
    path.write_text(yaml.safe_dump(data))
    code, reply = ctl.req("POST", "/v1/reload")
    assert code == 200 and reply["changed"]
    after = ctl.net.tables_snapshot()
    changed = {sw for sw in after if after[sw] != tables[sw]}
    assert changed == {ctl.net.view.host_switch("h6")[0]}       # w2 is on h6: only its ToR's meter moved
    assert ctl.rt.last_error_current is False


def test_reads_and_metrics(ctl):
    code, status = ctl.req("GET", "/v1/status")
    assert code == 200 and status["digest"] == ctl.rt.loaded.digest and status["vms"] == 12
    code, fabric = ctl.req("GET", "/v1/fabric")
    assert len(fabric["links"]) == 48 and fabric["admission"]["mu"] == 0.9
    assert ctl.req("GET", "/v1/tenants/web/vms/w1")[1] == {"host": "h2", "guarantee_mbps": 2.0, "weight": 1.0,
                                                           "competition": None, "netns": None,
                                                           "address": None, "interface": None}
    code, text = ctl.req("GET", "/metrics", token=None)
    assert code == 200
    from controller import metrics
    metrics.register("runtime", lambda: runtime.samples(ctl.rt))
    text = ctl.client.get("/metrics").data.decode()
    assert f'bwfabric_config_hash_info{{file="{ctl.workdir / "bwfabric.yaml"}",hash="{ctl.rt.loaded.digest}"}} 1.0' \
        in text
    assert 'bwfabric_tenant_guarantee_bytes_per_second{host="h1",tenant="analytics",vm="a1"} 500000.0' in text
    assert "bwfabric_config_load_errors_total 0.0" in text


def test_every_metric_a_provider_yields_is_declared():
    from controller import metrics
    names = set(metrics.CATALOGUE)
    rt = runtime.start(config.load(ROOT / "examples" / "fattree4.yaml"))
    try:
        assert {n for n, _, _ in runtime.samples(rt)} <= names
    finally:
        runtime.stop()
    for name, (kind, labels, help_) in metrics.CATALOGUE.items():
        assert name.startswith("bwfabric_") and not name.endswith("_total") and help_
        assert "bits" not in name and "mbps" not in name                    # base units
        assert not {"flow", "src_port", "dst_port"} & set(labels)            # never per flow


def test_the_metrics_reference_in_docs_is_the_catalogue():
    from controller import metrics
    assert (ROOT / "docs" / "metrics.md").read_text() == metrics.reference_markdown() + "\n", \
        "docs/metrics.md is stale: bwfabric config-reference --metrics > docs/metrics.md"


def test_bwfabric_status_and_tenants_are_thin_clients_of_a_live_api(tmp_path):
    """The CLI against a real HTTP server (Werkzeug, in this process)."""
    import socket
    import subprocess
    import sys

    from controller.api import Server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = yaml.safe_load((ROOT / "examples" / "fattree4.yaml").read_text())
    data["fabric"]["topology"] = str(ROOT / "examples" / "fattree4.json")
    data["api"] = {"listen": f"127.0.0.1:{port}", "token_file": "api.token", "state_file": "api-state.yaml"}
    conf = tmp_path / "bwfabric.yaml"
    conf.write_text(yaml.safe_dump(data))
    (tmp_path / "api.token").write_text(TOKEN)
    os.chmod(tmp_path / "api.token", 0o600)
    rt = runtime.start(config.load(conf))
    server = Server(Api(rt, token=TOKEN), "127.0.0.1", port).start()
    try:
        def cli(*args):
            return subprocess.run([sys.executable, "-m", "bwfabric.cli", *args, "--config", str(conf)],
                                  capture_output=True, text=True, cwd=ROOT, timeout=60)
        out = cli("status")
        assert out.returncode == 0, out.stderr
        assert f"configuration {rt.loaded.digest} version 1" in out.stdout
        assert re.search(r"^analytics\s+a1\s+h1\s+\(host's\)\s+4\.0", out.stdout, re.M)
        (tmp_path / "t.yaml").write_text("vms:\n  n1: {host: h4, guarantee_mbps: 9.5}\n")
        out = cli("tenants", "put", "new", "--file", str(tmp_path / "t.yaml"))
        assert out.returncode == 1 and "409" in out.stderr and "host h4 NIC" in out.stderr
        (tmp_path / "t.yaml").write_text("vms:\n  n1: {host: h4, guarantee_mbps: 2}\n")
        assert cli("tenants", "put", "new", "--file", str(tmp_path / "t.yaml")).returncode == 0
        listing = cli("tenants", "list").stdout
        assert re.search(r"^new\s+1\s+2\.0", listing, re.M) and rt.version == 2
    finally:
        server.stop()
        runtime.stop()


class _Sessions:
    """The agents' states as the sessions report them (the API only counts them)."""

    def __init__(self, states):
        self._states = states

    def states(self):
        return self._states


def test_the_read_endpoints_answer_with_their_whole_documented_shape(ctl, monkeypatch):
    """/v1/status, /v1/fabric, /v1/flows, /v1/lrc and /v1/agents, field by
    field: what clients, `bwfabric status` and dashboards read."""
    from controller import admission, api as api_mod
    monkeypatch.setattr(api_mod, "PROVIDERS", {})        # what other tests' apps registered is not this API's
    loaded = ctl.rt.loaded
    code, status = ctl.req("GET", "/v1/status")
    assert code == 200 and status == {
        "digest": loaded.digest, "version": ctl.rt.version, "generation": ctl.rt.generation,
        "role": "single", "leader": None,
        "file": str(ctl.workdir / "bwfabric.yaml"), "load_errors": 0, "last_error": None,
        "overlay_set_aside": None, "routing": loaded.cfg.controller.routing, "switches": 20, "hosts": 16,
        "tenants": 3, "vms": 12, "agents": {"declared": 0, "connected": 0, "in_force": 0}}
    agents = [{"host": "h1", "connected": True, "in_force": 3}, {"host": "h2", "connected": False, "in_force": None},
              {"host": "h3", "connected": True, "in_force": 0}]
    ctl.api.sessions = _Sessions(agents)
    assert ctl.req("GET", "/v1/status")[1]["agents"] == {"declared": 3, "connected": 2, "in_force": 1}
    assert ctl.req("GET", "/v1/agents") == (200, {"agents": agents})

    monkeypatch.setitem(api_mod.PROVIDERS, "link_loads", lambda: {("e0_0", "a0_0"): 1_500_000.0})
    code, fabric = ctl.req("GET", "/v1/fabric")
    assert code == 200 and set(fabric) == {"switches", "hosts", "links", "admission"}
    sw = {s["name"]: s for s in fabric["switches"]}
    t = {s.name: s for s in loaded.topology.switches}["e0_0"]
    assert sw["e0_0"] == {"name": "e0_0", "dpid": t.dpid, "role": "edge", "pod": 0} and len(sw) == 20
    h1 = {h.name: h for h in loaded.topology.hosts}["h1"]
    assert {"name": "h1", "ip": h1.ip} in fabric["hosts"] and len(fabric["hosts"]) == 16
    link = next(lk for lk in fabric["links"] if {lk["a"], lk["b"]} == {"e0_0", "a0_0"})
    a, b = link["a"], link["b"]
    assert link == {"a": a, "b": b, "capacity_mbps": link["capacity_mbps"],
                    "load_mbps": {f"{a}>{b}": 1.5 if a == "e0_0" else None, f"{b}>{a}": 1.5 if b == "e0_0" else None}}
    assert fabric["admission"] == {"mu": 0.9, "cuts": admission.headroom(loaded.topology, loaded.guarantees(), 0.9)}

    assert ctl.req("GET", "/v1/flows") == (200, {"flows": []})
    assert ctl.req("GET", "/v1/lrc") == (200, {"lrc": None})
    monkeypatch.setitem(api_mod.PROVIDERS, "flows", lambda: [{"key": "f"}])
    monkeypatch.setitem(api_mod.PROVIDERS, "lrc", lambda: {"links": 1})
    assert ctl.req("GET", "/v1/flows") == (200, {"flows": [{"key": "f"}]})
    assert ctl.req("GET", "/v1/lrc") == (200, {"lrc": {"links": 1}})


def test_link_loads_are_mbps_to_the_bit():
    from controller.api import _mbps
    assert _mbps(None) is None and _mbps(0.0) == 0.0 and _mbps(1_234_567.0) == 1.234567 and _mbps(1.0) == 1e-06


def test_reading_a_missing_vm_is_404_by_name(ctl):
    assert ctl.req("GET", "/v1/tenants/web/vms/nope") == (404, {"error": "tenant web has no VM nope", "problems": []})


def test_every_accepted_change_is_logged_with_what_it_was(ctl, caplog):
    import logging
    with caplog.at_level(logging.INFO, logger="bwfabric.api"):
        assert ctl.req("PUT", "/v1/tenants/x", {"vms": {"v": {"host": "h4", "guarantee_mbps": 1}}})[0] == 200
        assert ctl.req("DELETE", "/v1/tenants/x")[0] == 200
    said = [r.getMessage() for r in caplog.records if r.name == "bwfabric.api"]
    assert any(m.startswith("API PUT tenant x accepted: configuration ") for m in said), said
    assert any(m.startswith("API DELETE tenant x accepted: configuration ") for m in said), said


def test_an_etag_is_a_quoted_20_digit_hash_that_follows_the_content(ctl):
    import re
    r1 = ctl.client.get("/v1/tenants/web", headers={"Authorization": f"Bearer {TOKEN}"})
    tag = r1.headers["ETag"]
    assert re.fullmatch(r'"[0-9a-f]{20}"', tag), tag
    assert ctl.req("PUT", "/v1/tenants/web/vms/w1", {"host": "h2", "guarantee_mbps": 1.5})[0] == 200
    r2 = ctl.client.get("/v1/tenants/web", headers={"Authorization": f"Bearer {TOKEN}"})
    assert re.fullmatch(r'"[0-9a-f]{20}"', r2.headers["ETag"]) and r2.headers["ETag"] != tag
    put = ctl.client.put("/v1/tenants/web/vms/w1", headers={"Authorization": f"Bearer {TOKEN}"},
                         data=json.dumps({"host": "h2", "guarantee_mbps": 1.5}), content_type="application/json")
    vm = ctl.client.get("/v1/tenants/web/vms/w1", headers={"Authorization": f"Bearer {TOKEN}"})
    assert put.headers["ETag"] == vm.headers["ETag"]               # a change answers with the new ETag
