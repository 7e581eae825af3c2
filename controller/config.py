"""bwfabric's one declared configuration: schema, loading and checks.

One YAML file declares the fabric (the topology description, by path or
inline), the controller (OpenFlow listener, routing app, app settings), the
host agents, the tenants with their VMs (host, hose guarantee, weight), the
admission parameter mu and the API/metrics listener. Types, ranges and
defaults are declared once here (pydantic); :func:`reference_markdown`
turns the same declaration into ``docs/config.md``.

Loading runs in three stages and collects every problem with its path
(``tenants.blue.vms.vm3.guarantee_mbps: must be greater than 0``):

1. the file: UTF-8, at most 1 MiB, YAML without anchors/aliases or
   duplicate keys;
2. the schema: unknown keys, types, ranges, NaN/Infinity;
3. meaning: hosts named by VMs and agents exist in the topology, one VM per
   host, and admission control (:mod:`controller.admission`).

The API's accepted changes live in a file of their own (``api.state_file``,
written by the controller only): its tenants are laid over the operator's
(``null`` deletes one), so the operator's YAML is never rewritten.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

# each app declares its own settings (apps/<app>/settings.py: pydantic + bwcommon only); composed here
from apps.lessor.settings import Lessor
from apps.lrc.settings import Lrc
from apps.prio_queues.settings import PrioQueues
from controller.topology import TopologyDescription, TopologyError, host_address_problem
from bwcommon.validate import IPAddress, StrictModel, read_bounded
from bwcommon.hostconfig import MAX_NIC_MBPS, MPTCP_CCS, NETNS_NAME, Tuning
from bwcommon.policy import POLICIES

MAX_CONFIG_BYTES = 1 << 20
MIN_GUARANTEE_MBPS = 0.001     # 1 kb/s: OpenFlow meters take whole kb/s (a smaller B would be metered at 0)
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$"
NETNS_PATTERN = NETNS_NAME
Name = Annotated[str, Field(pattern=NAME_PATTERN)]
ROUTING_APPS = ("single_path", "ecmp", "lessor", "hedera")


class ConfigError(ValueError):
    """A configuration is refused; ``problems`` lists every one, each with
    its path in the file."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("invalid configuration:\n  " + "\n  ".join(self.problems))


_Strict = StrictModel


# ---- controller -----------------------------------------------------------------------------
class OpenFlowTls(_Strict):
    key: str = Field(description="the controller's private key (mode 600)")
    cert: str = Field(description="the controller's certificate")
    ca: str = Field(description="CA certificate that signed the switches' certificates")


class OpenFlow(_Strict):
    listen: IPAddress = Field("127.0.0.1", description="address the OpenFlow listener binds")
    port: int = Field(6653, ge=1, le=65535, description="OpenFlow TCP port")
    tls: OpenFlowTls | None = Field(None, description="OpenFlow over TLS (all three files); absent: plain TCP")


class Ha(_Strict):
    etcd: str = Field(description="etcd's client URL, http://HOST:PORT or https://HOST:PORT")
    node: Name = Field(description="this controller's name in the election (one per controller)")
    key: str = Field("/bwfabric/leader", pattern=r"^/[!-~]{1,255}$", description="the etcd key the leader "
                     "holds (the same for every controller of the fabric)")
    ttl_s: float = Field(2.0, ge=1, le=60, description="the leader's lease: a dead leader is replaced this "
                         "long after its last renewal")
    poll_s: float = Field(0.2, ge=0.05, le=10, description="how often a standby looks for a vacant leader key")

    @field_validator("etcd")
    @classmethod
    def _etcd(cls, v: str) -> str:
        from urllib.parse import urlsplit
        u = urlsplit(v)
        try:
            port = u.port
        except ValueError:
            port = None
        if u.scheme not in ("http", "https") or not u.hostname or port is None or u.path not in ("", "/"):
            raise ValueError(f"{v!r} must be http://HOST:PORT or https://HOST:PORT")
        return v


class LinkDampingSettings(_Strict):
    threshold: int = Field(4, ge=2, le=100, description="state changes of a port within window_s that hold it "
                           "down")
    window_s: float = Field(2.0, gt=0, le=600, description="the window the changes are counted in")
    hold_s: float = Field(2.0, ge=0, le=3600, description="a held-down port is let back in once it has stayed "
                          "up this long")


