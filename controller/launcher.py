"""Start bwfabric apps on os-ken through AppManager (os-ken 4.x ships no
``osken-manager``). Under Ryu, the same app modules load with
``BWFABRIC_TOPOLOGY=t.json ryu-manager apps/routing/ecmp.py``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from controller.topology import TopologyDescription

# Short names for `bwfabric controller --apps`; full module paths work too.
APPS = {
    "single_path": "apps.routing.single_path",
    "ecmp": "apps.routing.ecmp",
    "lessor": "apps.lessor.app",
    "hedera": "apps.lessor.hedera_app",
    "prio_queues": "apps.prio_queues.app",
}
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


def run(topology: str | Path, apps: list[str], of_port: int = 6653,
        listen_host: str = "127.0.0.1", log_level: str = "INFO", tls: dict[str, str] | None = None) -> None:
    """Validate everything first, then block running the apps."""
    modules = resolve_apps(apps)
    tls = check_tls(tls)
    TopologyDescription.load(topology)  # raises TopologyError naming the problem
    os.environ["BWFABRIC_TOPOLOGY"] = str(Path(topology).resolve())
    logging.basicConfig(level=getattr(logging, log_level.upper()),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")

    from os_ken.lib import hub
    hub.patch(thread=False)
    from os_ken import cfg
    from os_ken.base.app_manager import AppManager
    import os_ken.controller.controller  # noqa: F401  (registers the ofp-* options)

    cfg.CONF(args=[], project="os_ken")
    cfg.CONF.set_override("ofp_tcp_listen_port", of_port)
    cfg.CONF.set_override("ofp_listen_host", listen_host)
    if tls:  # os-ken then serves OpenFlow over TLS only, requiring a client certificate signed by ca
        cfg.CONF.set_override("ofp_ssl_listen_port", of_port)
        cfg.CONF.set_override("ctl_privkey", tls["key"])
        cfg.CONF.set_override("ctl_cert", tls["cert"])
        cfg.CONF.set_override("ca_certs", tls["ca"])
    logging.getLogger("bwfabric").info("starting %s on %s:%d (%s)", ", ".join(modules), listen_host, of_port,
                                       "OpenFlow over TLS" if tls else "plain TCP")
    AppManager.run_apps(modules + ["os_ken.controller.ofp_handler"])
