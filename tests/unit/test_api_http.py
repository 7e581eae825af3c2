"""The API's HTTP contract, request by request through the real WSGI app:
which methods each route takes, every refusal's status and words, the
content types, conditional requests and what a bug answers."""

import json
import logging

import pytest

from controller import api as api_mod
from tests.unit.test_api import TOKEN, ctl  # noqa: F401 (the fixture)

AUTH = {"Authorization": f"Bearer {TOKEN}"}
ROUTES = {"/v1/status": {"GET"}, "/v1/fabric": {"GET"}, "/v1/flows": {"GET"}, "/v1/lrc": {"GET"},
          "/v1/agents": {"GET"}, "/v1/tenants": {"GET"}, "/v1/reload": {"POST"},
          "/v1/tenants/web": {"GET", "PUT", "DELETE"}, "/v1/tenants/web/vms/w1": {"GET", "PUT", "DELETE"},
          "/metrics": {"GET"}}


@pytest.fixture(autouse=True)
def _own_providers(monkeypatch):
    """This API's providers only (apps started by other tests register theirs process-wide)."""
    monkeypatch.setattr(api_mod, "PROVIDERS", {})


def _call(ctl, method, path, body=None, headers=None, raw=None):
    data = raw if raw is not None else (None if body is None else json.dumps(body))
    resp = ctl.client.open(path, method=method, headers={**AUTH, **(headers or {})}, data=data,
                           content_type="application/json")
    return resp


@pytest.mark.parametrize("path", sorted(ROUTES))
def test_each_route_takes_its_methods_and_refuses_the_others_by_name(ctl, path):
    for method in ("GET", "PUT", "DELETE", "POST", "PATCH"):
        if method in ROUTES[path]:
            continue
        resp = _call(ctl, method, path)
        assert resp.status_code == 405, (method, path)
        assert json.loads(resp.data) == {"error": f"{method} is not allowed on {path}", "problems": []}
        assert resp.mimetype == "application/json"
    if "GET" in ROUTES[path]:
        resp = _call(ctl, "GET", path)
        assert resp.status_code == 200, path
        assert resp.mimetype == ("text/plain" if path == "/metrics" else "application/json")


def test_paths_are_case_sensitive_and_unknown_ones_404_by_name(ctl):
    for path in ("/V1/FLOWS", "/v1/nothing", "/v1/tenants/web/vms"):
        resp = _call(ctl, "GET", path)
        assert resp.status_code == 404 and json.loads(resp.data) == {"error": f"no resource {path}", "problems": []}


def test_metrics_are_prometheus_text_without_a_token(ctl):
    resp = ctl.client.get("/metrics")
    assert resp.status_code == 200 and resp.headers["Content-Type"].startswith("text/plain; version=")


@pytest.mark.parametrize("header", [None, "Bearer wrong-token-0123456789", f"Basic {TOKEN}", f"bearer{TOKEN}"])
def test_a_missing_or_wrong_token_is_401_in_words(ctl, header):
    resp = ctl.client.get("/v1/status", headers={"Authorization": header} if header else {})
    assert resp.status_code == 401
    assert json.loads(resp.data) == {"error": "missing or wrong bearer token", "problems": []}
    ok = ctl.client.get("/v1/status", headers={"Authorization": f"BEARER  {TOKEN} "})   # scheme any case
    assert ok.status_code == 200


def test_bodies_over_the_limit_are_413_whether_announced_or_not(ctl):
    big = b"{" + b" " * api_mod.MAX_BODY + b"}"
    resp = _call(ctl, "PUT", "/v1/tenants/web/vms/w1", raw=big)
    assert resp.status_code == 413
    assert json.loads(resp.data)["error"] == f"body of {len(big)} bytes, at most {api_mod.MAX_BODY}"
    # chunked: no Content-Length, cut off as it arrives
    env = {"wsgi.input_terminated": True}
    resp = ctl.client.open("/v1/tenants/web/vms/w1", method="PUT", headers={**AUTH, "Transfer-Encoding": "chunked"},
                           input_stream=__import__("io").BytesIO(big), environ_overrides=env,
                           content_type="application/json")
    assert resp.status_code == 413 and json.loads(resp.data)["error"] == f"body over {api_mod.MAX_BODY} bytes"


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_of_exactly_the_limit_is_read(ctl, chunked):
    # MAX_BODY bytes of valid JSON (padded with spaces): not 413 -- it reaches validation (a VM it refuses)
    body = json.dumps({"host": "h99", "guarantee_mbps": 1}).encode()
    body = body + b" " * (api_mod.MAX_BODY - len(body))
    assert len(body) == api_mod.MAX_BODY
    if chunked:
        resp = ctl.client.open("/v1/tenants/web/vms/w1", method="PUT", headers={**AUTH, "Transfer-Encoding": "chunked"},
                               input_stream=__import__("io").BytesIO(body),
                               environ_overrides={"wsgi.input_terminated": True}, content_type="application/json")
    else:
        resp = _call(ctl, "PUT", "/v1/tenants/web/vms/w1", raw=body)
    assert resp.status_code == 422, resp.data