class Controller(_Strict):
    openflow: OpenFlow = Field(default_factory=OpenFlow, description="the switches' side")
    link_damping: LinkDampingSettings = Field(default_factory=LinkDampingSettings, description="flapping ports "
                                              "held down (controller/linkdamp.py)")
    ha: Ha | None = Field(None, description="active/standby controllers: a leader election on etcd "
                          "(docs/scale-out.md); absent: this controller alone")
    routing: Literal[ROUTING_APPS] = Field("ecmp", description="the routing app: single_path, ecmp, lessor "
                                           "or hedera (exactly one)")
    prio_queues: bool = Field(True, description="install BG/WC classification (and the ToR meters) beside "
                              "the routing app")
    state_file: str | None = Field(None, description="LESSOR: where to write its state (JSON) after every "
                                   "polling decision")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="controller log level")
    port_stats_s: float = Field(1.0, ge=0.05, le=60, description="poll every switch's port counters this often "
                                "(link loads for the API and metrics)")


# ---- host agents ----------------------------------------------------------------------------
# A host's tuning: the agent's own model (one schema for both sides of the channel)
AgentTuning = Tuning


class AgentHost(_Strict):
    address: str = Field(description="the agent's channel: unix:/path or tcp:ADDR:PORT")
    key_file: str | None = Field(None, description="this host's key file; absent: derived from the master "
                                 "secret")
    interface: str | None = Field(None, pattern=r"^[^/:\s]{1,15}$",
                                  description="the interface the agent shapes (default <host>-eth0)")
    tuning: dict[str, Any] = Field(default_factory=dict, description="overrides of agents.defaults for this "
                                   "host")

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        from bwcommon.transport import parse_address
        parse_address(v)
        return v

    @field_validator("tuning")
    @classmethod
    def _tuning(cls, v: dict) -> dict:
        AgentTuning(**v)         # same types and ranges as the defaults; unknown keys refused
        return v


class Agents(_Strict):
    master_key_file: str | None = Field(None, description="the master secret (mode 600) hosts' keys derive "
                                        "from (bwfabric agent-key)")
    defaults: AgentTuning = Field(default_factory=AgentTuning, description="tuning for every host")
    hosts: dict[Name, AgentHost] = Field(default_factory=dict, description="the agent of each host, by "
                                         "topology host name")
    unmanaged: list[Name] = Field(default_factory=list, description="hosts whose VMs have no agent (bare metal, "
                                  "or a host the operator does not run one on): their guarantees count in "
                                  "admission control and are policed by the ToR meters only")
    address_template: str | None = Field(None, description="the agent address of every VM's host without an "
                                         "entry in agents.hosts, with {host} replaced, e.g. "
                                         "unix:/run/bwfabric/agents/{host}.sock")
    @field_validator("address_template")
    @classmethod
    def _template(cls, v: str | None) -> str | None:
        if v is not None:
            from bwcommon.transport import parse_address
            if "{host}" not in v:
                raise ValueError("must contain {host}")
            parse_address(v.replace("{host}", "h"))
        return v

    request_timeout_s: float = Field(5.0, gt=0, le=120, description="an agent's reply must come within this")
    retry_s: float = Field(0.1, gt=0, le=0.5, description="first reconnect delay (doubling, at most 0.5 s)")
    status_interval_s: float = Field(5.0, gt=0, le=280, description="ask each agent for its status (read back "
                                     "from its kernel) this often; keeps the connection from idling out")


