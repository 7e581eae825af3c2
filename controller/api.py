"""The northbound REST API and ``/metrics``, served by waitress (a
production WSGI server) in a thread of the controller process (os-ken no
longer ships a WSGI layer); Werkzeug provides routing and request objects.

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

import errno
import functools
import hashlib
import hmac
import json
import logging
import re
import resource
import threading
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound
from werkzeug.routing import Map, Rule
from werkzeug.wrappers import Request, Response

from controller import admission, metrics
from controller.config import NAME_PATTERN, ConfigError, Tenant, Vm, schema_errors, write_private
from bwcommon.validate import read_bounded, strict_json

log = logging.getLogger("bwfabric.api")
MAX_BODY = 64 * 1024
PROVIDERS: dict[str, Any] = {}       # "flows" -> callable returning LESSOR's flows (registered by the app)
_NAME = re.compile(NAME_PATTERN)


def read_token(path: Path) -> str:
    """The bearer token: a private file of at least 16 characters
    (ValueError naming the file otherwise: missing, a directory, ...)."""
    raw = read_bounded(path, 4096, "API token file")
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise ValueError(f"API token {path}: mode {mode:o} lets others read it; chmod 600 {path}")
    try:
        token = raw.decode("utf-8").strip()  # pragma: no mutate (codec names are case-insensitive)
    except UnicodeDecodeError:
        raise ValueError(f"API token {path}: not UTF-8 text") from None
    if len(token) < 16:
        raise ValueError(f"API token {path}: shorter than 16 characters")
    return token


def write_state(path: Path, overlay: dict) -> None:
    """Atomically: a temporary file (mode 600) fsynced, then renamed over;
    nothing is left behind when it fails (OSError)."""
    write_private(path, "# written by the bwfabric controller's API; do not edit while it runs\n", overlay)


ETAG = "ETag"          # HTTP header names are case-insensitive: named once


def _plain(model: Any) -> Any:
    """A tenant's or VM's content as JSON values (what the API reads,
    writes and tags)."""
    # not mutated (mutmut): the models hold only JSON types (str, float, None), so any dump mode gives the same
    return model.model_dump(mode="json")  # pragma: no mutate


def etag(resource: Any) -> str:
    """A strong entity tag of a tenant's or VM's content (RFC 9110): any
    change -- by the API or by a reload of the operator's file -- changes
    it, so a client's If-Match detects every write it did not see."""
    # canonical JSON (not mutated: keys are already in field order and NaN never passes validation)
    blob = json.dumps(_plain(resource), sort_keys=True, allow_nan=False).encode()  # pragma: no mutate
    return '"' + hashlib.sha256(blob).hexdigest()[:20] + '"'


