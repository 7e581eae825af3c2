"""Serialisable topology description: what the controller knows of the fabric.

A description lists switches (name, datapath id, role, pod), hosts (name, IP,
MAC, and for a server of several VMs its ``vm_prefix``, the block their
addresses come from) and links (both ends with their port numbers,
capacity, queue size).
Mininet topologies write one (`mininet_topos`), the controller reads one, and
`bwfabric check-config` validates one without starting anything.

Validation collects every problem and names the offending entry, e.g.
``links[3] (h1:0 -- s9:2): unknown node 's9'``.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bwcommon.validate import finite_number, read_bounded, strict_json

MAX_FILE_BYTES = 64 << 20
ROLES = ("edge", "aggregation", "core")
# Layer of a role counted from the hosts up; used to spread single paths.
ROLE_LAYER = {"edge": 0, "aggregation": 1, "core": 2}
# Interface names are "<node>-eth<port>" and Linux limits them to 15 chars.
_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,8}")
MAX_CAPACITY_MBPS = 10_000_000   # 10 Tb/s: anything above is a typo (or Infinity)


def host_address_problem(ip: Any) -> str | None:
    """Why ``ip`` cannot be a host's unicast IPv4 address, or None."""
    try:
        addr = ipaddress.IPv4Address(ip)
    except (ValueError, TypeError):
        return "is not an IPv4 address"
    if addr.is_multicast:
        return "is a multicast address"
    if addr.is_unspecified or addr == ipaddress.IPv4Address("255.255.255.255"):
        return "is not a host address (unspecified or broadcast)"
    if addr.is_loopback or addr.is_reserved or addr.is_link_local:
        return "is a loopback, reserved or link-local address"
    return None
_MAC_RE = re.compile(r"^([0-9a-f]{2}:){5}[0-9a-f]{2}$")


class TopologyError(ValueError):
    """A topology description is invalid; ``problems`` lists every issue."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("invalid topology description:\n  " + "\n  ".join(self.problems))


@dataclass(frozen=True)
class Switch:
    name: str
    dpid: int
    role: str
    pod: int | None = None


@dataclass(frozen=True)
class Host:
    """A server. ``vm_prefix`` (CIDR) is the block its VMs' own addresses
    come from, when it carries VMs in namespaces of their own behind its
    NIC: the fabric routes the block to the host's port, as it routes the
    host's own address (a routed hypervisor)."""
    name: str
    ip: str
    mac: str
    vm_prefix: str | None = None

    def network(self) -> ipaddress.IPv4Network | None:
        return None if self.vm_prefix is None else ipaddress.IPv4Network(self.vm_prefix)


@dataclass(frozen=True)
class Link:
    """A full-duplex link. Host ports are interface indices (0 = eth0);
    switch ports are OpenFlow port numbers (>= 1)."""

    a: str
    a_port: int
    b: str
    b_port: int
    capacity_mbps: float
    queue_bytes: int | None = None

    def label(self) -> str:
        return f"{self.a}:{self.a_port} -- {self.b}:{self.b_port}"