def test_a_body_that_is_not_json_says_so_and_why(ctl):
    resp = _call(ctl, "PUT", "/v1/tenants/web/vms/w1", raw=b"{nope")
    got = json.loads(resp.data)
    assert resp.status_code == 422 and got["error"] == "the body is not JSON bwfabric accepts"
    assert len(got["problems"]) == 1 and got["problems"][0].startswith("body")


def test_changes_the_configuration_refuses_are_409_or_422_in_words(ctl):
    resp = _call(ctl, "PUT", "/v1/tenants/x", {"vms": {"v": {"host": "h4", "guarantee_mbps": 9.5}}})
    assert resp.status_code == 409 and json.loads(resp.data)["error"] == "admission control refuses it"
    resp = _call(ctl, "PUT", "/v1/tenants/x", {"vms": {"v": {"host": "h99", "guarantee_mbps": 1}}})
    assert resp.status_code == 422 and json.loads(resp.data)["error"] == "invalid configuration"


def test_conditional_requests_hold_or_say_what_the_resource_is_now(ctl):
    tag = ctl.client.get("/v1/tenants/web/vms/w1", headers=AUTH).headers["ETag"]
    vm = {"host": "h2", "guarantee_mbps": 1.5}
    stale = '"00000000000000000000"'
    resp = _call(ctl, "PUT", "/v1/tenants/web/vms/w1", vm, {"If-Match": stale})
    assert resp.status_code == 412 and json.loads(resp.data)["error"] == \
        f"If-Match {stale} does not hold: the resource is now {tag}; read it again"
    resp = _call(ctl, "PUT", "/v1/tenants/web/vms/new1", vm, {"If-Match": "*"})
    assert resp.status_code == 412 and json.loads(resp.data)["error"] == \
        "If-Match * does not hold: the resource is now absent; read it again"
    resp = _call(ctl, "PUT", "/v1/tenants/web/vms/w1", vm, {"If-None-Match": "*"})
    assert resp.status_code == 412 and json.loads(resp.data)["error"] == \
        f"If-None-Match * does not hold: the resource exists ({tag})"
    resp = _call(ctl, "PUT", "/v1/tenants/web/vms/w1", vm, {"If-None-Match": stale})   # another tag: it holds
    assert resp.status_code == 200
    new = resp.headers["ETag"]
    assert _call(ctl, "PUT", "/v1/tenants/web/vms/w1", vm, {"If-Match": f"{stale}, {new}"}).status_code == 200


def test_a_bug_answers_500_naming_its_kind_and_is_logged(ctl, monkeypatch, caplog):
    def broken():
        raise RuntimeError("boom")
    monkeypatch.setitem(api_mod.PROVIDERS, "flows", broken)
    with caplog.at_level(logging.ERROR, logger="bwfabric.api"):
        resp = _call(ctl, "GET", "/v1/flows")
    assert resp.status_code == 500 and json.loads(resp.data) == {"error": "internal error: RuntimeError"}
    assert [r.getMessage() for r in caplog.records if r.name == "bwfabric.api"] == ["API GET /v1/flows failed"]
    assert ctl.api.requests.get("500") == 1 and _call(ctl, "GET", "/v1/status").status_code == 200
    before = ctl.api.requests.get("200", 0)
    for _ in range(3):
        _call(ctl, "GET", "/v1/status")
    assert ctl.api.requests["200"] == before + 3 and ctl.api.requests["500"] == 1     # counted per code, each


def test_the_runtime_hears_which_api_change_it_was(ctl, caplog):
    with caplog.at_level(logging.INFO, logger="bwfabric.runtime"):
        assert _call(ctl, "PUT", "/v1/tenants/x", {"vms": {"v": {"host": "h4", "guarantee_mbps": 1}}}).status_code == 200
        assert _call(ctl, "PUT", "/v1/tenants/x", {"vms": {"v": {"host": "h99", "guarantee_mbps": 1}}}).status_code \
            == 422
    said = [r.getMessage() for r in caplog.records if r.name == "bwfabric.runtime"]
    assert any(m.endswith("from API PUT tenant x)") for m in said), said
    assert any(m.startswith("API PUT tenant x refused, nothing changed:") for m in said), said


