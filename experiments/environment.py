"""What a result was measured on (issue #32 §3): the machine, every network
namespace's TCP/MPTCP settings, the loaded BPF programs and maps, Open
vSwitch's settings and the machine's load -- so that two machines' runs of
one figure can be compared and what one has and the other lacks found
(``bwfabric experiment`` writes it beside every result as
``environment.json``; :func:`differences` compares two).

Read-only: it runs ``sysctl``, ``bpftool``, ``ovs-vsctl`` and ``nsenter``
and changes nothing. A tool that is missing or fails leaves its part
``None`` with the reason.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import threading
import time
from pathlib import Path

# the settings a figure of TCP, MPTCP, BG/WC or the emulator's forwarding can depend on
NETNS_SYSCTLS = (
    "net.ipv4.tcp_congestion_control", "net.ipv4.tcp_allowed_congestion_control", "net.ipv4.tcp_ecn",
    "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem", "net.ipv4.tcp_limit_output_bytes", "net.ipv4.tcp_notsent_lowat",
    "net.ipv4.tcp_no_metrics_save", "net.ipv4.tcp_slow_start_after_idle", "net.ipv4.tcp_mtu_probing",
    "net.ipv4.tcp_rto_min_us", "net.mptcp.enabled", "net.mptcp.stale_loss_cnt", "net.mptcp.scheduler",
    "net.mptcp.pm_type", "net.netfilter.nf_conntrack_acct",
)
MACHINE_SYSCTLS = (
    "net.core.wmem_default", "net.core.wmem_max", "net.core.rmem_default", "net.core.rmem_max",
    "net.core.default_qdisc", "net.core.netdev_max_backlog", "net.ipv4.tcp_available_congestion_control",
    "net.mptcp.available_schedulers", "kernel.sched_rr_timeslice_ms",
)


def _run(*cmd: str, timeout: float = 10.0) -> tuple[str | None, str | None]:
    """(stdout, None) or (None, why)."""
    if shutil.which(cmd[0]) is None:
        return None, f"{cmd[0]}: not installed"
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{cmd[0]}: {exc}"
    if res.returncode != 0:
        return None, f"{' '.join(cmd[:3])}: exit {res.returncode}: {res.stderr.strip()[:200]}"
    return res.stdout, None


def _sysctls(keys, prefix: tuple[str, ...] = ()) -> dict[str, str | None]:
    """Each key's value (None: absent here); one process for all of them."""
    out, _ = _run(*prefix, "sysctl", "-e", *keys)
    values = {}
    for line in (out or "").splitlines():
        k, sep, v = line.partition(" = ")
        if sep:
            values[k.strip()] = " ".join(v.split())
    return {k: values.get(k) for k in keys}