# ---- tenants --------------------------------------------------------------------------------
class Vm(_Strict):
    host: Name = Field(description="the topology host (server) the VM runs on")
    guarantee_mbps: float = Field(ge=MIN_GUARANTEE_MBPS, le=MAX_NIC_MBPS, description="hose guarantee B, both "
                                  "directions (at least 1 kb/s: the smallest rate an OpenFlow meter polices)")
    weight: float = Field(1.0, ge=1e-6, le=1e6, description="weight w (LRC's weighted max-min share)")
    competition: float | None = Field(None, ge=0, le=1e6, description="A_l under policy 'explicit'")
    netns: str | None = Field(None, pattern=NETNS_PATTERN, description="the VM's network namespace on its host "
                              "(an `ip netns` name), for several VMs on one host; absent: the VM is the host's own "
                              "namespace (at most one such VM per host)")
    address: IPAddress | None = Field(None, description="the VM's own IPv4 address (required with netns); absent: "
                                      "the host's")
    interface: str | None = Field(None, pattern=r"^[^/:\s]{1,15}$", description="the VM's interface in its "
                                  "namespace (with netns; default eth0)")


class Tenant(_Strict):
    policy: Literal[POLICIES] = Field("guarantee", description="fair work conservation: A_l = B / U "
                                      "('guarantee'), 1 ('equal'), or each VM's 'competition' ('explicit')")
    wc_subflows: int = Field(1, ge=0, le=8, description="WC (MP_JOIN) subflows per connection")
    mptcp_cc: Literal[MPTCP_CCS] = Field("bgwc", description="the congestion control of the tenant's MPTCP "
                                         "subflows: bgwc (Reno on the first, guaranteed subflow, bwf_wc on the "
                                         "work-conserving joins), or on every subflow lia (RFC 6356), mptcp_d "
                                         "(MPTCP-D with extra-subflow elimination), lia_vm (LIA aware of VM "
                                         "scheduling) or uncoupled (Reno each); docs/coupled.md")
    vms: dict[Name, Vm] = Field(default_factory=dict, description="the tenant's VMs by name")

    @model_validator(mode="after")
    def _explicit(self) -> "Tenant":
        if self.policy == "explicit":
            missing = [n for n, vm in self.vms.items() if vm.competition is None]
            if missing:
                raise ValueError(f"policy 'explicit' needs a competition level on VM(s) {', '.join(missing)}")
        return self


class Admission(_Strict):
    mu: float = Field(0.9, gt=0, le=1, description="guarantees crossing a cut may use at most mu x its "
                      "capacity (the paper's muC: the highest TCP goodput measured on a link)")


class Api(_Strict):
    listen: str = Field("127.0.0.1:8080", description="ADDR:PORT of the REST API and /metrics")
    token_file: str = Field(description="the bearer token clients present (a file of mode 600, relative to "
                            "this file or absolute)")
    state_file: str = Field(description="where the API keeps the changes it accepted, laid over this file's "
                            "tenants at every start and reload (the operator's YAML is never rewritten)")

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) < 65536:   # 0: any free port
            raise ValueError(f"{v!r} must be ADDR:PORT")
        ipaddress.ip_address(host.strip("[]"))
        return v


class Fabric(_Strict):
    topology: str | dict[str, Any] = Field(description="the topology description: a JSON file (relative to "
                                           "this file) or inline")


class Config(_Strict):
    version: Literal[1] = Field(1, description="schema version")
    fabric: Fabric = Field(description="the switches, hosts and links")
    controller: Controller = Field(default_factory=Controller, description="the controller process")
    lessor: Lessor = Field(default_factory=Lessor, description="LESSOR's settings (routing: lessor)")
    prio_queues: PrioQueues = Field(default_factory=PrioQueues, description="BG/WC classification settings")
    agents: Agents = Field(default_factory=Agents, description="host agents the controller configures")
    tenants: dict[Name, Tenant] = Field(default_factory=dict, description="tenants by name")
    admission: Admission = Field(default_factory=Admission, description="admission control")
    lrc: Lrc = Field(default_factory=Lrc, description="LRC's per-VM-pair rate control")
    api: Api | None = Field(None, description="REST API and Prometheus /metrics; absent: none")