def test_serve_listens_where_the_configuration_says_and_answers_over_http(ctl, caplog, monkeypatch):
    """api.serve: the configured address (port 0 here: any free one), the
    token file's token, a real HTTP exchange through waitress, and its
    request counts in /metrics."""
    import urllib.request

    from controller import metrics
    monkeypatch.setattr(metrics.COLLECTOR, "providers", dict(metrics.COLLECTOR.providers))   # restored after
    with caplog.at_level(logging.INFO, logger="bwfabric.api"):
        srv = api_mod.serve(ctl.rt)
    try:
        assert srv.httpd.effective_host == "127.0.0.1" and srv.app.token == TOKEN and srv.app.rt is ctl.rt
        url = f"http://127.0.0.1:{srv.port}"
        req = urllib.request.Request(f"{url}/v1/status", headers=AUTH)
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200 and json.loads(resp.read())["digest"] == ctl.rt.loaded.digest
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
            assert 'bwfabric_api_requests_total{code="200"} 1.0' in resp.read().decode()
        assert "API and /metrics on http://127.0.0.1:0 (waitress)" in [r.getMessage() for r in caplog.records]
    finally:
        srv.stop()


def test_a_trailing_slash_is_the_same_resource(ctl):
    resp = _call(ctl, "GET", "/v1/status/")
    assert resp.status_code == 200 and json.loads(resp.data)["digest"] == ctl.rt.loaded.digest


def test_an_http_error_inside_a_handler_keeps_its_status_and_words(ctl, monkeypatch):
    from werkzeug.exceptions import HTTPException, ServiceUnavailable

    def busy():
        raise ServiceUnavailable("busy, try later")
    monkeypatch.setitem(api_mod.PROVIDERS, "flows", busy)
    resp = _call(ctl, "GET", "/v1/flows")
    assert resp.status_code == 503 and json.loads(resp.data) == {"error": "busy, try later"}

    class Odd(HTTPException):       # no code, no description: 500, named
        pass

    def odd():
        raise Odd()
    monkeypatch.setitem(api_mod.PROVIDERS, "flows", odd)
    resp = _call(ctl, "GET", "/v1/flows")
    assert resp.status_code == 500 and json.loads(resp.data) == {"error": "Unknown Error"}


def test_a_vm_body_the_schema_refuses_is_invalid_vm_with_its_path(ctl):
    resp = _call(ctl, "PUT", "/v1/tenants/web/vms/w1", {"host": "h2", "guarantee_mbps": "x"})
    got = json.loads(resp.data)
    assert resp.status_code == 422 and got["error"] == "invalid VM"
    assert got["problems"] == ["tenants.web.vms.w1.guarantee_mbps: must be a valid number"]


def test_a_refused_reload_says_so(ctl):
    (ctl.workdir / "bwfabric.yaml").write_text("version: 2\n")
    resp = _call(ctl, "POST", "/v1/reload")
    got = json.loads(resp.data)
    assert resp.status_code == 422 and got["error"] == "the configuration file is refused; nothing changed"
    assert got["problems"]


def test_every_change_that_cannot_be_persisted_is_counted(ctl, monkeypatch):
    def full(path, overlay):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(api_mod, "write_state", full)
    for _ in range(2):
        resp = _call(ctl, "PUT", "/v1/tenants/x", {"vms": {"v": {"host": "h4", "guarantee_mbps": 1}}})
        assert resp.status_code == 507
        assert json.loads(resp.data)["error"] == (f"the change could not be persisted to {ctl.api.state_file}: "
                                                  "No space left on device; nothing changed")
    assert ctl.api.persist_errors == 2


def test_serve_takes_an_ipv6_listen_address_its_sessions_and_registers_its_metrics(ctl, monkeypatch):
    """``[::1]:0``: the port after the last colon, the brackets off the
    host; the sessions handed over; the request counts registered under
    the name ``api``."""
    from controller import metrics
    monkeypatch.setattr(metrics.COLLECTOR, "providers", dict(metrics.COLLECTOR.providers))   # restored after
    import copy
    loaded = copy.copy(ctl.rt.loaded)
    loaded.cfg = loaded.cfg.model_copy(update={"api": loaded.cfg.api.model_copy(update={"listen": "[::1]:0"})})
    monkeypatch.setattr(ctl.rt, "loaded", loaded)
    sessions = object()
    srv = api_mod.serve(ctl.rt, sessions)
    try:
        assert srv.httpd.effective_host == "::1" and srv.app.sessions is sessions
        assert metrics.COLLECTOR.providers["api"] == srv.app.samples
    finally:
        srv.stop()