def namespaces() -> dict[str, int]:
    """Every network namespace some process is in: its inode -> one PID in
    it (named ``ip netns`` namespaces and Mininet's hosts alike)."""
    seen: dict[str, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ns = os.readlink(d / "ns" / "net")
        except OSError:
            continue
        seen.setdefault(ns, int(d.name))
    return seen


def stable_names(inodes, me: str, named: dict[str, str], mininet: dict[str, str]) -> dict[str, str]:
    """A name per namespace that two runs share (inodes never repeat):
    ``root``, ``netns:<name>`` (``ip netns``), ``mininet:<host>`` (a
    Mininet host's shell), else its inode. A name two namespaces would share
    keeps the inode after it."""
    want = {ns: "root" if ns == me else named.get(ns) or mininet.get(ns) or ns for ns in inodes}
    counts: dict[str, int] = {}
    for name in want.values():
        counts[name] = counts.get(name, 0) + 1
    return {ns: name if counts[name] == 1 else f"{name} {ns}" for ns, name in want.items()}


def _namespace_labels() -> tuple[dict[str, str], dict[str, str]]:
    """(inode -> ``netns:<name>`` of /run/netns, inode -> ``mininet:<host>``
    of every Mininet host shell)."""
    named, mininet = {}, {}
    run = Path("/run/netns")
    for f in sorted(run.iterdir()) if run.is_dir() else []:
        try:
            named[f"net:[{os.stat(f).st_ino}]"] = f"netns:{f.name}"
        except OSError:
            pass
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            words = (d / "cmdline").read_bytes().split(b"\0")
            host = next((w.decode()[len("mininet:"):] for w in words if w.startswith(b"mininet:")), None)
            if host:
                mininet.setdefault(os.readlink(d / "ns" / "net"), f"mininet:{host}")
        except (OSError, UnicodeDecodeError):
            continue
    return named, mininet


def _netns_settings() -> dict:
    """Each namespace's settings, keyed by :func:`stable_names`."""
    me = os.readlink("/proc/self/ns/net")
    found = namespaces()
    names = stable_names(found, me, *_namespace_labels())
    out = {}
    for ns, pid in sorted(found.items()):
        prefix = () if ns == me else ("nsenter", "-t", str(pid), "-n")
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            comm = "?"
        out[names[ns]] = {"inode": ns, "pid": pid, "process": comm, "root": ns == me,
                          **_sysctls(NETNS_SYSCTLS, prefix)}
    return out


def _bpf() -> dict:
    progs, why = _run("bpftool", "-j", "prog", "show")
    maps, why_maps = _run("bpftool", "-j", "map", "show")
    ops, _ = _run("bpftool", "-j", "struct_ops", "show")
    try:
        return {"programs": sorted({(p.get("type"), p.get("name")) for p in json.loads(progs or "[]")}),
                "maps": sorted({(m.get("type"), m.get("name")) for m in json.loads(maps or "[]")}),
                "struct_ops": sorted({o.get("name") for o in json.loads(ops or "[]")}),
                "errors": [w for w in (why, why_maps) if w]}
    except ValueError as exc:
        return {"errors": [f"bpftool: {exc}"]}


def _ovs() -> dict:
    version, why = _run("ovs-vsctl", "--version")
    if version is None:
        return {"error": why}
    other, _ = _run("ovs-vsctl", "get", "Open_vSwitch", ".", "other_config")
    bridges, _ = _run("ovs-vsctl", "list-br")
    return {"version": version.splitlines()[0], "other_config": (other or "").strip(),
            "bridges": len((bridges or "").split())}


def _load() -> dict:
    with open("/proc/loadavg") as f:
        load = f.read().split()
    with open("/proc/stat") as f:
        cpu = [int(x) for x in f.readline().split()[1:]]
    return {"loadavg": [float(x) for x in load[:3]], "running": load[3], "cpu_ticks": cpu,
            "cpus": os.cpu_count()}


# what each kind of process is, by its command line (the first that matches)
ROLES = (("agent", "bwfabric.cli agent"), ("controller", "bwfabric.cli controller"),
         ("ovs", "ovs-vswitchd"), ("traffic", "experiments.flowgen"), ("traffic", "iperf3"),
         ("experiment", "bwfabric.cli experiment"))


def _process_ticks() -> dict[str, int]:
    """CPU ticks (user + system) used so far by every process, summed by
    role (ROLES; kernel threads: "kernel"; the rest: "other"); agents and
    the controller with the commands they ran and waited for."""
    out: dict[str, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        role = next((r for r, needle in ROLES if needle in cmd), "kernel" if not cmd else "other")
        ticks = int(fields[11]) + int(fields[12])
        if role in ("agent", "controller"):      # and the tools they ran (tc, bpftool, nft, ss), reaped
            ticks += int(fields[13]) + int(fields[14])
        out[role] = out.get(role, 0) + ticks
    return out


class CpuByRole:
    """Cores each role used between :meth:`start` and :meth:`stop` (the
    machine's busy share too): what the emulation's load was made of.
    Processes that ended between the two are not counted."""

    def start(self) -> "CpuByRole":
        self.t0, self.ticks0, self.machine0 = time.monotonic(), _process_ticks(), _load()["cpu_ticks"]
        return self

    def stop(self) -> dict:
        dt = time.monotonic() - self.t0
        hz = os.sysconf("SC_CLK_TCK")
        now, machine = _process_ticks(), _load()["cpu_ticks"]
        cores = {r: max(0, now.get(r, 0) - self.ticks0.get(r, 0)) / hz / dt for r in sorted(set(now))}
        used = [b - a for a, b in zip(self.machine0, machine)]
        idle = used[3] + used[4]
        return {"seconds": round(dt, 2), "cores_by_role": {r: round(c, 3) for r, c in cores.items()},
                "machine_busy": round(1 - idle / sum(used), 3) if sum(used) else None, "cpus": os.cpu_count()}


def snapshot(with_netns: bool = True) -> dict:
    """The environment now."""
    env = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "kernel": platform.release(),
           "machine": platform.machine(), "python": platform.python_version(),
           "sysctls": _sysctls(MACHINE_SYSCTLS), "bpf": _bpf(), "ovs": _ovs(), "load": _load()}
    try:
        env["os"] = Path("/etc/debian_version").read_text().strip()
    except OSError:
        env["os"] = None
    if with_netns:
        env["namespaces"] = _netns_settings()
    return env


class Recorder:
    """``environment.json`` of one run: the machine before it, every
    namespace while it runs (``during_s`` in: the fabric is up then), and
    the load after it."""

    def __init__(self, out_dir: Path, during_s: float = 15.0):
        self.out_dir, self.during_s = Path(out_dir), during_s
        self.data: dict = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "Recorder":
        self.data["before"] = snapshot(with_netns=False)
        self._thread = threading.Thread(target=self._during, daemon=True)
        self._thread.start()
        return self

    def _during(self) -> None:
        if not self._stop.wait(self.during_s):
            try:
                self.data["during"] = snapshot()
            except Exception as exc:  # noqa: BLE001 - a record never fails the run it records
                self.data["during"] = {"error": f"{type(exc).__name__}: {exc}"}

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
        self.data["after"] = {"load": _load()}
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "environment.json").write_text(json.dumps(self.data, indent=1, default=list))


def differences(a: dict, b: dict, path: str = "") -> list[str]:
    """Where two environments differ, key by key (load, time and process
    ids left out: they always differ)."""
    skip = {"time", "load", "pid", "cpu_ticks", "loadavg", "running"}
    out = []
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k in skip:
                continue
            if k not in a or k not in b:
                out.append(f"{path}{k}: only in {'the first' if k in a else 'the second'}")
            else:
                out.extend(differences(a[k], b[k], f"{path}{k}."))
    elif a != b:
        out.append(f"{path.rstrip('.')}: {a!r} vs {b!r}")
    return out
