"""The northbound REST API and ``/metrics``, on one Werkzeug server in a
thread of the controller process (os-ken no longer ships a WSGI layer).

Resources (JSON; every ``/v1`` request needs ``Authorization: Bearer
<token>``, the token being the contents of ``api.token_file``):

- ``GET /v1/status``: configuration digest, version, generation, load
  errors, counts;
- ``GET /v1/fabric``: switches, links with capacity and measured load,
  admission headroom per cut;
- ``GET /v1/tenants``, ``GET/PUT/DELETE /v1/tenants/{t}``,
  ``GET/PUT/DELETE /v1/tenants/{t}/vms/{vm}``: the tenants in force;
- ``GET /v1/flows``: long flows, predicted rates and placed paths
- ``GET /v1/lrc``: LRC's rounds, measured delay, pairs with their terms, link factors
  (LESSOR);
- ``GET /v1/agents``: every agent session's state;
- ``POST /v1/reload``: read the configuration file again.

A change is checked whole (schema, names, admission control) before
anything happens; a refused one changes nothing: 401 without the right
token, 422 for a body or configuration that is invalid (each problem with
its path), 409 when admission control refuses it (naming the cut and the
numbers), 404 for an unknown tenant or VM. An accepted change is written
to ``api.state_file`` (atomically, mode 600) and only then put in force,
so a restarted controller comes back with it. ``GET /metrics`` (no token:
bind the API to a management address) is Prometheus' text format.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import re
import threading
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound
from werkzeug.routing import Map, Rule
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from controller import admission, metrics
from controller.config import NAME_PATTERN, ConfigError, Tenant, Vm, schema_errors
from controller.validate import strict_json

log = logging.getLogger("bwfabric.api")
MAX_BODY = 64 * 1024
PROVIDERS: dict[str, Any] = {}       # "flows" -> callable returning LESSOR's flows (registered by the app)
_NAME = re.compile(NAME_PATTERN)


def read_token(path: Path) -> str:
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise ValueError(f"API token {path}: mode {mode:o} lets others read it; chmod 600 {path}")
    token = path.read_text().strip()
    if len(token) < 16:
        raise ValueError(f"API token {path}: shorter than 16 characters")
    return token


def write_state(path: Path, overlay: dict) -> None:
    """Atomically: a temporary file (mode 600) fsynced, then renamed over."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("# written by the bwfabric controller's API; do not edit while it runs\n")
        yaml.safe_dump(overlay, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class ApiError(Exception):
    def __init__(self, status: int, error: str, problems: list[str] | None = None):
        super().__init__(error)
        self.status, self.error, self.problems = status, error, problems or []


class Api:
    def __init__(self, rt, sessions=None, token: str | None = None):
        self.rt, self.sessions = rt, sessions
        api_cfg = rt.loaded.cfg.api
        self.token = token if token is not None else read_token(rt.loaded.resolve(api_cfg.token_file))
        self.state_file = rt.loaded.resolve(api_cfg.state_file)
        self.lock = threading.Lock()       # one change at a time: check, persist, apply
        self.registry = metrics.registry()
        self.requests: dict[str, int] = {}
        self.url_map = Map([
            Rule("/metrics", endpoint="metrics", methods=["GET"]),
            Rule("/v1/status", endpoint="status", methods=["GET"]),
            Rule("/v1/fabric", endpoint="fabric", methods=["GET"]),
            Rule("/v1/flows", endpoint="flows", methods=["GET"]),
            Rule("/v1/lrc", endpoint="lrc", methods=["GET"]),
            Rule("/v1/agents", endpoint="agents", methods=["GET"]),
            Rule("/v1/reload", endpoint="reload", methods=["POST"]),
            Rule("/v1/tenants", endpoint="tenants", methods=["GET"]),
            Rule("/v1/tenants/<t>", endpoint="tenant", methods=["GET", "PUT", "DELETE"]),
            Rule("/v1/tenants/<t>/vms/<vm>", endpoint="vm", methods=["GET", "PUT", "DELETE"]),
        ], strict_slashes=False)

    # ---- WSGI ------------------------------------------------------------------------------------
    def __call__(self, environ, start_response):
        request = Request(environ)
        try:
            response = self.dispatch(request)
        except ApiError as exc:
            response = _json({"error": exc.error, "problems": exc.problems}, exc.status)
        except HTTPException as exc:
            response = _json({"error": exc.description or exc.name}, exc.code or 500)
        except Exception as exc:  # noqa: BLE001 - a bug answers 500; the server goes on
            log.exception("API %s %s failed", request.method, request.path)
            response = _json({"error": f"internal error: {type(exc).__name__}"}, 500)
        key = f"{response.status_code}"
        self.requests[key] = self.requests.get(key, 0) + 1
        return response(environ, start_response)

    def dispatch(self, request: Request) -> Response:
        adapter = self.url_map.bind_to_environ(request.environ)
        try:
            endpoint, args = adapter.match()
        except MethodNotAllowed:
            raise ApiError(405, f"{request.method} is not allowed on {request.path}") from None
        except NotFound:
            raise ApiError(404, f"no resource {request.path}") from None
        if endpoint == "metrics":
            return Response(generate_latest(self.registry), mimetype=CONTENT_TYPE_LATEST)
        self._authorise(request)
        for name in args.values():
            if not _NAME.match(name):
                raise ApiError(422, f"{name!r}: names are 1-32 letters, digits, '_', '.' or '-'")
        return getattr(self, f"on_{endpoint}")(request, **args)

    def _authorise(self, request: Request) -> None:
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self.token.encode()):
            raise ApiError(401, "missing or wrong bearer token")

    # ---- reads ------------------------------------------------------------------------------------
    def on_status(self, request):
        rt = self.rt
        loaded = rt.loaded
        agents = self.sessions.states() if self.sessions is not None else []
        return _json({"digest": loaded.digest, "version": rt.version, "generation": rt.generation,
                      "file": str(loaded.path) if loaded.path else None, "load_errors": rt.load_errors,
                      "last_error": rt.last_error, "routing": loaded.cfg.controller.routing,
                      "switches": len(loaded.topology.switches), "hosts": len(loaded.topology.hosts),
                      "tenants": len(loaded.cfg.tenants), "vms": len(loaded.vms()),
                      "agents": {"declared": len(agents), "connected": sum(a["connected"] for a in agents),
                                 "in_force": sum(bool(a["in_force"]) for a in agents)}})

    def on_fabric(self, request):
        loaded = self.rt.loaded
        loads = _provider("link_loads", {})
        links = [{"a": lk.a, "b": lk.b, "capacity_mbps": lk.capacity_mbps,
                  "load_mbps": {f"{lk.a}>{lk.b}": _mbps(loads.get((lk.a, lk.b))),
                                f"{lk.b}>{lk.a}": _mbps(loads.get((lk.b, lk.a)))}} for lk in loaded.topology.links]
        guarantees = {h: vm.guarantee_mbps for h, (_, _, vm) in loaded.vms().items()}
        return _json({"switches": [{"name": s.name, "dpid": s.dpid, "role": s.role, "pod": s.pod}
                                   for s in loaded.topology.switches],
                      "hosts": [{"name": h.name, "ip": h.ip} for h in loaded.topology.hosts], "links": links,
                      "admission": {"mu": loaded.cfg.admission.mu,
                                    "cuts": admission.headroom(loaded.topology, guarantees, loaded.cfg.admission.mu)}})

    def on_flows(self, request):
        return _json({"flows": _provider("flows", [])})

    def on_lrc(self, request):
        return _json({"lrc": _provider("lrc", None)})

    def on_agents(self, request):
        return _json({"agents": self.sessions.states() if self.sessions is not None else []})

    def on_tenants(self, request):
        return _json({"tenants": {t: v.model_dump(mode="json") for t, v in self.rt.loaded.cfg.tenants.items()}})

    def on_tenant(self, request, t):
        if request.method == "GET":
            return _json(self._tenant(t).model_dump(mode="json"))
        if request.method == "DELETE":
            self._tenant(t)
            return self._change(request, {t: None}, f"DELETE tenant {t}")
        body = _body(request)
        try:
            tenant = Tenant.model_validate(body)
        except ValidationError as exc:
            raise ApiError(422, "invalid tenant", schema_errors(exc, f"tenants.{t}")) from None
        return self._change(request, {t: tenant.model_dump(mode="json", exclude_defaults=False)}, f"PUT tenant {t}")

    def on_vm(self, request, t, vm):
        tenant = self._tenant(t)
        if request.method == "GET":
            if vm not in tenant.vms:
                raise ApiError(404, f"tenant {t} has no VM {vm}")
            return _json(tenant.vms[vm].model_dump(mode="json"))
        vms = {n: v.model_dump(mode="json") for n, v in tenant.vms.items()}
        if request.method == "DELETE":
            if vm not in vms:
                raise ApiError(404, f"tenant {t} has no VM {vm}")
            del vms[vm]
        else:
            body = _body(request)
            try:
                vms[vm] = Vm.model_validate(body).model_dump(mode="json")
            except ValidationError as exc:
                raise ApiError(422, "invalid VM", schema_errors(exc, f"tenants.{t}.vms.{vm}")) from None
        new = {**tenant.model_dump(mode="json"), "vms": vms}
        return self._change(request, {t: new}, f"{request.method} VM {t}/{vm}")

    def on_reload(self, request):
        with self.lock:
            try:
                result = self.rt.reload()
            except ConfigError as exc:
                raise ApiError(422, "the configuration file is refused; nothing changed", exc.problems) from None
        return _json(result)

    # ---- changes ----------------------------------------------------------------------------------
    def _tenant(self, t: str) -> Tenant:
        tenant = self.rt.loaded.cfg.tenants.get(t)
        if tenant is None:
            raise ApiError(404, f"no tenant {t}")
        return tenant

    def _change(self, request, tenants: dict[str, dict | None], what: str) -> Response:
        """Check the configuration with ``tenants`` laid over it; persist;
        put in force. Nothing changes unless all three succeed in order."""
        with self.lock:
            loaded = self.rt.loaded
            overlay = {"tenants": {**(loaded.overlay.get("tenants") or {}), **tenants}}
            # a tenant deleted that only the API created leaves no trace
            operator = set((loaded.raw or {}).get("tenants") or {})
            overlay["tenants"] = {k: v for k, v in overlay["tenants"].items() if v is not None or k in operator}
            try:
                new = self.rt.propose(loaded.raw, overlay, f"API {what}")
            except ConfigError as exc:
                admission_only = all(p.startswith("admission:") for p in exc.problems)
                raise ApiError(409 if admission_only else 422,
                               "admission control refuses it" if admission_only else "invalid configuration",
                               exc.problems) from None
            write_state(self.state_file, overlay)
            result = self.rt.apply(new, f"API {what}")
        log.info("API %s accepted: configuration %s, version %d", what, result["digest"], result["version"])
        return _json(result)