# ---- the loaded configuration ------------------------------------------------------------------
class Loaded:
    """A checked configuration with its topology loaded and the API's
    overlay applied. ``digest`` identifies the effective configuration."""

    def __init__(self, cfg: Config, topology: TopologyDescription, path: Path | None,
                 overlay: dict | None = None, raw: dict | None = None):
        self.cfg = cfg
        self.raw = raw if raw is not None else cfg.model_dump(mode="json")   # the operator's, before the overlay
        self.topology = topology
        self.path = path
        self.overlay = overlay or {}
        self.set_aside: SetAside | None = None     # what a starting controller left out of the overlay
        self.digest = hashlib.sha256(json.dumps(
            {"cfg": cfg.model_dump(mode="json"), "topology": topology.to_dict()},
            sort_keys=True).encode()).hexdigest()[:16]

    def resolve(self, path: str | None) -> Path | None:
        """A path of the configuration, relative to its file's directory."""
        if path is None:
            return None
        p = Path(path)
        return p if p.is_absolute() or self.path is None else self.path.parent / p

    def tuning(self, host: str) -> AgentTuning:
        entry = self.cfg.agents.hosts.get(host)
        if entry is None or not entry.tuning:
            return self.cfg.agents.defaults
        return AgentTuning(**{**self.cfg.agents.defaults.model_dump(), **entry.tuning})

    def vms(self) -> dict[str, "PlacedVm"]:
        """VM id ("tenant/vm") -> where it runs and with what address, by id."""
        out = {}
        for t, tenant in sorted(self.cfg.tenants.items()):
            for n, vm in sorted(tenant.vms.items()):
                address = str(vm.address) if vm.address is not None else self.topology.host(vm.host).ip
                out[f"{t}/{n}"] = PlacedVm(f"{t}/{n}", t, n, vm, vm.host, address, vm.netns,
                                           vm.interface or ("eth0" if vm.netns else None))
        return out

    def host_vms(self) -> dict[str, list["PlacedVm"]]:
        """host -> its VMs (hosts without VMs left out)."""
        out: dict[str, list[PlacedVm]] = {}
        for p in self.vms().values():
            out.setdefault(p.host, []).append(p)
        return dict(sorted(out.items()))

    def guarantees(self) -> dict[str, float]:
        """host -> the sum of its VMs' guarantees: what crosses its NIC cut."""
        return {h: sum(p.vm.guarantee_mbps for p in vms) for h, vms in self.host_vms().items()}


@dataclass(frozen=True)
class PlacedVm:
    """A declared VM where it runs: its host, its address (its own, or the
    host's when it is the host's own namespace), namespace and interface."""
    id: str                     # "tenant/vm": unique, the agent's and the API's name for it
    tenant: str
    name: str
    vm: Vm
    host: str
    address: str
    netns: str | None
    interface: str | None       # in its namespace (None: the host's own, from agents.hosts or <host>-eth0)