# the API's resources: path, endpoint (the on_<endpoint> handler), methods
ROUTES = (
    ("/metrics", "metrics", ("GET",)),
    ("/v1/status", "status", ("GET",)),
    ("/v1/fabric", "fabric", ("GET",)),
    ("/v1/flows", "flows", ("GET",)),
    ("/v1/lrc", "lrc", ("GET",)),
    ("/v1/agents", "agents", ("GET",)),
    ("/v1/reload", "reload", ("POST",)),
    ("/v1/tenants", "tenants", ("GET",)),
    ("/v1/tenants/<t>", "tenant", ("GET", "PUT", "DELETE")),
    ("/v1/tenants/<t>/vms/<vm>", "vm", ("GET", "PUT", "DELETE")),
)


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
        self.registry = metrics.registry()
        self.requests: dict[str, int] = {}
        self.persist_errors = 0             # accepted changes that could not be written (nothing changed)
        self.counts_lock = threading.Lock()
        # a trailing slash is the same resource (no redirect)
        self.url_map = Map([Rule(path, endpoint=endpoint, methods=list(methods)) for path, endpoint, methods in ROUTES],
                           strict_slashes=False)

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
        with self.counts_lock:
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
        if request.method not in ("GET", "HEAD") and not self.rt.leading():
            raise ApiError(503, "this controller is a standby (controller.ha): it answers reads only; send "
                                f"changes to the leader ({self.rt.leader_name or 'not known yet'})")
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
                      "role": rt.role, "leader": rt.leader_name,
                      "file": str(loaded.path) if loaded.path else None, "load_errors": rt.load_errors,
                      "last_error": rt.last_error, "overlay_set_aside": rt.overlay_set_aside,
                      "routing": loaded.cfg.controller.routing,
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
        guarantees = loaded.guarantees()
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
        tenants = self.rt.loaded.cfg.tenants
        return _json({"tenants": {t: _plain(v) for t, v in tenants.items()},
                      "etags": {t: etag(v) for t, v in tenants.items()}})

    def on_tenant(self, request, t):
        if request.method == "GET":
            tenant = self._tenant(self.rt.loaded, t)
            return _json(_plain(tenant), headers={ETAG: etag(tenant)})
        if request.method == "DELETE":
            def mutate(loaded):
                _preconditions(request, self._tenant(loaded, t))
                return _overlay(loaded, {t: None})
            return self._change(mutate, f"DELETE tenant {t}", lambda loaded: None)
        body = _body(request)
        try:
            tenant = Tenant.model_validate(body)
        except ValidationError as exc:
            raise ApiError(422, "invalid tenant", schema_errors(exc, f"tenants.{t}")) from None

        def mutate(loaded):
            _preconditions(request, loaded.cfg.tenants.get(t))
            return _overlay(loaded, {t: _plain(tenant)})
        return self._change(mutate, f"PUT tenant {t}", lambda loaded: loaded.cfg.tenants.get(t))

    def on_vm(self, request, t, vm):
        if request.method == "GET":
            tenant = self._tenant(self.rt.loaded, t)
            if vm not in tenant.vms:
                raise ApiError(404, f"tenant {t} has no VM {vm}")
            return _json(_plain(tenant.vms[vm]), headers={ETAG: etag(tenant.vms[vm])})
        new_vm = None
        if request.method == "PUT":
            body = _body(request)
            try:
                new_vm = _plain(Vm.model_validate(body))
            except ValidationError as exc:
                raise ApiError(422, "invalid VM", schema_errors(exc, f"tenants.{t}.vms.{vm}")) from None

        def mutate(loaded):
            # the tenant is read here, under the change lock: a VM change
            # composes with every other change instead of overwriting it
            tenant = self._tenant(loaded, t)
            vms = {n: _plain(v) for n, v in tenant.vms.items()}
            if new_vm is None and vm not in vms:
                raise ApiError(404, f"tenant {t} has no VM {vm}")
            _preconditions(request, tenant.vms.get(vm))
            if new_vm is None:
                del vms[vm]
            else:
                vms[vm] = new_vm
            return _overlay(loaded, {t: {**_plain(tenant), "vms": vms}})
        return self._change(mutate, f"{request.method} VM {t}/{vm}",
                            lambda loaded: (loaded.cfg.tenants.get(t) or Tenant()).vms.get(vm))

    def on_reload(self, request):
        try:
            result = self.rt.reload()
        except ConfigError as exc:
            raise ApiError(422, "the configuration file is refused; nothing changed", exc.problems) from None
        return _json(result)

    # ---- changes ----------------------------------------------------------------------------------
    @staticmethod
    def _tenant(loaded, t: str) -> Tenant:
        tenant = loaded.cfg.tenants.get(t)
        if tenant is None:
            raise ApiError(404, f"no tenant {t}")
        return tenant

    def _change(self, mutate, what: str, resource) -> Response:
        """One change, linearizable (:meth:`controller.runtime.Runtime.change`):
        ``mutate`` reads the configuration in force and returns the new
        overlay under the lock every change and reload takes; the result is
        checked whole, persisted, then put in force. Nothing changes unless
        all of it succeeds. ``resource`` finds the changed resource in the
        new configuration (its ETag goes back to the client)."""
        try:
            result = self.rt.change(mutate, self._persist, f"API {what}")
        except ConfigError as exc:
            admission_only = all(p.startswith("admission:") for p in exc.problems)
            raise ApiError(409 if admission_only else 422,
                           "admission control refuses it" if admission_only else "invalid configuration",
                           exc.problems) from None
        log.info("API %s accepted: configuration %s, version %d", what, result["digest"], result["version"])
        changed = resource(self.rt.loaded)
        return _json(result, headers={ETAG: etag(changed)} if changed is not None else None)

    def _persist(self, overlay: dict) -> None:
        try:
            write_state(self.state_file, overlay)
        except OSError as exc:
            with self.counts_lock:
                self.persist_errors += 1
            log.error("API change not persisted to %s (%s): refused, nothing changed", self.state_file,
                      exc.strerror or exc)
            status = 507 if exc.errno in (errno.ENOSPC, errno.EDQUOT) else 503
            raise ApiError(status, f"the change could not be persisted to {self.state_file}: "
                           f"{exc.strerror or exc}; nothing changed") from None

    def samples(self):
        """The API's own counters (controller.metrics)."""
        with self.counts_lock:
            yield "bwfabric_api_persist_errors", {}, self.persist_errors
            for code, n in sorted(self.requests.items()):
                yield "bwfabric_api_requests", {"code": code}, n


def _overlay(loaded, tenants: dict[str, dict | None]) -> dict:
    """The API's overlay in force with ``tenants`` laid over it; a tenant
    deleted that only the API created leaves no trace."""
    overlay = {**(loaded.overlay.get("tenants") or {}), **tenants}
    operator = set((loaded.raw or {}).get("tenants") or {})
    return {"tenants": {k: v for k, v in overlay.items() if v is not None or k in operator}}