@dataclass
class TopologyDescription:
    name: str
    switches: list[Switch]
    hosts: list[Host]
    links: list[Link]
    mtu: int = 1500
    params: dict[str, Any] = field(default_factory=dict)

    # ---- serialisation -------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "mtu": self.mtu,
            "params": dict(self.params),
            "switches": [asdict(s) for s in self.switches],
            "hosts": [{k: v for k, v in asdict(h).items() if v is not None or k != "vm_prefix"} for h in self.hosts],
            "links": [asdict(lk) for lk in self.links],
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def from_dict(cls, data: Any) -> "TopologyDescription":
        """Build and validate; raises TopologyError naming every bad entry."""
        problems: list[str] = []
        if not isinstance(data, dict):
            raise TopologyError(["the description must be a JSON object"])
        _check_keys("topology", data, required={"name", "switches", "hosts", "links"},
                    optional={"mtu", "params"}, problems=problems)
        switches = _parse_list(data, "switches", Switch, _SWITCH_TYPES, problems)
        hosts = _parse_list(data, "hosts", Host, _HOST_TYPES, problems)
        links = _parse_list(data, "links", Link, _LINK_TYPES, problems)
        mtu = data.get("mtu", 1500)
        params = data.get("params", {})
        if not isinstance(params, dict):
            problems.append("params: must be an object")
            params = {}
        if problems:
            raise TopologyError(problems)
        topo = cls(name=str(data["name"]), switches=switches, hosts=hosts,
                   links=links, mtu=mtu, params=params)
        topo.validate()
        return topo

    @classmethod
    def load(cls, path: str | Path) -> "TopologyDescription":
        """Read and validate a file: unreadable, non-UTF-8, non-JSON,
        NaN/Infinity and absurdly nested files are TopologyErrors too."""
        try:
            raw = read_bounded(path, MAX_FILE_BYTES, "topology")
            data = strict_json(raw, str(path))
        except ValueError as exc:
            raise TopologyError([str(exc)]) from None
        return cls.from_dict(data)

    # ---- validation ----------------------------------------------------
    def validate(self) -> None:
        problems: list[str] = []
        if not isinstance(self.mtu, int) or isinstance(self.mtu, bool) or not 576 <= self.mtu <= 9216:
            problems.append(f"mtu: {self.mtu!r} must be an integer in 576..9216")
        if not self.switches:
            problems.append("switches: a fabric needs at least one switch")
        if not self.hosts:
            problems.append("hosts: a fabric needs at least one host")
        nodes: dict[str, str] = {}
        dpids: dict[int, str] = {}
        for i, sw in enumerate(self.switches):
            where = f"switches[{i}] ({sw.name})"
            self._check_name(where, sw.name, nodes, problems)
            nodes.setdefault(sw.name, "switch")
            if sw.role not in ROLES:
                problems.append(f"{where}: role {sw.role!r} is not one of {', '.join(ROLES)}")
            if not 0 < sw.dpid < 2**64:
                problems.append(f"{where}: dpid {sw.dpid} must be in 1..2^64-1")
            elif sw.dpid in dpids:
                problems.append(f"{where}: duplicate dpid {sw.dpid} (also {dpids[sw.dpid]})")
            else:
                dpids[sw.dpid] = sw.name
        ips: dict[str, str] = {}
        macs: dict[str, str] = {}
        for i, h in enumerate(self.hosts):
            where = f"hosts[{i}] ({h.name})"
            self._check_name(where, h.name, nodes, problems)
            nodes.setdefault(h.name, "host")
            problem = host_address_problem(h.ip)
            if problem:
                problems.append(f"{where}: ip {h.ip!r} {problem}")
            if h.ip in ips:
                problems.append(f"{where}: duplicate ip {h.ip} (also {ips[h.ip]})")
            ips.setdefault(h.ip, h.name)
            if not _MAC_RE.match(h.mac):
                problems.append(f"{where}: mac {h.mac!r} is not a lower-case aa:bb:cc:dd:ee:ff address")
            elif h.mac in macs:
                problems.append(f"{where}: duplicate mac {h.mac} (also {macs[h.mac]})")
            macs.setdefault(h.mac, h.name)
        self._check_prefixes(problems)
        ports: dict[tuple[str, int], str] = {}
        linked: set[str] = set()
        for i, lk in enumerate(self.links):
            where = f"links[{i}] ({lk.label()})"
            if not finite_number(lk.capacity_mbps) or not 0 < lk.capacity_mbps <= MAX_CAPACITY_MBPS:
                problems.append(f"{where}: capacity_mbps {lk.capacity_mbps} must be a finite number in "
                                f"(0, {MAX_CAPACITY_MBPS}]")
            if lk.queue_bytes is not None and not 0 < lk.queue_bytes < 2**32:
                problems.append(f"{where}: queue_bytes {lk.queue_bytes} must be in 1..2^32-1")
            if lk.a == lk.b:
                problems.append(f"{where}: a link cannot connect {lk.a} to itself")
            for end, port in ((lk.a, lk.a_port), (lk.b, lk.b_port)):
                kind = nodes.get(end)
                if kind is None:
                    problems.append(f"{where}: unknown node {end!r}")
                    continue
                linked.add(end)
                low = 0 if kind == "host" else 1
                if not low <= port <= (99 if kind == "host" else 0xFFFFFF00):
                    problems.append(f"{where}: port {port} of {kind} {end} must be >= {low}")
                if (end, port) in ports:
                    problems.append(f"{where}: duplicate port {end}:{port} (also {ports[(end, port)]})")
                ports.setdefault((end, port), f"links[{i}]")
            if nodes.get(lk.a) == "host" and nodes.get(lk.b) == "host":
                problems.append(f"{where}: hosts must connect to switches, not to each other")
        for h in self.hosts:
            if h.name not in linked:
                problems.append(f"host {h.name}: has no link")
        if not problems:
            problems.extend(self._connectivity_problems())
        if problems:
            raise TopologyError(problems)

    @staticmethod
    def _check_name(where: str, name: str, nodes: dict[str, str], problems: list[str]) -> None:
        if not _NAME_RE.fullmatch(name):  # fullmatch: "$" alone would let a trailing newline in
            problems.append(f"{where}: name must be a letter then up to 8 letters, digits or '_' "
                            f"(it becomes part of interface names)")
        if name in nodes:
            problems.append(f"{where}: duplicate node name {name!r}")

    def _connectivity_problems(self) -> list[str]:
        adj: dict[str, set[str]] = {}
        for lk in self.links:
            adj.setdefault(lk.a, set()).add(lk.b)
            adj.setdefault(lk.b, set()).add(lk.a)
        if not self.hosts:
            return []
        hosts = {h.name for h in self.hosts}
        start = self.hosts[0].name
        seen = {start}
        stack = [start]
        while stack:
            node = stack.pop()
            for nxt in adj.get(node, ()):
                # hosts never forward: do not walk through them
                if nxt not in seen:
                    seen.add(nxt)
                    if nxt not in hosts:
                        stack.append(nxt)
        missing = sorted(hosts - seen)
        if missing:
            return [f"hosts {', '.join(missing)}: not reachable from {start} through switches"]
        return []

    # ---- convenience ---------------------------------------------------
    def _check_prefixes(self, problems: list[str]) -> None:
        """VM blocks: IPv4 networks (/8 to /32) of no other host's, holding
        no host's own address."""
        nets: list[tuple[ipaddress.IPv4Network, str]] = []
        for i, h in enumerate(self.hosts):
            if h.vm_prefix is None:
                continue
            where = f"hosts[{i}] ({h.name})"
            try:
                net = ipaddress.IPv4Network(h.vm_prefix, strict=True)
            except ValueError as exc:
                problems.append(f"{where}: vm_prefix {h.vm_prefix!r} is not an IPv4 network ({exc})")
                continue
            if not 8 <= net.prefixlen <= 32:
                problems.append(f"{where}: vm_prefix {net} must be /8 to /32")
                continue
            for other in self.hosts:
                if host_address_problem(other.ip) is None and ipaddress.IPv4Address(other.ip) in net:
                    problems.append(f"{where}: vm_prefix {net} holds host {other.name}'s address {other.ip}")
            for seen, owner in nets:
                if net.overlaps(seen):
                    problems.append(f"{where}: vm_prefix {net} overlaps {owner}'s {seen}")
            nets.append((net, h.name))

    def host_of_address(self, ip: str) -> str | None:
        """The host an address lives at: its own, or in its VM block."""
        for h in self.hosts:
            if h.ip == ip:
                return h.name
        try:
            addr = ipaddress.IPv4Address(ip)
        except ValueError:
            return None
        for h in self.hosts:
            if h.vm_prefix is not None and addr in ipaddress.IPv4Network(h.vm_prefix):
                return h.name
        return None

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)