# ---- YAML -------------------------------------------------------------------------------------
class _Loader(yaml.SafeLoader):
    """Safe YAML without aliases (an alias bomb expands on construction) and
    without duplicate keys (YAML would keep the last one silently)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.constructor.ConstructorError(None, None, "anchors and aliases are not accepted",
                                                    event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def parse_yaml(raw: bytes | str, where: str) -> Any:
    if isinstance(raw, str):
        raw = raw.encode()
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError([f"{where}: {len(raw)} bytes, more than {MAX_CONFIG_BYTES}"])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError([f"{where}: not UTF-8 ({exc.reason} at byte {exc.start})"]) from None
    try:
        return yaml.load(text, Loader=_Loader)   # noqa: S506 - _Loader is a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1} column {mark.column + 1}: " if mark is not None else ""
        raise ConfigError([f"{where}: {at}{getattr(exc, 'problem', None) or exc}"]) from None
    except RecursionError:
        raise ConfigError([f"{where}: nested too deeply"]) from None
    except ValueError as exc:      # e.g. an integer of more digits than Python converts
        raise ConfigError([f"{where}: {exc}"]) from None


def _loc(loc: tuple) -> str:
    return ".".join(str(p) for p in loc
                    if not (isinstance(p, str) and (p.startswith(("function-", "literal[")) or p == "[key]")))


def _message(err: dict) -> str:
    msg = err["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    if err["type"] == "extra_forbidden":
        return "unknown key"
    if err["type"] == "missing":
        return "required"
    if err["type"] == "finite_number":
        return "must be a finite number (NaN and Infinity are refused)"
    if err["type"] == "string_pattern_mismatch" and err["ctx"].get("pattern") == NAME_PATTERN:
        return "names are 1-32 letters, digits, '_', '.' or '-', starting with a letter or digit"
    msg = re.sub(r"^Input should be ", "must be ", msg)
    return msg[0].lower() + msg[1:] if msg else msg


def schema_errors(exc: ValidationError, prefix: str = "") -> list[str]:
    out = []
    for err in exc.errors(include_url=False):
        loc = _loc(tuple(err["loc"]))
        path = f"{prefix}.{loc}" if prefix and loc else (prefix or loc)
        out.append(f"{path or '(top level)'}: {_message(err)}")
    return out


def parse(data: Any) -> Config:
    """Stage 2: the schema. Raises ConfigError naming every problem."""
    if not isinstance(data, dict):
        raise ConfigError([f"(top level): must be a mapping, got {type(data).__name__}"])
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(schema_errors(exc)) from None


def _topology(cfg: Config, base: Path | None) -> TopologyDescription:
    src = cfg.fabric.topology
    try:
        if isinstance(src, dict):
            return TopologyDescription.from_dict(json.loads(json.dumps(src)))
        path = Path(src)
        if not path.is_absolute() and base is not None:
            path = base / path
        return TopologyDescription.load(path)
    except TopologyError as exc:
        raise ConfigError([f"fabric.topology: {p}" for p in exc.problems]) from None


def meaning_problems(cfg: Config, topo: TopologyDescription) -> list[str]:
    """Stage 3 without admission control: every name must resolve."""
    problems = []
    hosts = {h.name for h in topo.hosts}
    ips = {h.ip: h.name for h in topo.hosts}
    taken: dict[str, str] = {}
    spaces: dict[tuple[str, str | None], str] = {}       # (host, netns) -> the VM there
    addresses: dict[str, str] = {}
    for t, tenant in cfg.tenants.items():
        for n, vm in tenant.vms.items():
            here = f"tenants.{t}.vms.{n}"
            if vm.host not in hosts:
                problems.append(f"{here}.host: {vm.host!r} is not a host of the topology")
                continue
            taken.setdefault(vm.host, here)
            other = spaces.setdefault((vm.host, vm.netns), here)
            own = spaces.get((vm.host, None)) if vm.netns is not None else next(
                (w for (h, ns), w in spaces.items() if h == vm.host and ns is not None), None)
            if own is not None and own != here:
                problems.append(f"{here}.netns: host {vm.host} carries VMs in namespaces of their own ({own}) and "
                                "one in its own namespace: give each a netns (the host's NIC then carries them all)")
            if other != here:
                problems.append(f"{here}.netns: host {vm.host} already carries {other} in "
                                + ("its own namespace (more VMs on a host need a netns each)" if vm.netns is None
                                   else f"namespace {vm.netns}"))
            own_ip = topo.host(vm.host).ip
            if vm.netns is None:
                if vm.interface is not None:
                    problems.append(f"{here}.interface: only with netns (the host's own interface is "
                                    f"agents.hosts.{vm.host}.interface)")
                if vm.address is not None and str(vm.address) != own_ip:
                    problems.append(f"{here}.address: a VM in its host's own namespace has the host's address "
                                    f"({own_ip}); give it a netns for one of its own")
                address = own_ip
            elif vm.address is None:
                problems.append(f"{here}.address: required with netns (the VM's own address)")
                continue
            else:
                address = str(vm.address)
                why = host_address_problem(address)
                if why:
                    problems.append(f"{here}.address: {address} {why}")
                elif address in ips:
                    problems.append(f"{here}.address: {address} is host {ips[address]}'s address in the topology")
                else:
                    block = topo.host(vm.host).network()
                    if block is None:
                        problems.append(f"{here}.netns: host {vm.host} has no vm_prefix in the topology (the "
                                        "block its VMs' addresses come from, which the fabric routes to it)")
                    elif ipaddress.IPv4Address(address) not in block:
                        problems.append(f"{here}.address: {address} is not in host {vm.host}'s vm_prefix {block}")
            if address in addresses:
                problems.append(f"{here}.address: {address} is also {addresses[address]}'s")
            addresses.setdefault(address, here)
    for h in cfg.agents.hosts:
        if h not in hosts:
            problems.append(f"agents.hosts.{h}: {h!r} is not a host of the topology")
        elif h not in taken:
            problems.append(f"agents.hosts.{h}: no VM runs on {h} (an agent shapes a VM's traffic)")
    for h, entry in cfg.agents.hosts.items():
        if entry.key_file is None and cfg.agents.master_key_file is None:
            problems.append(f"agents.hosts.{h}.key_file: required when agents.master_key_file is absent")
    if cfg.agents.address_template and cfg.agents.master_key_file is None:
        problems.append("agents.master_key_file: required with agents.address_template (keys are derived)")
    for h in cfg.agents.unmanaged:
        if h not in hosts:
            problems.append(f"agents.unmanaged: {h!r} is not a host of the topology")
        elif h in cfg.agents.hosts:
            problems.append(f"agents.unmanaged: {h} has an agent in agents.hosts")
    if cfg.tenants and not cfg.agents.address_template:
        for h, where in sorted(taken.items()):
            if h not in cfg.agents.hosts and h not in cfg.agents.unmanaged:
                problems.append(f"{where}.host: host {h} has no agent (add agents.hosts.{h} or "
                                "agents.address_template)")
    if cfg.lrc.enabled and cfg.lrc.mode == "paper":
        for t, tenant in cfg.tenants.items():
            if tenant.wc_subflows:
                problems.append(f"tenants.{t}.wc_subflows: must be 0 with lrc.mode 'paper' (one subflow per "
                                "connection, limited to max(B_i, v_i))")
    if cfg.controller.state_file is not None and cfg.controller.routing not in ("lessor", "hedera"):
        problems.append("controller.state_file: only LESSOR (and Hedera on its machinery) writes a state file")
    return problems


def check(cfg: Config, topo: TopologyDescription, path: Path | None = None, overlay: dict | None = None,
          raw: dict | None = None) -> Loaded:
    """Stage 3: names resolve, then admission control."""
    from controller import admission
    problems = meaning_problems(cfg, topo)
    if problems:
        raise ConfigError(problems)
    from controller import tenancy
    loaded = Loaded(cfg, topo, path, overlay, raw)
    rejected = admission.check(loaded)
    if rejected:
        raise ConfigError([f"admission: {r}" for r in rejected])
    problems = tenancy.deliverable_problems(loaded)
    if problems:
        raise ConfigError(problems)
    return loaded


def apply_overlay(data: dict, overlay: dict | None) -> dict:
    """The operator's mapping with the API's tenants laid over it (None deletes)."""
    if not overlay:
        return data
    tenants = dict(data.get("tenants") or {})
    for name, tenant in (overlay.get("tenants") or {}).items():
        if tenant is None:
            tenants.pop(name, None)
        else:
            tenants[name] = tenant
    return {**data, "tenants": tenants}


def read_overlay(path: Path) -> dict:
    """The API's persisted overlay: ``{}`` when there is none; ConfigError
    naming the file when it cannot be read or is not the overlay's shape."""
    if not os.path.lexists(path):
        return {}
    try:
        raw = read_bounded(path, MAX_CONFIG_BYTES, "API state file")
    except ValueError as exc:
        raise ConfigError([str(exc)]) from None
    data = parse_yaml(raw, str(path))
    if data is None:
        return {}
    if not isinstance(data, dict) or set(data) - {"tenants"} or not isinstance(data.get("tenants", {}), dict):
        raise ConfigError([f"{path}: the API state file holds a mapping 'tenants' only"])
    return data


