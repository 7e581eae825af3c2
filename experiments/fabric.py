"""Bring a topology description up in Mininet on userspace Open vSwitch, tuned
to be a faithful emulator on this machine (docs/platform.md), and tear down only
what was created.

Tuning, applied after ``net.start()`` on both ends of every link:
- MTU (jumbo 9000 by default) on every interface, and ``mtu_request`` in OVS;
- checksum/segmentation offload off (userspace OVS needs ``tx off`` for TCP;
  ``tso/gso off`` keeps queues counting real packets);
- the HTB leaf replaced by a byte-sized bfifo (Mininet's ``max_queue_size``
  needs netem, absent here, and would silently do nothing);
- receive packet steering (RPS) over every CPU on the hosts' interfaces.
  Userspace OVS forwards in one thread, and a packet it sends to a host is
  received inline, in that thread's system time: the host's whole TCP/MPTCP
  receive path, the ACK-clocked sends it triggers, nftables. At 100 Mb/s on
  the BG/WC testbed that thread sits at 97-100 % of a core (80 % of it system
  time). RPS moves part of the hosts' share to the other CPUs: tcp_v4_rcv
  went from 11 % to 9 % of that thread's profile (perf, fig12 at 100 Mb/s).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import subprocess
import time
from functools import partial
from pathlib import Path

from controller.topology import TopologyDescription
from experiments import ovs

log = logging.getLogger("bwfabric.fabric")

# What every emulated host's network namespace starts with (issue #32 §3):
# the kernel's own defaults, whatever the root namespace has. A new network
# namespace inherits the root's default congestion control and its
# tcp_rmem/tcp_wmem, and machine images change them -- this machine's has
# BBR (a fresh Debian 12: cubic), and Mininet's start sets the root's
# tcp_rmem/wmem to 10240 87380 16777216 (its fixLimits). BBR's RTT
# unfairness took a short-RTT (intra-ToR) flow to 0.85-0.89 Mb/s of its
# 3.3 beside two long-RTT flows into the same host, with 32 % of its bytes
# retransmitted; every unmanaged host's traffic (receivers, best effort,
# web flows) changed with the machine. The host agents set their own
# hosts' values on top of these.
HOST_TCP_DEFAULTS = {
    "net.ipv4.tcp_congestion_control": "cubic",
    "net.ipv4.tcp_rmem": "4096 131072 6291456",
    "net.ipv4.tcp_wmem": "4096 16384 4194304",
    "net.ipv4.tcp_ecn": "2",
}


_SYSCTL_VALUE = re.compile(r"[A-Za-z0-9]+( [A-Za-z0-9]+)*")
ALLOWED_CC = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")


def allow_congestion_control(name: str, path: Path = ALLOWED_CC) -> bool:
    """Add ``name`` to the machine's allowed congestion controls (the kernel
    lets a namespace other than the root default only to an allowed one;
    this machine's image allows "reno bbr", a fresh kernel "reno cubic").
    Adds, never removes. Returns whether it changed anything."""
    allowed = path.read_text().split()
    if name in allowed:
        return False
    path.write_text(" ".join([*allowed, name]))
    return True


def host_tcp_command(values: dict[str, str] | None = None) -> str:
    """Shell command, run in a host's network namespace, that sets its TCP
    defaults (:data:`HOST_TCP_DEFAULTS`)."""
    values = HOST_TCP_DEFAULTS if values is None else values
    return "sysctl -qw " + " ".join(f"'{k}={v}'" for k, v in sorted(values.items()))


def in_use(switches: list[str], sys_net: Path = Path("/sys/class/net")) -> list[str]:
    """Switch-side link interfaces (``<switch>-eth<N>``) present in this
    namespace: a live emulation's (a link's veth pair lives as long as the
    host namespace at its other end), unlike a bare bridge an interrupted run
    left behind."""
    names = sorted(p.name for p in sys_net.iterdir()) if sys_net.exists() else []
    return [n for n in names if any(n.startswith(f"{sw}-eth") for sw in switches)]


class FabricError(RuntimeError):
    pass


def rps_mask(n_cpus: int) -> str:
    """The rps_cpus hex mask of CPUs 0..n-1."""
    if n_cpus < 1:
        raise ValueError(f"rps_mask: n_cpus={n_cpus} must be >= 1")
    return f"{(1 << n_cpus) - 1:x}"


def rps_command(dev: str, n_cpus: int | None = None) -> str:
    """Shell command, run in a host's network namespace, that spreads
    ``dev``'s receive processing over every CPU. /sys shows the namespace it
    was mounted in, so a private mount namespace gets a fresh sysfs."""
    mask = rps_mask(n_cpus or os.cpu_count() or 1)
    return (f"unshare -m sh -c 'umount -l /sys && mount -t sysfs sysfs /sys && "
            f"echo {mask} > /sys/class/net/{dev}/queues/rx-0/rps_cpus'")


class _DropHtbQuantum(logging.Filter):
    """tc warns that HTB's quantum is big at rates >= ~100 Mb/s; Mininet logs
    that as an error. It is harmless for our shaping: drop just that line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "quantum of class" not in record.getMessage()