_SWITCH_TYPES = {"name": str, "dpid": int, "role": str, "pod": (int, type(None))}
_HOST_TYPES = {"name": str, "ip": str, "mac": str, "vm_prefix": (str, type(None))}
_LINK_TYPES = {"a": str, "a_port": int, "b": str, "b_port": int,
               "capacity_mbps": (int, float), "queue_bytes": (int, type(None))}
_OPTIONAL = {"pod", "queue_bytes", "vm_prefix"}


def _check_keys(where: str, item: dict, required: set[str], optional: set[str],
                problems: list[str]) -> bool:
    ok = True
    for key in sorted(set(item) - required - optional):
        problems.append(f"{where}: unknown key {key!r}")
        ok = False
    for key in sorted(required - set(item)):
        problems.append(f"{where}: missing key {key!r}")
        ok = False
    return ok


def _parse_list(data: dict, key: str, cls: type, types: dict[str, Any],
                problems: list[str]) -> list:
    items = data.get(key, [])
    if not isinstance(items, list):
        problems.append(f"{key}: must be a list")
        return []
    out = []
    required = set(types) - _OPTIONAL
    for i, item in enumerate(items):
        where = f"{key}[{i}]"
        if isinstance(item, dict) and "name" in item:
            where += f" ({item['name']})"
        if not isinstance(item, dict):
            problems.append(f"{where}: must be an object")
            continue
        if not _check_keys(where, item, required, set(types) & _OPTIONAL, problems):
            continue
        bad = False
        for k, v in item.items():
            if isinstance(v, bool) or not isinstance(v, types[k]):
                problems.append(f"{where}: {k} has the wrong type ({type(v).__name__})")
                bad = True
        if not bad:
            out.append(cls(**item))
    return out