def state_path(cfg: Config, path: Path | None) -> Path | None:
    """Where the API's overlay of a configuration read from ``path`` lives."""
    if cfg.api is None:
        return None
    state = Path(cfg.api.state_file)
    return state if state.is_absolute() or path is None else path.parent / state


class SetAside:
    """What of a persisted overlay a starting controller could not take,
    by tenant (``None``: the whole file was unreadable), with why."""

    def __init__(self, state: Path, tenants: dict[str, Any] | None, problems: list[str]):
        self.state, self.tenants, self.problems = state, tenants, problems

    def describe(self) -> str:
        what = "the whole file" if self.tenants is None else "tenant(s) " + ", ".join(sorted(self.tenants))
        return f"{self.state}: {what} set aside: " + "; ".join(self.problems)


def read_config_file(path: Path) -> Any:
    try:
        raw = read_bounded(path, MAX_CONFIG_BYTES, "configuration")
    except ValueError as exc:
        raise ConfigError([str(exc)]) from None
    return parse_yaml(raw, str(path))


def load(path: str | Path, overlay: bool = True, salvage: bool = False) -> Loaded:
    """Read, parse and check a configuration file, with the API's state
    file laid over it unless ``overlay`` is False.

    An overlay that no longer fits (the operator's file changed under it,
    or it was damaged) is refused by name -- a reload then changes nothing.
    With ``salvage`` (a controller starting) it is set aside instead, as a
    database refuses a bad log record without losing the rest: the tenants
    that still fit are kept one by one (in name order), the others are
    listed in ``Loaded.set_aside``, and the controller starts on the
    operator's file with what is left (see :func:`set_aside`)."""
    path = Path(path)
    operator = read_config_file(path)
    cfg = parse(operator)
    state = state_path(cfg, path) if overlay else None
    if state is None:
        return check(cfg, _topology(cfg, path.parent), path, None, operator)
    try:
        extra = read_overlay(state)
    except ConfigError as exc:
        if not salvage:
            raise ConfigError([f"{state} (API state): {p}" for p in exc.problems]) from None
        loaded = from_data(operator, path=path)
        loaded.set_aside = SetAside(state, None, exc.problems)
        return loaded
    if not extra:
        return check(cfg, _topology(cfg, path.parent), path, None, operator)
    try:
        return from_data(operator, overlay=extra, path=path)
    except ConfigError as exc:
        if not salvage:
            raise ConfigError([f"{state} (API state): {p}" for p in exc.problems]) from None
        whole = exc.problems
    loaded = from_data(operator, path=path)          # the operator's own file must stand alone
    kept: dict[str, Any] = {}
    refused: dict[str, Any] = {}
    problems: list[str] = []
    for name, entry in sorted(extra["tenants"].items()):
        try:
            loaded = from_data(operator, overlay={"tenants": {**kept, name: entry}}, path=path)
            kept[name] = entry
        except ConfigError as exc:
            refused[name] = entry
            problems.extend(f"tenants.{name}: {p}" for p in exc.problems)
    loaded.set_aside = SetAside(state, refused, problems or whole)
    return loaded


