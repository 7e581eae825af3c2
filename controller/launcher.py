"""Start the controller from its configuration: the routing app (and
prio_queues) on os-ken through AppManager (os-ken 4.x ships no
``osken-manager``), the host agents' sessions, the REST API with
``/metrics``, and reload on SIGHUP. Under Ryu, the same app modules load
with ``BWFABRIC_CONFIG=bwfabric.yaml ryu-manager apps/routing/ecmp.py``
(apps only: no agent sessions, API or reload there).
"""

from __future__ import annotations

import faulthandler
import importlib
import logging
import signal
import socket
import threading
from pathlib import Path

from controller import config, runtime

# Short names for `bwfabric controller --apps`; full module paths work too.
APPS = {
    "single_path": "apps.routing.single_path",
    "ecmp": "apps.routing.ecmp",
    "lessor": "apps.lessor.app",
    "hedera": "apps.lessor.hedera_app",
    "prio_queues": "apps.prio_queues.app",
}
# services the launcher starts beside the apps, loaded by name as the apps are (the controller
# package imports no app module but an app's settings: docs/architecture.md)
SERVICES = {"lrc": "apps.lrc.service"}
ROUTING_APPS = {"single_path", "ecmp", "lessor", "hedera"}  # each installs the forwarding defaults


def resolve_apps(names: list[str]) -> list[str]:
    """Map short names to modules; reject unknown ones and two routing apps."""
    modules, routing = [], []
    for name in names:
        name = name.strip()
        if not name:
            continue
        if name in APPS:
            modules.append(APPS[name])
            if name in ROUTING_APPS:
                routing.append(name)
        elif "." in name:
            modules.append(name)
        else:
            raise ValueError(f"unknown app {name!r}; known: {', '.join(sorted(APPS))} "
                             "(or a full module path)")
    if len(routing) > 1:
        raise ValueError(f"apps {', '.join(routing)} both route; choose one")
    if not modules:
        raise ValueError("no app given")
    return modules


def check_tls(tls: dict[str, str] | None) -> dict[str, str] | None:
    """OpenFlow over TLS: all of key, cert and ca (the CA that signed the
    switches' certificates: a switch without one is refused), readable
    files, the key readable by its owner only. None: plain TCP (then keep
    the OpenFlow port on a management network)."""
    if not tls or not any(tls.values()):
        return None
    missing = [k for k in ("key", "cert", "ca") if not tls.get(k)]
    if missing:
        raise ValueError(f"OpenFlow TLS needs --of-tls-key, --of-tls-cert and --of-tls-ca together; "
                         f"missing: {', '.join(missing)}")
    for k in ("key", "cert", "ca"):
        if not Path(tls[k]).is_file():
            raise ValueError(f"OpenFlow TLS {k} {tls[k]}: no such file")
    mode = Path(tls["key"]).stat().st_mode & 0o777
    if mode & 0o077:
        raise ValueError(f"OpenFlow TLS key {tls['key']}: mode {mode:o} lets others read it; chmod 600")
    return {k: str(Path(tls[k]).resolve()) for k in ("key", "cert", "ca")}


def shorthand(topology: str | Path, apps: list[str], of_port: int = 6653, listen_host: str = "127.0.0.1",
              log_level: str = "INFO", tls: dict[str, str] | None = None) -> config.Loaded:
    """``bwfabric controller --topology T --apps A``: a configuration of a
    topology and app names, every other setting at its default."""
    modules = resolve_apps(apps)
    routing = [n.strip() for n in apps if n.strip() in ROUTING_APPS]
    if not routing:
        raise ValueError(f"apps {', '.join(apps)}: name a routing app ({', '.join(sorted(ROUTING_APPS))})")
    if set(modules) - {APPS[routing[0]], APPS["prio_queues"]}:
        raise ValueError("--apps takes bwfabric's apps only; run other modules under ryu-manager")
    openflow = {"listen": listen_host, "port": of_port, **({"tls": tls} if tls and any(tls.values()) else {})}
    data = {"fabric": {"topology": str(Path(topology).resolve())},
            "controller": {"routing": routing[0], "prio_queues": APPS["prio_queues"] in modules,
                           "openflow": openflow, "log_level": log_level.upper()}}
    return config.from_data(data)


