"""From the declared tenants to what enforces them (pure): the one place
where guarantees become the ToR meters and every host agent's
configuration, so the switches and the hosts never disagree.

- :func:`host_configs`: per host carrying VMs, each VM's agent
  :class:`hostagent.plan.HostConfig` -- the VM's tenant policy (hose
  guarantee, fairness policy, WC subflows, competition, and with LRC its
  weight and the tenant's other VMs) with its shape (its host's NIC rate,
  its address, namespace, interface) and its host's tuning; :func:`wire`
  is the form its agent takes.
- :func:`meter_rates`: per metered host, the BG rate its ToR polices (the
  sum of its VMs' guarantees).
- :func:`agent_endpoints`: where each agent listens and its key file.
"""

from __future__ import annotations

from dataclasses import dataclass
from bwcommon.hostconfig import HostConfig, HostSettings, LrcPeer, LrcPolicy, VmPolicy


@dataclass(frozen=True)
class Endpoint:
    host: str
    address: str
    key_file: str | None       # None: derived from the master secret


def nic_mbps(topology, host: str) -> float:
    return sum(lk.capacity_mbps for lk in topology.links if host in (lk.a, lk.b))


def host_configs(loaded) -> dict[str, dict[str, HostConfig]]:
    """host -> {VM name at its agent: its HostConfig}, for every host that
    carries a VM and is not unmanaged (a host that is its own VM: one entry
    named after the host)."""
    unmanaged = set(loaded.cfg.agents.unmanaged)
    return {host: host_config(loaded, host) for host in loaded.host_vms() if host not in unmanaged}


def host_config(loaded, host: str) -> dict[str, HostConfig]:
    """The agent configuration of one host carrying VMs (raises the
    agent's own validation error if the agent would refuse it)."""
    vms = loaded.host_vms()[host]
    return {(p.id if p.netns else host): vm_config(loaded, p) for p in vms}


def vm_config(loaded, placed) -> HostConfig:
    """One VM's agent configuration: its tenant's policy (hose guarantee,
    fairness policy, WC subflows, competition, and with LRC its weight and
    the tenant's other VMs) with its shape (its host's NIC rate, its
    address, namespace and interface) and its host's tuning."""
    host, vm = placed.host, placed.vm
    tenant = loaded.cfg.tenants[placed.tenant]
    entry = loaded.cfg.agents.hosts.get(host)
    tuning = loaded.tuning(host).model_dump()
    # BG beyond the VM's bucket leaves as WC: a lower class only where the fabric has one (prio queues);
    # without, the demoted traffic goes as fast as BG and the VM's limit holds nothing (lrc-vms, paper
    # mode: an adversary at 2.8x its guarantee) -- the VM's BG is then HTB-limited at the host instead
    tuning["demote_bg"] = tuning["demote_bg"] and loaded.cfg.controller.prio_queues
    interface = placed.interface or (entry.interface if entry and entry.interface else f"{host}-eth0")
    return HostConfig(settings=HostSettings(host=host, interface=interface, address=placed.address,
                                            nic_mbps=float(nic_mbps(loaded.topology, host)),
                                            vm_id=placed.id if placed.netns else None, netns=placed.netns,
                                            nic=((entry.interface if entry and entry.interface else f"{host}-eth0")
                                                 if placed.netns else None),
                                            **tuning),
                      vm=VmPolicy(guarantee_mbps=vm.guarantee_mbps, wc_subflows=tenant.wc_subflows,
                                  mptcp_cc=tenant.mptcp_cc,
                                  policy=tenant.policy, competition=vm.competition,
                                  lrc=_lrc_policy(loaded, placed) if loaded.cfg.lrc.enabled else None))


def wire(configs: dict[str, HostConfig]) -> dict:
    """A host's configuration as its agent takes it: one HostConfig for a
    host that is its own VM, ``{"vms": {name: HostConfig}}`` otherwise."""
    if len(configs) == 1:
        (name, cfg), = configs.items()
        if cfg.netns is None:
            return cfg.model_dump(mode="json")
    return {"vms": {name: cfg.model_dump(mode="json") for name, cfg in sorted(configs.items())}}


def deliverable_problems(loaded) -> list[str]:
    """What the agents and the ToR meters could not enforce, by the path of
    the VM: every agent configuration is built and checked by the agent's
    own model, every meter rate must be one an OpenFlow meter takes. The
    configuration check runs this, so check-config, start, reload and the
    API accept exactly what the agents and switches can apply."""
    from pydantic import ValidationError

    from bwcommon.hostconfig import PlanError
    problems = []
    unmanaged = set(loaded.cfg.agents.unmanaged)
    meters = meter_rates(loaded)
    for host, vms in loaded.host_vms().items():
        for p in vms:
            where = f"tenants.{p.tenant}.vms.{p.name}"
            if host in unmanaged:
                continue
            try:
                vm_config(loaded, p)
            except ValidationError as exc:
                why = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors(include_url=False))
                problems.append(f"{where}: host {host}'s agent could not apply it: {why}")
            except (PlanError, ValueError) as exc:
                problems.append(f"{where}: host {host}'s agent could not apply it: {exc}")
        if host in meters and not 1 <= int(meters[host] * 1000) < 2 ** 32:
            problems.append(f"tenants: host {host}'s ToR meter cannot police {meters[host]:g} Mb/s "
                            "(1 kb/s to 4.29 Tb/s)")
    return problems


def _lrc_policy(loaded, placed) -> LrcPolicy:
    """LRC at a VM: its weight and the tenant's other VMs by address."""
    peers = {p.address: LrcPeer(weight=p.vm.weight, guarantee_mbps=p.vm.guarantee_mbps)
             for p in loaded.vms().values() if p.tenant == placed.tenant and p.id != placed.id}
    return LrcPolicy(mode=loaded.cfg.lrc.mode, wc=loaded.cfg.lrc.wc, weight=placed.vm.weight, peers=peers,
                     params=loaded.cfg.lrc.params())


def meter_rates(loaded) -> dict[str, float]:
    """host -> Mb/s its ToR meters BG at (empty when meters are off): the
    sum of its VMs' guarantees (the meter polices the host's port; each
    VM's own BG is held to its guarantee at the host, by its agent)."""
    pq = loaded.cfg.prio_queues
    if not loaded.cfg.controller.prio_queues or not pq.meters:
        return {}
    return {host: round(g * pq.meter_headroom, 6) for host, g in loaded.guarantees().items()}


def agent_endpoints(loaded) -> dict[str, Endpoint]:
    """host -> its agent (explicit entries, else the address template for VM hosts)."""
    agents = loaded.cfg.agents
    out = {h: Endpoint(h, e.address, _resolve(loaded, e.key_file)) for h, e in agents.hosts.items()}
    if agents.address_template:
        for host in loaded.host_vms():
            if host not in agents.unmanaged:
                out.setdefault(host, Endpoint(host, agents.address_template.replace("{host}", host), None))
    return dict(sorted(out.items()))


def _resolve(loaded, path: str | None) -> str | None:
    p = loaded.resolve(path)
    return None if p is None else str(p)


def master_key_file(loaded) -> str | None:
    return _resolve(loaded, loaded.cfg.agents.master_key_file)