def set_aside(loaded: Loaded, now: float | None = None) -> Path | None:
    """Move what a starting controller could not take out of the API's
    state file (never deleted): the refused part goes to
    ``<state>.rejected-<UTC time>`` with the reasons, the state file keeps
    the rest. Returns the side file (None: nothing was set aside)."""
    import time
    aside = loaded.set_aside
    if aside is None:
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))          # None: now
    side = aside.state.with_name(f"{aside.state.name}.rejected-{stamp}")
    if aside.tenants is None:                        # unreadable: the file itself moves aside
        os.replace(aside.state, side)
    else:
        write_private(side, "# set aside by the controller at start; why:\n" +
                      "".join(f"#   {p}\n" for p in aside.problems), {"tenants": aside.tenants})
        write_private(aside.state, "# written by the bwfabric controller's API; do not edit while it runs\n",
                      loaded.overlay)
    return side


def write_private(path: Path, header: str, data: Any) -> None:
    """Atomically, mode 600: a temporary file fsynced, then renamed over;
    the temporary file is removed if anything fails (OSError raised)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(header)
            yaml.safe_dump(data, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def from_data(data: Any, base: Path | None = None, overlay: dict | None = None, path: Path | None = None) -> Loaded:
    """The same checks on an in-memory mapping (the API's proposed
    configs: the operator's mapping and a new overlay; ``path`` is the file
    it came from, so that a later reload reads it again)."""
    cfg = parse(apply_overlay(data, overlay) if isinstance(data, dict) else data)
    return check(cfg, _topology(cfg, base if base is not None else (path.parent if path else None)), path,
                 overlay, data)


# ---- the configuration apps read ----------------------------------------------------------------
CONFIG_ENV = "BWFABRIC_CONFIG"
TOPOLOGY_ENV = "BWFABRIC_TOPOLOGY"     # shorthand: a topology alone, every setting at its default
_ACTIVE: Loaded | None = None


def set_active(loaded: Loaded | None) -> None:
    """The launcher's configuration (None forgets it)."""
    global _ACTIVE
    _ACTIVE = loaded


