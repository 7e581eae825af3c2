"""Experiments configure bwfabric the way an operator does: a configuration
file for the controller (:func:`write`), then the API (:class:`ApiClient`,
the same client as ``bwfabric status``) for changes during a run."""

from __future__ import annotations

import secrets
import socket
from pathlib import Path

import yaml

from bwfabric.client import ApiClient  # noqa: F401 (re-exported for experiments)
from bwcommon.channel import write_secret


def free_port() -> int:
    """A TCP port on 127.0.0.1 free now, for a controller a run starts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write(path: Path, topology_file: Path, routing: str, of_port: int, *, prio_queues: bool = False,
          state_file: Path | None = None, lessor: dict | None = None, tenants: dict | None = None,
          agents_dir: Path | None = None, agent_defaults: dict | None = None, api_port: int | None = None,
          prio: dict | None = None, admission_mu: float | None = None, port_stats_s: float | None = None,
          lrc: dict | None = None, status_interval_s: float = 1.0, log_level: str | None = None,
          ha: dict | None = None) -> Path:
    """A configuration file for one run. With ``agents_dir``, every VM's
    host has an agent at ``unix:<agents_dir>/<host>.sock`` whose key derives
    from ``<agents_dir>/master.key`` (created here); with ``api_port``, the
    API listens on 127.0.0.1 with a fresh token in ``<dir>/api.token``."""
    data: dict = {"fabric": {"topology": str(Path(topology_file).resolve())},
                  "controller": {"routing": routing, "prio_queues": prio_queues,
                                 "openflow": {"listen": "127.0.0.1", "port": of_port}}}
    if state_file is not None:
        data["controller"]["state_file"] = str(state_file)
    if log_level is not None:
        data["controller"]["log_level"] = log_level
    if ha is not None:
        data["controller"]["ha"] = ha
    if port_stats_s is not None:
        data["controller"]["port_stats_s"] = port_stats_s
    if lessor:
        data["lessor"] = lessor
    if prio:
        data["prio_queues"] = prio
    if admission_mu is not None:
        data["admission"] = {"mu": admission_mu}
    if tenants:
        data["tenants"] = tenants
    if lrc:
        data["lrc"] = lrc
    if agents_dir is not None:
        agents_dir = Path(agents_dir).resolve()
        agents_dir.mkdir(parents=True, exist_ok=True)
        master = agents_dir / "master.key"
        if not master.exists():
            write_secret(master, secrets.token_hex(32) + "\n")
        data["agents"] = {"master_key_file": str(master), "address_template": f"unix:{agents_dir}/{{host}}.sock",
                          "status_interval_s": status_interval_s, **({"defaults": agent_defaults} if agent_defaults else {})}
    if api_port is not None:
        token = path.parent.resolve() / "api.token"
        if not token.exists():
            write_secret(token, secrets.token_hex(24) + "\n")
        data["api"] = {"listen": f"127.0.0.1:{api_port}", "token_file": str(token),
                       "state_file": str(path.parent.resolve() / "api-state.yaml")}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path



def put_tenants(api, want: dict[str, dict], unmanaged=()) -> float:
    """Make the controller's tenants ``want`` through its API (delete the
    others, put the changed ones) and wait until every managed host's agent
    has its configuration in force; returns the seconds that took."""
    from experiments.agents import wait_in_force
    now = api.get("/v1/tenants")["tenants"]
    for name in sorted(set(now) - set(want)):
        api.delete(f"/v1/tenants/{name}")
    for name, tenant in sorted(want.items()):
        if now.get(name) != tenant:
            api.put(f"/v1/tenants/{name}", tenant)
    hosts = [vm["host"] for t in want.values() for vm in t["vms"].values() if vm["host"] not in unmanaged]
    return wait_in_force(api, hosts)