def test_the_server_thread_and_its_connection_limit(ctl):
    srv = api_mod.Server(api_mod.Api(ctl.rt), "127.0.0.1", 0)
    try:
        assert srv.thread.name == "api" and srv.thread.daemon is True
        assert srv.httpd.adj.connection_limit == api_mod.open_files_for(api_mod.Server.MAX_CONNECTIONS)
    finally:
        srv.start().stop()


def test_a_port_in_use_is_named(ctl):
    import socket
    from controller.launcher import ListenError
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        with pytest.raises(ListenError) as err:
            api_mod.Server(api_mod.Api(ctl.rt), "127.0.0.1", port)
        assert str(err.value) == f"API listener 127.0.0.1:{port}: Address already in use"
    finally:
        taken.close()


def test_mbps_keeps_six_decimals():
    assert api_mod._mbps(1_234_567.891) == 1.234568 and api_mod._mbps(None) is None


def test_the_open_file_limit_is_raised_towards_the_connections_or_left_where_the_kernel_says(monkeypatch):
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    set_to = []
    monkeypatch.setattr(resource, "getrlimit", lambda what: (1024, 1 << 20) if what == resource.RLIMIT_NOFILE
                        else (_ for _ in ()).throw(AssertionError(what)))
    monkeypatch.setattr(resource, "setrlimit", lambda what, lim: set_to.append((what, lim)))
    want_new, want_allowed = api_mod.file_limit_plan(8192, 1024, 1 << 20)
    assert api_mod.open_files_for(8192) == want_allowed
    assert set_to == [(resource.RLIMIT_NOFILE, (want_new, 1 << 20))]

    def refuse(what, lim):
        raise ValueError("not allowed")
    monkeypatch.setattr(resource, "setrlimit", refuse)
    assert api_mod.open_files_for(8192) == api_mod.file_limit_plan(8192, 1024, 1024)[1]


def test_the_token_file_is_named_when_too_large_or_missing(tmp_path):
    big = tmp_path / "token"
    big.write_text("x" * 5000)
    big.chmod(0o600)
    with pytest.raises(ValueError) as err:
        api_mod.read_token(big)
    assert str(err.value) == f"API token file {big}: 5000 bytes, more than 4096"
    with pytest.raises(ValueError, match=f"^API token file {tmp_path / 'none'}: cannot read: No such file"):
        api_mod.read_token(tmp_path / "none")


def test_the_fabric_shows_each_direction_of_a_link_its_own_load(ctl, monkeypatch):
    lk = ctl.rt.loaded.topology.links[0]
    monkeypatch.setitem(api_mod.PROVIDERS, "link_loads", lambda: {(lk.b, lk.a): 2_500_000.0})
    got = next(x for x in json.loads(_call(ctl, "GET", "/v1/fabric").data)["links"] if (x["a"], x["b"]) == (lk.a, lk.b))
    assert got["load_mbps"] == {f"{lk.a}>{lk.b}": None, f"{lk.b}>{lk.a}": 2.5}


def test_status_says_no_file_for_a_configuration_built_in_memory(ctl, monkeypatch):
    import copy
    loaded = copy.copy(ctl.rt.loaded)
    loaded.path = None
    monkeypatch.setattr(ctl.rt, "loaded", loaded)
    assert json.loads(_call(ctl, "GET", "/v1/status").data)["file"] is None


def test_a_tenant_reads_back_as_put_and_the_puts_etag_is_the_gets(ctl):
    body = {"vms": {"v": {"host": "h4", "guarantee_mbps": 1.5}}}
    put = _call(ctl, "PUT", "/v1/tenants/newt", body)
    assert put.status_code == 200 and put.headers.get("ETag")
    got = _call(ctl, "GET", "/v1/tenants/newt")
    assert got.headers["ETag"] == put.headers["ETag"]
    tenant = json.loads(got.data)
    assert tenant == api_mod._plain(ctl.rt.loaded.cfg.tenants["newt"]) and tenant["vms"]["v"]["guarantee_mbps"] == 1.5
