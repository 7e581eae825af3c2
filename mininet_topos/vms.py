"""VMs behind an emulated server's NIC (issue #32 §4), emulation only.

A VM is a named network namespace (``ip netns``) joined to its server (a
Mininet host) by a veth pair: ``eth0`` in the VM, ``vm<N>`` in the server.
The server routes (a routed hypervisor): a /32 route to each of its VMs,
IP forwarding on, and proxy ARP on its NIC (the fabric's ARP for a VM
address, routed to the server by the controller from the server's
``vm_prefix``, is answered by the server) and on each VM's link (the VM's
default route is its link; the server answers its ARP for any address).
Traffic between two VMs of one server goes VM -> server -> VM and never
reaches the NIC.

Everything is created by :func:`create` (the namespace) and :func:`plug`
(its link and routes) and removed by :func:`unplug` by name (deleting a
namespace deletes its end of the veth pair, and so the pair). The
namespaces must exist before Mininet makes its hosts: a Mininet host has a
private mount namespace, a copy of the machine's mounts when it was made,
and ``/run/netns/<name>`` is a mount (made later, the host's agent finds
an empty file there and cannot enter the VM: EINVAL).
"""

from __future__ import annotations

import ipaddress
import re
import secrets
import subprocess
from dataclasses import dataclass

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,30}$")


class VmError(RuntimeError):
    pass


@dataclass(frozen=True)
class VmSpec:
    netns: str          # the VM's namespace name (``ip netns``)
    host: str           # the server (a Mininet host)
    address: str        # its IPv4 address, in the server's vm_prefix

    def __post_init__(self) -> None:
        if not NAME_RE.match(self.netns):
            raise VmError(f"VM namespace {self.netns!r}: letters, digits, _ . -; at most 31")
        ipaddress.IPv4Address(self.address)


def _sh(cmd: list[str], what: str) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise VmError(f"{what}: {' '.join(cmd)}: {(res.stderr or res.stdout).strip()}")


def create(spec: VmSpec) -> None:
    """The VM's namespace (before its server exists: see above)."""
    if subprocess.run(["ip", "netns", "pids", spec.netns], capture_output=True).returncode == 0:
        raise VmError(f"network namespace {spec.netns} exists: another emulation's VM (or a leftover); "
                      f"remove it first (ip netns del {spec.netns})")
    _sh(["ip", "netns", "add", spec.netns], spec.netns)


def plug(server_pid: int, nic: str, spec: VmSpec, index: int, mtu: int) -> str:
    """Link the VM (its namespace made by :func:`create`) to its server (the
    Mininet host with PID ``server_pid`` and NIC ``nic``) and route it
    there. Returns the server-side interface's name."""
    link = f"vm{index}"
    server = ["mnexec", "-a", str(server_pid)]
    try:
        # made in the root namespace under names of its own, then each end moved and renamed (a veth made
        # from inside a Mininet host cannot name a peer namespace: "Peer netns reference is invalid")
        tmp = f"bwv{secrets.token_hex(4)}"
        _sh(["ip", "link", "add", f"{tmp}a", "mtu", str(mtu), "type", "veth", "peer", "name", f"{tmp}b",
             "mtu", str(mtu)], spec.netns)
        try:
            _sh(["ip", "link", "set", f"{tmp}b", "netns", spec.netns, "name", "eth0"], spec.netns)
            _sh(["ip", "link", "set", f"{tmp}a", "netns", str(server_pid), "name", link], spec.netns)
        finally:
            subprocess.run(["ip", "link", "del", f"{tmp}a"], capture_output=True)     # if still here
        # proxy ARP answers after a random delay of up to proxy_delay (0.8 s by default), twice on the way
        # to a VM of another server: the first packets between two VMs were lost (a failed ping, 1 run of 4)
        for cmd in (["sysctl", "-qw", "net.ipv4.ip_forward=1", f"net.ipv4.conf.{nic}.proxy_arp=1",
                     f"net.ipv4.conf.{link}.proxy_arp=1", f"net.ipv4.neigh.{nic}.proxy_delay=0",
                     f"net.ipv4.neigh.{link}.proxy_delay=0"],
                    ["ip", "link", "set", link, "up"],
                    ["ethtool", "-K", link, "tx", "off", "tso", "off", "gso", "off"],
                    ["ip", "route", "replace", f"{spec.address}/32", "dev", link]):
            _sh([*server, *cmd], spec.netns)
        vm = ["ip", "netns", "exec", spec.netns]
        for cmd in (["ip", "link", "set", "lo", "up"], ["ip", "link", "set", "eth0", "up"],
                    ["ethtool", "-K", "eth0", "tx", "off", "tso", "off", "gso", "off"],
                    ["ip", "addr", "add", f"{spec.address}/32", "dev", "eth0"],
                    ["ip", "route", "add", "default", "dev", "eth0"]):
            _sh([*vm, *cmd], spec.netns)
    except VmError:
        unplug(spec)
        raise
    return link


def unplug(spec: VmSpec) -> None:
    """Remove the VM's namespace (and so its link); nothing if it is gone."""
    subprocess.run(["ip", "netns", "del", spec.netns], capture_output=True)


def in_vm(spec: VmSpec, *cmd: str) -> list[str]:
    """``cmd`` run in the VM's namespace."""
    return ["ip", "netns", "exec", spec.netns, *cmd]