def modules_of(loaded: config.Loaded) -> list[str]:
    c = loaded.cfg.controller
    return [APPS[c.routing]] + ([APPS["prio_queues"]] if c.prio_queues else [])


class ListenError(RuntimeError):
    """A listener of the controller cannot bind its address: the process
    exits naming it, rather than run without it (switches would then reach
    whatever else listens there)."""


def probe_listen(host: str, port: int, what: str) -> None:
    """Bind ``host:port`` as the listener will (SO_REUSEADDR, as os-ken's
    hub does) and let it go again: a port in use or an address that is not
    this machine's raises ListenError naming both."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            sock.listen(1)
        except OSError as exc:
            raise ListenError(f"{what} {host}:{port}: {exc.strerror or exc}") from None


def run(loaded: config.Loaded) -> None:
    """Everything is checked first (the configuration, TLS files, that the
    OpenFlow and API addresses can be bound); then this blocks running the
    controller."""
    c = loaded.cfg.controller
    modules = modules_of(loaded)
    tls = check_tls(c.openflow.tls.model_dump() if c.openflow.tls else None)
    probe_listen(c.openflow.listen, c.openflow.port, "OpenFlow listener")
    logging.basicConfig(level=getattr(logging, c.log_level), force=True,   # whatever a library set up before
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    log = logging.getLogger("bwfabric")
    if loaded.set_aside is not None:
        side = config.set_aside(loaded)
        log.error("the API's persisted changes no longer fit; starting without them -- %s (kept in %s)",
                  loaded.set_aside.describe(), side)
    rt = runtime.start(loaded)
    if c.ha is not None:
        rt.role = "standby"        # until the election says otherwise: nothing written to switches or agents
    try:
        services = start_services(rt)
    except Exception:
        runtime.stop()
        raise

    def hangup(*_):       # the reload runs on a thread of its own, never inside the signal handler
        threading.Thread(target=reload_quietly, args=(rt,), name="reload", daemon=True).start()
    signal.signal(signal.SIGHUP, hangup)
    faulthandler.register(signal.SIGUSR1, all_threads=True)    # every thread's stack to stderr, for operators

    from os_ken.lib import hub
    hub.patch(thread=False)
    from os_ken import cfg
    from os_ken.base.app_manager import AppManager
    import os_ken.controller.controller  # noqa: F401  (registers the ofp-* options)

    cfg.CONF(args=[], project="os_ken")
    cfg.CONF.set_override("ofp_tcp_listen_port", c.openflow.port)
    cfg.CONF.set_override("ofp_listen_host", c.openflow.listen)
    if tls:  # os-ken then serves OpenFlow over TLS only, requiring a client certificate signed by ca
        cfg.CONF.set_override("ofp_ssl_listen_port", c.openflow.port)
        cfg.CONF.set_override("ctl_privkey", tls["key"])
        cfg.CONF.set_override("ctl_cert", tls["cert"])
        cfg.CONF.set_override("ca_certs", tls["ca"])
    log.info("starting %s on %s:%d (%s); configuration %s, generation %d", ", ".join(modules),
             c.openflow.listen, c.openflow.port, "OpenFlow over TLS" if tls else "plain TCP", loaded.digest,
             rt.generation)
    election = None
    if c.ha is not None:
        election = start_election(rt, c.ha, hub)
    try:
        AppManager.run_apps(modules + ["os_ken.controller.ofp_handler"])
    finally:
        if election is not None:
            election.resign()          # a standby takes over at once, not a lease later
        services.stop()


def start_election(rt: runtime.Runtime, ha, hub):
    """controller.ha: the election on etcd, on a green thread of the hub;
    its verdicts go to the runtime (apps, agent sessions and the API
    follow its role)."""
    from urllib.parse import urlsplit

    from etcd3gw.client import Etcd3Client

    from controller import metrics
    from controller.ha import Election
    u = urlsplit(ha.etcd)
    client = Etcd3Client(host=u.hostname, port=u.port, protocol=u.scheme, timeout=max(0.5, ha.ttl_s / 4))
    election = Election(client, ha.key, ha.node, ttl_s=ha.ttl_s, poll_s=ha.poll_s)
    election.on_change = lambda role, generation: rt.set_role(role, generation, election.leader)
    metrics.register("ha", lambda: _ha_samples(election))
    from controller import api as api_mod
    api_mod.PROVIDERS["ha"] = election.state
    hub.spawn(election.run, hub.sleep)
    logging.getLogger("bwfabric").info("controller.ha: %s in the election for %s on %s", ha.node, ha.key, ha.etcd)
    return election


def _ha_samples(election):
    st = election.state()
    yield "bwfabric_ha_leader", {"node": st["node"]}, int(st["role"] == "leader")
    yield "bwfabric_ha_generation", {}, st["leader_generation"] or 0
    yield "bwfabric_ha_etcd_errors", {}, st["errors"]


class Services:
    """The controller's own threads beside the apps: agent sessions, the API."""

    def __init__(self, sessions, api, lrc=None):
        self.sessions, self.api, self.lrc = sessions, api, lrc

    def stop(self) -> None:
        if self.lrc is not None:
            self.lrc.stop()
        if self.api is not None:
            self.api.stop()
        if self.sessions is not None:
            self.sessions.stop()