def _provider(name: str, default):
    fn = PROVIDERS.get(name)
    return fn() if fn is not None else default


def _mbps(bps: float | None) -> float | None:
    return None if bps is None else round(bps / 1e6, 6)


def _body(request: Request) -> Any:
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise ApiError(413, f"body of {request.content_length} bytes, at most {MAX_BODY}")
    raw = request.get_data(cache=False)[: MAX_BODY + 1]
    if len(raw) > MAX_BODY:
        raise ApiError(413, f"body over {MAX_BODY} bytes")
    try:
        return strict_json(raw, "body")
    except ValueError as exc:
        raise ApiError(422, "the body is not JSON bwfabric accepts", [str(exc)]) from None


def _json(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(data, allow_nan=False, default=str) + "\n", status=status,
                    mimetype="application/json")


class Server:
    def __init__(self, app: Api, host: str, port: int):
        self.app = app
        self.httpd = make_server(host, port, app, threaded=True)
        self.port = self.httpd.server_port
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="api", daemon=True)

    def start(self) -> "Server":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.thread.join(5)


def serve(rt, sessions=None) -> Server:
    host, _, port = rt.loaded.cfg.api.listen.rpartition(":")
    app = Api(rt, sessions)
    server = Server(app, host.strip("[]"), int(port)).start()
    log.info("API and /metrics on http://%s", rt.loaded.cfg.api.listen)
    return server