def for_topology(path: str | Path, routing: str = "ecmp", prio_queues: bool = False, **sections) -> Loaded:
    """A configuration of a topology file and defaults (``bwfabric
    controller --topology``, and ``BWFABRIC_TOPOLOGY`` under ryu-manager)."""
    data = {"fabric": {"topology": str(Path(path).resolve())},
            "controller": {"routing": routing, "prio_queues": prio_queues}, **sections}
    return from_data(data)


def active() -> Loaded:
    """The configuration in force: the launcher's; or, for apps started
    by ``ryu-manager``, the file ``BWFABRIC_CONFIG`` names (or a topology
    file in ``BWFABRIC_TOPOLOGY`` with every setting at its default)."""
    if _ACTIVE is not None:
        return _ACTIVE
    import os
    if os.environ.get(CONFIG_ENV):
        return load(os.environ[CONFIG_ENV])
    if os.environ.get(TOPOLOGY_ENV):
        return for_topology(os.environ[TOPOLOGY_ENV])
    raise RuntimeError(f"no bwfabric configuration: set {CONFIG_ENV} to a config file "
                       f"(or {TOPOLOGY_ENV} to a topology); bwfabric controller --config FILE does it for you")


# ---- reference --------------------------------------------------------------------------------
def _type_name(annotation: Any) -> str:
    import typing
    if typing.get_origin(annotation) is Literal:
        return " or ".join(json.dumps(a) for a in typing.get_args(annotation))
    text = getattr(annotation, "__name__", None) or str(annotation)
    return text.replace("typing.", "")


def reference_markdown() -> str:
    """``docs/config.md``: every key, its type, default and meaning, from the schema."""
    lines = ["# Configuration reference", "",
             "Generated from `controller/config.py` by `bwfabric config-reference`; do not edit.", "",
             "Every key is optional unless its default says *required*. Unknown keys, NaN and "
             "Infinity are refused.", ""]

    def walk(model: type[BaseModel], prefix: str) -> None:
        rows, nested = [], []
        for name, f in model.model_fields.items():
            ann = f.annotation
            sub = _model_of(ann)
            path = f"{prefix}{name}"
            if f.is_required():
                default = "*required*"
            else:
                d = f.get_default(call_default_factory=True)
                default = "(section)" if isinstance(d, BaseModel) else f"`{json.dumps(d)}`"
            kind = (f"map of name to {sub.__name__}" if _is_dict(ann) else sub.__name__) if sub else _type_name(ann)
            constraints = " ".join(_constraint(m) for m in f.metadata)
            rows.append(f"| `{path}` | {kind} {constraints} | {default} | {f.description} |")   # every key has one
            if sub:
                nested.append((sub, path + ("." if not _is_dict(ann) else ".<name>.")))
        lines.extend([f"## `{prefix.removesuffix('.') or '(top level)'}`", "", "| key | type | default | meaning |",
                      "|---|---|---|---|", *rows, ""])
        for sub, p in nested:
            walk(sub, p)

    walk(Config, "")
    return "\n".join(lines)


# what the reference says of a field's validator function (a new one must be named here: the reference,
# built by the tests, fails until it is)
VALIDATOR_TEXT = {"_ip": "(an IP address)"}


def _constraint(m: Any) -> str:
    """A field's constraint as the reference shows it (validators by what they check)."""
    func = getattr(m, "func", None)
    if func is not None:
        if func.__name__ not in VALIDATOR_TEXT:
            raise ValueError(f"reference: say what validator {func.__name__} checks (config.VALIDATOR_TEXT)")
        return VALIDATOR_TEXT[func.__name__]
    return str(m)


def _is_dict(ann: Any) -> bool:
    import typing
    return typing.get_origin(ann) is dict


def _model_of(ann: Any) -> type[BaseModel] | None:
    import typing
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in typing.get_args(ann):
        m = _model_of(arg)
        if m:
            return m
    return None
