"""Open vSwitch on this machine: start it, and make its userspace datapath
able to carry a fabric.

All userspace sends go through one AF_PACKET socket created at ovs-vswitchd's
first forwarded packet with ``net.core.wmem_default`` as its send buffer
(212992 bytes by default: ~90 packets for the whole fabric, past which OVS
drops silently). We set a large default before OVS starts, and check the live
socket's buffer (``ss -0 -m``) so a run never silently uses a small one.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

OVS_CTL = "/usr/share/openvswitch/scripts/ovs-ctl"
WMEM_SYSCTL = "/proc/sys/net/core/wmem_default"
WANT_WMEM = 33554432
# Each port's receive socket takes net.core.rmem_default when the port is
# added: 212992 bytes is ~90 packets, and at 100 Mb/s on the BG/WC testbed
# (ovs-vswitchd's thread near a whole core) the slow-start bursts of a run's
# first seconds overflowed it -- 125-204 drops per run, of every class, so BG
# lost packets no priority queue had seen. 2 MiB (~900 packets) absorbs them.
RMEM_SYSCTL = "/proc/sys/net/core/rmem_default"
WANT_RMEM = 2097152
# The most a socket may ask for (SO_SNDBUF / SO_RCVBUF; global, the root
# namespace's): bwf_sockops sizes WC subflows' send buffers to their window,
# past the kernel's 212992 at the BG/WC testbed's rates, and the kernel caps
# them silently -- the WC shares of Table 3 then lean towards equal. A
# fresh kernel has 212992; Mininet's start raises them to 16 MiB (its
# fixLimits, with tcp_rmem/wmem and netdev_max_backlog), but only when a
# Mininet object is made: set here, every emulation has them. And the
# per-CPU backlog every veth frame passes (netdev_max_backlog): 5000, as
# Mininet's, for the fabric's bursts.
SOCKET_MAX_SYSCTLS = {"/proc/sys/net/core/wmem_max": 16777216, "/proc/sys/net/core/rmem_max": 16777216,
                      "/proc/sys/net/core/netdev_max_backlog": 5000}


class OvsError(RuntimeError):
    pass


def _run(cmd: list[str], check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=timeout)


def ovs_running() -> bool:
    if shutil.which("ovs-vsctl") is None:
        return False
    return _run(["ovs-vsctl", "--timeout=3", "show"], check=False).returncode == 0 and \
        _run(["pidof", "ovs-vswitchd"], check=False).returncode == 0


def vswitchd_pid() -> int | None:
    out = _run(["pidof", "ovs-vswitchd"], check=False).stdout.split()
    return int(out[0]) if out else None


def _ss_packet() -> str:
    return _run(["ss", "-0", "-m", "-p", "-a"], check=False).stdout


def packet_sockets(ss_text: str, pid: int) -> list[dict]:
    """Process ``pid``'s packet sockets in ``ss -0 -m -p -a`` output: the
    port each is bound to (None: any, OVS's one send socket) and its skmem
    fields (r, rb, t, tb, ..., d), which may be on the line after its users."""
    out = []
    lines = ss_text.splitlines()
    for i, line in enumerate(lines):
        if f"pid={pid}," not in line:
            continue
        text = line if "skmem:" in line else line + (lines[i + 1] if i + 1 < len(lines) else "")
        skmem = re.search(r"skmem:\(([^)]*)\)", text)
        port = re.search(r"\s\*:(\S+)\s", line)
        out.append({"port": port.group(1) if port else None,
                    "skmem": {k: int(v) for k, v in re.findall(r"([a-z]+)(\d+)", skmem.group(1))} if skmem else {}})
    return out


def packet_socket_sndbuf(pid: int) -> int | None:
    """Send buffer (bytes) of ovs-vswitchd's raw packet socket, None before
    its first forwarded packet."""
    bufs = [s["skmem"]["tb"] for s in packet_sockets(_ss_packet(), pid) if "tb" in s["skmem"]]
    return max(bufs) if bufs else None


def port_socket_rcvbufs(pid: int | None = None) -> list[int]:
    """Receive buffers (bytes) of ovs-vswitchd's per-port packet sockets."""
    pid = pid or vswitchd_pid()
    if pid is None:
        return []
    return [s["skmem"]["rb"] for s in packet_sockets(_ss_packet(), pid) if s["port"] and "rb" in s["skmem"]]


def parse_socket_drops(ss_text: str, pid: int) -> int:
    """Packets dropped on arrival (``skmem``'s ``d``) summed over process
    ``pid``'s sockets in ``ss -0 -m -p -a`` output."""
    return sum(s["skmem"].get("d", 0) for s in packet_sockets(ss_text, pid))


def packet_socket_drops(pid: int | None = None) -> int | None:
    """Packets ovs-vswitchd's AF_PACKET sockets dropped because it did not
    read them in time (a port's receive buffer was full): losses no queue of
    the emulated network accounts for. None if OVS is not running."""
    pid = pid or vswitchd_pid()
    if pid is None:
        return None
    return parse_socket_drops(_ss_packet(), pid)


def raise_default(sysctl: str, want: int) -> None:
    """Raise a socket-buffer default (a /proc/sys path) to at least ``want``."""
    if int(Path(sysctl).read_text()) < want:
        Path(sysctl).write_text(str(want))


def ensure_ovs() -> list[str]:
    """Start OVS if needed; returns warnings about its fitness for emulation."""
    warnings = []
    if shutil.which("ovs-vsctl") is None:
        raise OvsError("Open vSwitch is not installed: apt-get install openvswitch-switch")
    raise_default(WMEM_SYSCTL, WANT_WMEM)
    # read when a port is added (not when OVS starts): every fabric built after this has it
    raise_default(RMEM_SYSCTL, WANT_RMEM)
    for path, want in SOCKET_MAX_SYSCTLS.items():
        raise_default(path, want)
    if not ovs_running():
        res = _run([OVS_CTL, "start", "--system-id=random"], check=False, timeout=60)
        if not ovs_running():
            raise OvsError(f"could not start Open vSwitch: {res.stdout}{res.stderr}")
    pid = vswitchd_pid()
    buf = packet_socket_sndbuf(pid) if pid else None
    if buf is not None and buf < WANT_WMEM:
        bridges = _run(["ovs-vsctl", "list-br"]).stdout.split()
        if not bridges:
            _run([OVS_CTL, "restart", "--system-id=random"], check=False, timeout=60)
        else:
            warnings.append(
                f"ovs-vswitchd's packet socket has a {buf}-byte send buffer (wanted {WANT_WMEM}); "
                f"OVS will drop silently under load. Stop the bridges {' '.join(bridges)} and "
                "restart OVS with net.core.wmem_default raised.")
    return warnings


def delete_bridges(names: list[str]) -> None:
    existing = set(_run(["ovs-vsctl", "list-br"], check=False).stdout.split())
    for name in names:
        if name in existing:
            _run(["ovs-vsctl", "--if-exists", "del-br", name], check=False)


def dump_flows(bridge: str, table: int | None = None) -> list[str]:
    cmd = ["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", bridge]
    if table is not None:
        cmd.append(f"table={table}")
    out = _run(cmd, check=False).stdout
    return [ln.strip() for ln in out.splitlines() if "priority" in ln]


def controller_connected(bridge: str) -> bool:
    res = _run(["ovs-vsctl", "--timeout=3", "get", "bridge", bridge, "controller"], check=False)
    uuids = re.findall(r"[0-9a-f-]{36}", res.stdout)
    for uuid in uuids:
        st = _run(["ovs-vsctl", "--timeout=3", "get", "controller", uuid, "is_connected"], check=False)
        if st.stdout.strip() == "true":
            return True
    return False


_METER = re.compile(r"meter:(\d+) .*?byte_in_count:(\d+).*?bands:\s*0: packet_count:(\d+) byte_count:(\d+)", re.S)


def parse_meter_stats(text: str) -> dict[int, dict[str, int]]:
    """``ovs-ofctl -O OpenFlow13 meter-stats`` -> {meter id: bytes in, and
    packets and bytes its (drop) band took}."""
    out = {}
    for chunk in re.split(r"(?=meter:\d+ )", text):
        m = _METER.search(chunk)
        if m:
            out[int(m.group(1))] = {"bytes_in": int(m.group(2)), "dropped_packets": int(m.group(3)),
                                    "dropped_bytes": int(m.group(4))}
    return out


def meter_stats(bridge: str) -> dict[int, dict[str, int]]:
    return parse_meter_stats(_run(["ovs-ofctl", "-O", "OpenFlow13", "meter-stats", bridge], check=False).stdout)