def _quiet_htb_quantum_warnings() -> None:
    from mininet.log import lg
    if not any(isinstance(f, _DropHtbQuantum) for f in lg.filters):
        lg.addFilter(_DropHtbQuantum())


class VmEndpoint:
    """A VM as traffic's end: ``popen`` runs in its namespace (as a Mininet
    host's ``popen`` runs in the host's)."""

    def __init__(self, spec):
        self.spec, self.name = spec, spec.netns
        self.prefix = ["ip", "netns", "exec", spec.netns]

    def popen(self, cmd: list[str], **kw) -> subprocess.Popen:
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        return subprocess.Popen([*self.prefix, *cmd], **kw)


class Fabric:
    def __init__(self, topo: TopologyDescription, of_port: int = 6653, queues: str | None = None,
                 wc_aqm: bool = True, delays: dict | None = None, vms: tuple = (), ack_first: bool = False,
                 early_drop: bool = False, host_tcp: dict[str, str] | None = None):
        """``queues``: None, or a BG/WC queue back-end for every switch port
        (``tc`` on userspace OVS; see mininet_topos.queues); ``wc_aqm``:
        random early drop of WC packets on those ports (tc back-end);
        ``delays``: {(a, b): mininet_topos.delayline.DelayLine options
        (``delay_us``, ``jitter_us``, ``on_ms``, ``off_ms``, ``off_gap_us``)}
        -- those links go through a delay line (this kernel has no netem);
        ``vms``: :class:`mininet_topos.vms.VmSpec` -- VMs in namespaces of
        their own behind their servers' NICs (their servers need a
        vm_prefix; issue #32 §4); ``ack_first``: every switch port without
        BG/WC classes serves TCP packets without payload first
        (:func:`mininet_topos.queues.ack_first_commands`); ``early_drop``:
        every such port drops (ECN-capable: marks) packets of any class at
        random before its FIFO is full, ACKs never (bwf_aqm with
        ``every_class``; RED's thresholds at 1/3 and 2/3 of the FIFO);
        ``host_tcp``: sysctls every host sets over :data:`HOST_TCP_DEFAULTS`
        (e.g. ``{"net.ipv4.tcp_ecn": "1"}``: every host asks for ECN)."""
        self.topo = topo
        self.vms = tuple(vms)
        for spec in self.vms:
            block = topo.host(spec.host).network()
            if block is None or ipaddress.IPv4Address(spec.address) not in block:
                raise FabricError(f"VM {spec.netns}: {spec.address} is not in host {spec.host}'s vm_prefix "
                                  f"({topo.host(spec.host).vm_prefix})")
        self.delays = dict(delays or {})
        self.delay_lines: dict = {}
        self.of_port = of_port
        self.queues = queues
        self.wc_aqm = wc_aqm
        self.ack_first = ack_first
        self.early_drop = early_drop
        unknown = set(host_tcp or {}) - set(HOST_TCP_DEFAULTS)
        if unknown:
            raise FabricError(f"host_tcp: {', '.join(sorted(unknown))} not among {', '.join(HOST_TCP_DEFAULTS)}")
        for key, value in (host_tcp or {}).items():     # they go into a shell command in every host
            if not isinstance(value, str) or not _SYSCTL_VALUE.fullmatch(value):
                raise FabricError(f"host_tcp: {key} = {value!r}: letters, digits and single spaces only")
        self.host_tcp = {**HOST_TCP_DEFAULTS, **(host_tcp or {})}
        self._aqm_loaded_here = False
        self._backend = None
        self.net = None
        self.warnings: list[str] = []

    # ---- lifecycle -----------------------------------------------------------
    def start(self) -> "Fabric":
        from mininet.link import TCLink
        from mininet.log import setLogLevel
        from mininet.net import Mininet
        from mininet.node import OVSSwitch, RemoteController

        from mininet_topos.topos import DescribedTopo

        setLogLevel("error")
        _quiet_htb_quantum_warnings()
        self.warnings += ovs.ensure_ovs()
        ours = [sw.name for sw in self.topo.switches]
        busy = in_use(ours)
        if busy:
            raise FabricError(f"interfaces {', '.join(busy[:4])} exist: another emulation with these switch names "
                              "is running (or its hosts outlived it); stop it first -- starting over it would "
                              "delete its bridges")
        ovs.delete_bridges(ours)  # stale bridges of ours from an interrupted run (no port left on them)
        from mininet_topos import vms
        made = []
        try:
            for spec in self.vms:           # before the hosts: each copies the machine's mounts when made
                vms.create(spec)
                made.append(spec)
        except vms.VmError:
            for spec in made:
                vms.unplug(spec)
            raise
        try:
            self.net = Mininet(
                topo=DescribedTopo(self.topo, delays=self.delays),
                switch=partial(OVSSwitch, datapath="user", protocols="OpenFlow13", failMode="secure"),
                link=TCLink,
                controller=partial(RemoteController, ip="127.0.0.1", port=self.of_port),
                autoSetMacs=False, autoStaticArp=False, waitConnected=False)
            self.net.start()
            self._tune()
            self._plug_vms()
            if self.queues:
                self._queues()
            self._delay_lines()
        except Exception:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        from mininet_topos import vms
        for spec in self.vms:
            vms.unplug(spec)
        for line in self.delay_lines.values():
            try:
                line.stop()
            except Exception as exc:  # noqa: BLE001 - the fabric comes down whatever a delay line did
                self.warnings.append(f"delay line: {exc}")
        self.delay_lines = {}
        if self.net is not None:
            try:
                self.net.stop()
            finally:
                self.net = None
                ovs.delete_bridges([sw.name for sw in self.topo.switches])
                if self._backend is not None:
                    self._backend.close()
                    self._backend = None
                if self._aqm_loaded_here:
                    from mininet_topos.queues import aqm
                    aqm.unload()
                    self._aqm_loaded_here = False

    def __enter__(self) -> "Fabric":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- tuning --------------------------------------------------------------
    def _tune(self) -> None:
        mtu = self.topo.mtu
        queue, rate = {}, {}
        for lk in self.topo.links:
            queue[(lk.a, lk.a_port)] = queue[(lk.b, lk.b_port)] = lk.queue_bytes
            rate[(lk.a, lk.a_port)] = rate[(lk.b, lk.b_port)] = lk.capacity_mbps * 1e6
        switches = {sw.name for sw in self.topo.switches}
        delay_nodes = set(self.net.topo.delay_nodes.values())
        early: list[tuple[str, float, int]] = []
        for link in self.net.links:
            for intf in (link.intf1, link.intf2):
                node = intf.node
                port = node.ports[intf]
                cmds = [f"ip link set dev {intf.name} mtu {mtu}",
                        f"ethtool -K {intf.name} tx off tso off gso off"]
                if node.name in delay_nodes:        # the delay line moves frames as they come: no GRO
                    cmds.append(f"ethtool -K {intf.name} gro off")
                qbytes = queue.get((node.name, port))
                if qbytes:
                    cmds.append(f"tc qdisc replace dev {intf.name} parent 5:1 handle 10: "
                                f"bfifo limit {qbytes}")
                if self.ack_first and qbytes and node.name in switches and not self.queues:
                    from mininet_topos.queues import ack_first_commands
                    cmds += [f"tc {c}" for c in ack_first_commands(intf.name, rate[(node.name, port)], qbytes)]
                if self.early_drop and qbytes and node.name in switches and not self.queues:
                    early.append((intf.name, rate[(node.name, port)], qbytes))
                if node.name not in switches:
                    cmds.append(rps_command(intf.name))
                out = node.cmd(" ; ".join(f"{c} >/dev/null 2>&1 || echo FAILED: {c}" for c in cmds))
                if "FAILED" in out:
                    raise FabricError(f"tuning {intf.name}: {out.strip()}")
                if node.name in switches:
                    subprocess.run(["ovs-vsctl", "set", "interface", intf.name,
                                    f"mtu_request={mtu}"], check=True, capture_output=True)
        if early:
            from mininet_topos.queues import aqm
            self._aqm_loaded_here = aqm.load()      # idempotent; replaces a classifier of an older build
            for dev, rate_bps, qbytes in early:
                aqm.attach(dev, rate_bps, aqm.AqmParams.for_queue(qbytes, every_class=True))
        if allow_congestion_control(HOST_TCP_DEFAULTS["net.ipv4.tcp_congestion_control"]):
            self.warnings.append("added cubic to net.ipv4.tcp_allowed_congestion_control (the hosts' default)")
        for host in self.net.hosts:
            if host.name not in delay_nodes:
                cmd = host_tcp_command(self.host_tcp)
                out = host.cmd(f"{cmd} >/dev/null 2>&1 || echo FAILED")
                if "FAILED" in out:
                    raise FabricError(f"{host.name}: could not set its TCP defaults ({cmd})")

    def _plug_vms(self) -> None:
        """Each VM's namespace, link and routes at its server; its TCP
        defaults as every host's."""
        from mininet_topos import vms
        count: dict[str, int] = {}
        for spec in self.vms:
            index = count[spec.host] = count.get(spec.host, -1) + 1
            vms.plug(self.host(spec.host).pid, f"{spec.host}-eth0", spec, index, self.topo.mtu)
            res = subprocess.run(["ip", "netns", "exec", spec.netns, "sh", "-c",
                                  host_tcp_command(self.host_tcp)],
                                 capture_output=True, text=True)
            if res.returncode != 0:
                raise FabricError(f"VM {spec.netns}: could not set its TCP defaults: {res.stderr.strip()}")

    def vm(self, netns: str):
        """A VM's spec by its namespace name."""
        return next(s for s in self.vms if s.netns == netns)

    def endpoint(self, name: str):
        """Where traffic starts and ends, by name: a host (the Mininet node)
        or a VM (by its namespace name) -- both with ``popen``."""
        for spec in self.vms:
            if spec.netns == name:
                return VmEndpoint(spec)
        return self.host(name)

    def server_of(self, name: str) -> str:
        """The host a VM runs on (a host: itself)."""
        for spec in self.vms:
            if spec.netns == name:
                return spec.host
        return name

    def ip(self, name: str) -> str:
        """A host's or a VM's address."""
        for spec in self.vms:
            if spec.netns == name:
                return spec.address
        return self.topo.host(name).ip

    def _delay_lines(self) -> None:
        """A delay line in each delay node, between its two interfaces."""
        from mininet_topos.delayline import DelayLine
        for key, name in self.net.topo.delay_nodes.items():
            node = self.net.get(name)
            self.delay_lines[key] = DelayLine(f"{name}-eth1", f"{name}-eth2", mtu=self.topo.mtu,
                                              prefix=("mnexec", "-a", str(node.pid)), **self.delays[key]).start()

    def _queues(self) -> None:
        from mininet_topos.queues import PortQueues, backend
        be = self._backend = backend(self.queues, self.wc_aqm)
        spec = {}
        for lk in self.topo.links:
            spec[(lk.a, lk.a_port)] = spec[(lk.b, lk.b_port)] = lk
        switches = {sw.name for sw in self.topo.switches}
        for link in self.net.links:
            for intf in (link.intf1, link.intf2):
                node = intf.node
                if node.name not in switches:
                    continue
                lk = spec[(node.name, node.ports[intf])]
                be.apply(PortQueues.of(intf.name, lk.capacity_mbps * 1e6, lk.queue_bytes or 225000))

    def clear_forwarding(self) -> None:
        """Remove every flow and group from our switches (between two
        controller runs on the same fabric, so the next app starts clean)."""
        for sw in self.topo.switches:
            for what in ("del-flows", "del-groups"):
                subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", what, sw.name],
                               check=True, capture_output=True)

    # ---- readiness -------------------------------------------------------------
    def host(self, name: str):
        return self.net.get(name)

    def _prefix(self, name: str) -> list[str]:
        end = self.endpoint(name)
        return end.prefix if isinstance(end, VmEndpoint) else ["mnexec", "-a", str(end.pid)]

    def popen_in(self, name: str, cmd: list[str], **kw) -> subprocess.Popen:
        """:meth:`run_in`'s command, started and left running."""
        return subprocess.Popen([*self._prefix(name), *cmd], **kw)

    def run_in(self, name: str, *cmd: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        """A command in host ``name``'s namespaces (``mnexec -a``: unlike
        ``host.cmd`` it does not go through the host's one shell, so threads
        may use it at once), or in VM ``name``'s."""
        return subprocess.run([*self._prefix(name), *cmd], input=stdin, capture_output=True, text=True)

    def wait_routes(self, timeout: float = 60.0, table: int = 1) -> None:
        """Until every switch is connected and has a forwarding entry (IP and
        ARP) for every host."""
        want = 2 * len(self.topo.hosts)
        deadline = time.monotonic() + timeout
        pending = [sw.name for sw in self.topo.switches]
        while pending:
            pending = [sw for sw in pending
                       if not ovs.controller_connected(sw) or len(ovs.dump_flows(sw, table)) < want]
            if not pending:
                return
            if time.monotonic() > deadline:
                raise FabricError(f"switches {', '.join(pending)} got no routes within {timeout:.0f}s "
                                  "(is the controller running on port "
                                  f"{self.of_port}?)")
            time.sleep(0.5)

    def ping_pairs(self, pairs: list[tuple[str, str]], count: int = 1, timeout_s: int = 2) -> list[tuple[str, str]]:
        """Returns the pairs that failed to ping."""
        failed = []
        for a, b in pairs:
            ip = self.topo.host(b).ip
            out = self.host(a).cmd(f"ping -c {count} -W {timeout_s} {ip}")
            if f"{count} received" not in out:
                failed.append((a, b))
        return failed

    def ping_all(self) -> list[tuple[str, str]]:
        names = [h.name for h in self.topo.hosts]
        return self.ping_pairs([(a, b) for a in names for b in names if a != b])