def start_services(rt: runtime.Runtime) -> Services:
    from controller.agent_sessions import AgentSessions
    sessions = AgentSessions(rt.generation)
    if rt.leading():
        sessions.start(rt.loaded, rt.version)      # none declared: no sessions
    rt.subscribe("agents", lambda old, new: sessions.update(old, new, rt.version) if rt.leading() else None)
    rt.on_role(lambda role, generation: sessions.lead(generation, rt.loaded, rt.version) if role == "leader"
               else sessions.follow())
    from controller import metrics
    metrics.register("runtime", lambda: runtime.samples(rt))
    metrics.register("agents", lambda: sessions.samples(rt.loaded))
    LrcService = importlib.import_module(SERVICES["lrc"]).LrcService
    from controller import api as api_mod
    from controller.network_view import NetworkView
    # the routing app registers its port-statistics poll when it starts (after these services)
    lrc = LrcService(rt, sessions, poll=lambda: _provider(api_mod, "poll_port_stats", 0),
                     replies=lambda: _provider(api_mod, "port_stats_replies", 0),
                     loads=lambda: _provider(api_mod, "link_loads", {}),
                     view=NetworkView(rt.loaded.topology)).start()
    metrics.register("lrc", lrc.samples)
    api_mod.PROVIDERS["lrc"] = lrc.state
    api = None
    if rt.loaded.cfg.api is not None:
        try:
            api = api_mod.serve(rt, sessions)
        except ListenError:
            Services(sessions, None, lrc).stop()
            raise
        except ValueError as exc:                           # the token file
            Services(sessions, None, lrc).stop()
            raise ListenError(str(exc)) from None
    return Services(sessions, api, lrc)


def _provider(api_mod, name: str, default):
    fn = api_mod.PROVIDERS.get(name)
    return fn() if fn is not None else default


def reload_quietly(rt: runtime.Runtime) -> None:
    """SIGHUP: reload; a refused file is logged and counted (runtime), nothing changes."""
    try:
        result = rt.reload()
    except config.ConfigError:
        return                      # logged and counted by the runtime
    logging.getLogger("bwfabric").info("SIGHUP: %s", "configuration %s in force (version %d)" % (
        result["digest"], result["version"]) if result["changed"] else "the file is unchanged")