def _preconditions(request: Request, current: Any) -> None:
    """RFC 9110 conditional requests on a tenant or VM: ``If-Match`` (an
    ETag from a GET, or ``*``: it must exist) and ``If-None-Match: *``
    (create only). A failed one is 412 and changes nothing."""
    tag = etag(current) if current is not None else None
    if_match = request.headers.get("If-Match")
    if if_match is not None:
        wanted = {x.strip() for x in if_match.split(",") if x.strip()}
        if tag is None or not ("*" in wanted or tag in wanted):
            raise ApiError(412, f"If-Match {if_match} does not hold: the resource is now "
                           f"{tag or 'absent'}; read it again")
    if_none = request.headers.get("If-None-Match")
    if if_none is not None:
        wanted = {x.strip() for x in if_none.split(",") if x.strip()}
        if tag is not None and ("*" in wanted or tag in wanted):
            raise ApiError(412, f"If-None-Match {if_none} does not hold: the resource exists ({tag})")


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


def _json(data: Any, status: int = 200, headers: dict | None = None) -> Response:
    return Response(json.dumps(data, allow_nan=False, default=str) + "\n", status=status,
                    mimetype="application/json", headers=headers)


FD_MARGIN = 256      # open files kept for everything but the API's connections (sockets, logs, state)
MIN_CONNECTIONS = 16


def file_limit_plan(connections: int, soft: int, hard: int, infinity: int = resource.RLIM_INFINITY
                    ) -> tuple[int | None, int]:
    """(the soft limit to ask for, or None to leave it; the connections the
    API may then hold) for an open-file limit of ``soft``/``hard``: room for
    ``connections`` plus FD_MARGIN, never past the hard limit, and at least
    MIN_CONNECTIONS connections whatever the limit."""
    want = connections + FD_MARGIN
    new = None
    if soft != infinity and soft < want:
        new = want if hard == infinity else min(want, hard)
    limit = new if new is not None else soft
    return new, (connections if limit == infinity else max(MIN_CONNECTIONS, min(connections, limit - FD_MARGIN)))


def open_files_for(connections: int) -> int:
    """Raise this process's open-file limit towards ``connections`` plus a
    margin (never past the hard limit); returns the connections it allows
    (as many as the old limit allows if the kernel refuses the new one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    new, allowed = file_limit_plan(connections, soft, hard)
    if new is None:
        return allowed
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    except (ValueError, OSError):
        return file_limit_plan(connections, soft, soft)[1]
    return allowed


class Server:
    """The API on waitress, a production WSGI server: requests are read by
    its event loop (poll) and only whole ones reach its bounded pool of
    worker threads, so slow or partial requests hold no thread; a request
    body over MAX_BODY is refused with 413 as it arrives (chunked too), a
    connection idle for CHANNEL_TIMEOUT_S is closed, and at most
    MAX_CONNECTIONS are open at once."""

    THREADS = 4
    MAX_CONNECTIONS = 8192
    CHANNEL_TIMEOUT_S = 10
    MAX_HEADER_BYTES = 16 * 1024

    def __init__(self, app: Api, host: str, port: int):
        from waitress.server import create_server
        self.app = app
        try:
            self.httpd = create_server(
                app, host=host, port=port, asyncore_use_poll=True, ident="bwfabric",
                connection_limit=open_files_for(self.MAX_CONNECTIONS), channel_timeout=self.CHANNEL_TIMEOUT_S,
                cleanup_interval=1, max_request_body_size=MAX_BODY, max_request_header_size=self.MAX_HEADER_BYTES,
                # waitress's own defaults, stated so that every setting is read here (not mutated: dropping
                # one changes nothing; tests/unit/test_controller_process.py reads them all back)
                threads=self.THREADS, backlog=1024,  # pragma: no mutate
                expose_tracebacks=False, clear_untrusted_proxy_headers=True, _start=True)  # pragma: no mutate
        except OSError as exc:
            from controller.launcher import ListenError
            raise ListenError(f"API listener {host}:{port}: {exc.strerror or exc}") from None
        self.port = self.httpd.effective_port
        self.thread = threading.Thread(target=self._run, name="api", daemon=True)

    def _run(self) -> None:
        try:
            self.httpd.run()
        except (OSError, ValueError):     # closed under the loop by stop()
            pass

    def start(self) -> "Server":
        self.thread.start()
        return self

    def stop(self) -> None:
        """Close the listener and every connection in the server's own loop
        thread (its map is not safe to touch from here), then the workers."""
        from waitress import wasyncore
        connections = self.httpd._map
        # (not mutated: how long stop() waits for threads that end at once here, and close errors of
        # connections already gone -- nothing a test can tell apart)
        try:
            close = functools.partial(wasyncore.close_all, connections, ignore_all=True)  # pragma: no mutate
            self.httpd.trigger.pull_trigger(close)
        except OSError:
            pass
        self.thread.join(5)  # pragma: no mutate
        self.httpd.task_dispatcher.shutdown(timeout=5)  # pragma: no mutate


def serve(rt, sessions=None) -> Server:
    host, _, port = rt.loaded.cfg.api.listen.rpartition(":")
    app = Api(rt, sessions)
    server = Server(app, host.strip("[]"), int(port)).start()
    metrics.register("api", app.samples)
    log.info("API and /metrics on http://%s (waitress)", rt.loaded.cfg.api.listen)
    return server
