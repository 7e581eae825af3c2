"""From the declared tenants to what enforces them (pure): the one place
where guarantees become the ToR meters and every host agent's
configuration, so the switches and the hosts never disagree.

- :func:`host_configs`: per host carrying a VM, the agent's
  :class:`hostagent.plan.HostConfig` -- the VM's tenant policy (hose
  guarantee, fairness policy, WC subflows, competition, and with LRC its
  weight and the tenant's other VMs) with the host's shape from the
  topology (address, NIC rate) and its tuning.
- :func:`meter_rates`: per metered host, the BG rate its ToR polices.
- :func:`agent_endpoints`: where each agent listens and its key file.
"""

from __future__ import annotations

from dataclasses import dataclass
from hostagent.plan import HostConfig, HostSettings, LrcPeer, LrcPolicy, VmPolicy


@dataclass(frozen=True)
class Endpoint:
    host: str
    address: str
    key_file: str | None       # None: derived from the master secret


def nic_mbps(topology, host: str) -> float:
    return sum(lk.capacity_mbps for lk in topology.links if host in (lk.a, lk.b))


def host_configs(loaded) -> dict[str, HostConfig]:
    """host -> its agent's configuration (every host that carries a VM and is not unmanaged)."""
    unmanaged = set(loaded.cfg.agents.unmanaged)
    return {host: host_config(loaded, host) for host in sorted(loaded.vms()) if host not in unmanaged}


def host_config(loaded, host: str) -> HostConfig:
    """The agent configuration of one host carrying a VM (raises the
    agent's own validation error if the agent would refuse it)."""
    tenant_name, _, vm = loaded.vms()[host]
    tenant = loaded.cfg.tenants[tenant_name]
    entry = loaded.cfg.agents.hosts.get(host)
    tuning = loaded.tuning(host).model_dump()
    return HostConfig(settings=HostSettings(host=host, interface=(entry.interface if entry and entry.interface
                                                                  else f"{host}-eth0"),
                                            address=loaded.topology.host(host).ip,
                                            nic_mbps=float(nic_mbps(loaded.topology, host)), **tuning),
                      vm=VmPolicy(guarantee_mbps=vm.guarantee_mbps, wc_subflows=tenant.wc_subflows,
                                  mptcp_cc=tenant.mptcp_cc,
                                  policy=tenant.policy, competition=vm.competition,
                                  lrc=_lrc_policy(loaded, tenant_name, host) if loaded.cfg.lrc.enabled else None))


def deliverable_problems(loaded) -> list[str]:
    """What the agents and the ToR meters could not enforce, by the path of
    the VM: every agent configuration is built and checked by the agent's
    own model, every meter rate must be one an OpenFlow meter takes. The
    configuration check runs this, so check-config, start, reload and the
    API accept exactly what the agents and switches can apply."""
    from pydantic import ValidationError

    from hostagent.plan import PlanError
    problems = []
    unmanaged = set(loaded.cfg.agents.unmanaged)
    meters = meter_rates(loaded)
    for host, (t, n, _) in sorted(loaded.vms().items()):
        where = f"tenants.{t}.vms.{n}"
        if host not in unmanaged:
            try:
                host_config(loaded, host)
            except ValidationError as exc:
                why = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors(include_url=False))
                problems.append(f"{where}: host {host}'s agent could not apply it: {why}")
            except (PlanError, ValueError) as exc:
                problems.append(f"{where}: host {host}'s agent could not apply it: {exc}")
        if host in meters and not 1 <= int(meters[host] * 1000) < 2 ** 32:
            problems.append(f"{where}: a ToR meter cannot police {meters[host]:g} Mb/s (1 kb/s to 4.29 Tb/s)")
    return problems


def _lrc_policy(loaded, tenant_name: str, host: str) -> LrcPolicy:
    """LRC at ``host``: its VM's weight and the tenant's other VMs by address."""
    tenant = loaded.cfg.tenants[tenant_name]
    me = next(vm for vm in tenant.vms.values() if vm.host == host)
    peers = {loaded.topology.host(vm.host).ip: LrcPeer(weight=vm.weight, guarantee_mbps=vm.guarantee_mbps)
             for vm in tenant.vms.values() if vm.host != host}
    return LrcPolicy(mode=loaded.cfg.lrc.mode, wc=loaded.cfg.lrc.wc, weight=me.weight, peers=peers,
                     params=loaded.cfg.lrc.params())


def meter_rates(loaded) -> dict[str, float]:
    """host -> Mb/s its ToR meters BG at (empty when meters are off)."""
    pq = loaded.cfg.prio_queues
    if not loaded.cfg.controller.prio_queues or not pq.meters:
        return {}
    return {host: round(vm.guarantee_mbps * pq.meter_headroom, 6) for host, (_, _, vm) in loaded.vms().items()}


def agent_endpoints(loaded) -> dict[str, Endpoint]:
    """host -> its agent (explicit entries, else the address template for VM hosts)."""
    agents = loaded.cfg.agents
    out = {h: Endpoint(h, e.address, _resolve(loaded, e.key_file)) for h, e in agents.hosts.items()}
    if agents.address_template:
        for host in loaded.vms():
            if host not in agents.unmanaged:
                out.setdefault(host, Endpoint(host, agents.address_template.replace("{host}", host), None))
    return dict(sorted(out.items()))


def _resolve(loaded, path: str | None) -> str | None:
    p = loaded.resolve(path)
    return None if p is None else str(p)


def master_key_file(loaded) -> str | None:
    return _resolve(loaded, loaded.cfg.agents.master_key_file)
