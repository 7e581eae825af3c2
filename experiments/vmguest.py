"""A real guest kernel for the VM-scheduling experiments (issue #23).

The seed paper's sender is a VM sharing one CPU with three others. Here
the sender is a guest kernel under QEMU (software emulation: this
machine's CPU offers no VMX/SVM), its one vCPU a host thread that shares
one host CPU with a CPU hog: it runs for a slice, then waits three
(:func:`cpu_share`). While the vCPU waits for its turn the guest's
kernel does nothing at all -- no ACK processing, no timers, no sending --
and what arrives for it waits in QEMU's queues, as it waits in a
hypervisor's backend.

- the guest boots Debian's cloud kernel (bookworm-backports, >= 6.2 for
  the coupled controls) with this machine's root file system as its root,
  read-only, over virtio-fs, and runs :func:`job` from this checkout: the
  agent's own BPF loading (``hostagent.cc.load``) and ``bwf_ccsel``;
- its NICs are taps in the testbed's sender namespace, bridged to the
  paths (:func:`experiments.coupled.testbed.testbed` with ``guest=True``);
- one job directory per run is shared read-write: the job's spec in,
  its result out.

    python -m experiments.vmguest setup     # QEMU >= 8, the guest kernel, virtiofsd (Debian 12, root)
    bwfabric experiment coupled-vm-guest    # the experiment (experiments.coupled.vm_guest)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

GUEST_DIR = Path("/var/lib/bwfabric-guest")
REPO = Path(__file__).resolve().parents[1]
BACKPORTS = Path("/etc/apt/sources.list.d/bwfabric-backports.list")
KERNEL_META = "linux-image-cloud-amd64"
MIN_QEMU = (8, 0)         # 7.2's TCG corrupted the 6.12 guest's interrupt frames here (oopses in softirq)
INIT = """#!/bin/sh
# bwfabric guest PID 1: written by experiments.vmguest; runs the job, powers off
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
mount -t tmpfs tmpfs /run
# not over /tmp: the checkout may live there (the root is the host's, read-only)
mkdir -p /run/job /run/tmp && mount -t virtiofs job /run/job
export TMPDIR=/run/tmp
modprobe -d {modroot} virtio_net
ip link set lo up
cd {repo} && {python} -m experiments.vmguest job /run/job/spec.json > /run/job/job.out 2> /run/job/job.err
sync
echo o > /proc/sysrq-trigger
"""


class GuestError(RuntimeError):
    pass


def _run(*cmd: str, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode:
        raise GuestError(f"{' '.join(cmd)}: {r.stderr.strip() or r.stdout.strip()}")
    return r


def qemu_version() -> tuple[int, int] | None:
    exe = shutil.which("qemu-system-x86_64")
    if not exe:
        return None
    m = re.search(r"version (\d+)\.(\d+)", _run(exe, "--version").stdout)
    return (int(m.group(1)), int(m.group(2))) if m else None


def kernel() -> tuple[Path, Path] | None:
    """(vmlinuz, module root) of the extracted guest kernel, or None."""
    for vmlinuz in sorted(GUEST_DIR.glob("root/boot/vmlinuz-*")):
        return vmlinuz, GUEST_DIR / "root"
    return None


def virtiofsd() -> Path | None:
    p = GUEST_DIR / "virtiofsd"
    return p if p.exists() else None


def missing() -> str | None:
    """None, or what is missing to boot a guest (and how to get it)."""
    why = []
    v = qemu_version()
    if v is None or v < MIN_QEMU:
        why.append(f"QEMU >= {MIN_QEMU[0]} (found {'none' if v is None else '.'.join(map(str, v))})")
    if kernel() is None:
        why.append(f"the guest kernel in {GUEST_DIR}")
    if virtiofsd() is None:
        why.append(f"virtiofsd in {GUEST_DIR}")
    if why:
        return "missing " + ", ".join(why) + ": run `python -m experiments.vmguest setup` (Debian 12, root)"
    return None


def setup() -> dict:
    """Idempotent. QEMU from bookworm-backports (Debian 12's 7.2 oopsed the
    guest); the cloud kernel package's files extracted (not installed) into
    GUEST_DIR, modules indexed; virtiofsd taken out of Debian 12's
    qemu-system-common 7.2 (later QEMUs no longer ship it and Debian 12 has
    no packaged Rust virtiofsd)."""
    GUEST_DIR.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if not BACKPORTS.exists():
        BACKPORTS.write_text("deb http://deb.debian.org/debian bookworm-backports main\n")
    if (qemu_version() or (0, 0)) < MIN_QEMU or kernel() is None or virtiofsd() is None:
        _run("apt-get", "update", "-q", env=env)
    if (qemu_version() or (0, 0)) < MIN_QEMU:
        _run("apt-get", "install", "-y", "-q", "--no-install-recommends", "-t", "bookworm-backports",
             "qemu-system-x86", env=env)
    with tempfile.TemporaryDirectory() as tmp:
        if kernel() is None:
            deps = _run("apt-cache", "depends", "-t", "bookworm-backports", KERNEL_META).stdout
            pkg = re.search(r"Depends: (linux-image-\S+-cloud-amd64)", deps)
            if not pkg:
                raise GuestError(f"apt-cache depends {KERNEL_META}: no kernel package in {deps!r}")
            _run("apt-get", "download", "-t", "bookworm-backports", pkg.group(1), cwd=tmp, env=env)
            deb = next(Path(tmp).glob("linux-image-*.deb"))
            _run("dpkg-deb", "-x", str(deb), str(GUEST_DIR / "root"))
            release = next((GUEST_DIR / "root" / "lib" / "modules").iterdir()).name
            _run("depmod", "-b", str(GUEST_DIR / "root"), release)
        if virtiofsd() is None:
            madison = _run("apt-cache", "madison", "qemu-system-common").stdout
            ver = next((line.split("|")[1].strip() for line in madison.splitlines()
                        if re.search(r"\|\s*1:7\.", line)), None)
            if ver is None:
                raise GuestError(f"no qemu-system-common 7.x to take virtiofsd from: {madison!r}")
            _run("apt-get", "download", f"qemu-system-common={ver}", cwd=tmp, env=env)
            deb = next(Path(tmp).glob("qemu-system-common_*.deb"))
            _run("dpkg-deb", "-x", str(deb), f"{tmp}/x")
            shutil.copy2(f"{tmp}/x/usr/lib/qemu/virtiofsd", GUEST_DIR / "virtiofsd")
    if (why := missing()) is not None:
        raise GuestError(f"setup did not complete: {why}")
    return {"qemu": ".".join(map(str, qemu_version())), "kernel": str(kernel()[0]), "virtiofsd": str(virtiofsd())}


class Guest:
    """One guest run: ``start`` boots it in ``netns`` with one NIC per
    (tap, mac) and the job ``spec``; ``wait`` returns the job's result.
    Its processes are killed and its directory removed by ``close``."""

    def __init__(self, netns: str, nics: list[tuple[str, str]], spec: dict, mem_mb: int = 768):
        if (why := missing()) is not None:
            raise GuestError(why)
        self.netns, self.nics, self.spec, self.mem_mb = netns, nics, spec, mem_mb
        self.dir = Path(tempfile.mkdtemp(prefix="bwf-guest-"))
        (self.dir / "job").mkdir()
        (self.dir / "job" / "spec.json").write_text(json.dumps(spec))
        self.procs: list[subprocess.Popen] = []
        self.qemu: subprocess.Popen | None = None

    def _virtiofsd(self, name: str, source: str, cache: str) -> str:
        sock = str(self.dir / f"{name}.sock")
        self.procs.append(subprocess.Popen([str(virtiofsd()), f"--socket-path={sock}", "-o", f"source={source}",
                                            "-o", f"cache={cache}", "-o", "sandbox=chroot"],
                                           stdout=subprocess.DEVNULL, stderr=open(self.dir / f"{name}.log", "w")))
        for _ in range(100):
            if os.path.exists(sock):
                return sock
            time.sleep(0.05)
        raise GuestError(f"virtiofsd for {source} did not open {sock}")

    def start(self) -> "Guest":
        vmlinuz, modroot = kernel()
        init = self.dir / "init.sh"
        init.write_text(INIT.format(modroot=modroot, repo=REPO, python=sys.executable))
        init.chmod(0o755)
        root_sock = self._virtiofsd("root", "/", "auto")
        job_sock = self._virtiofsd("job", str(self.dir / "job"), "none")
        cmd = ["ip", "netns", "exec", self.netns, "qemu-system-x86_64", "-machine", "q35,accel=tcg", "-cpu", "qemu64",
               "-smp", "1", "-m", str(self.mem_mb), "-nographic", "-no-reboot", "-name", "bwf-guest,debug-threads=on",
               "-object", f"memory-backend-memfd,id=mem,size={self.mem_mb}M,share=on", "-numa", "node,memdev=mem",
               "-chardev", f"socket,id=c0,path={root_sock}", "-device", "vhost-user-fs-pci,chardev=c0,tag=hostroot",
               "-chardev", f"socket,id=c1,path={job_sock}", "-device", "vhost-user-fs-pci,chardev=c1,tag=job",
               "-kernel", str(vmlinuz),
               "-append", f"console=ttyS0 root=hostroot rootfstype=virtiofs ro init={init} quiet panic=-1 no_timer_check idle=poll"]
        for k, (tap, mac) in enumerate(self.nics):
            # no offloads: the delay lines move MTU frames (csum=off takes TSO/GSO with it)
            cmd += ["-netdev", f"tap,id=n{k},ifname={tap},script=no,downscript=no",
                    "-device", f"virtio-net-pci,netdev=n{k},mac={mac},csum=off,guest_csum=off"]
        self.qemu = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=open(self.dir / "console.log", "w"),
                                     stderr=subprocess.STDOUT)
        return self

    def vcpu_tids(self, timeout: float = 10.0) -> list[int]:
        """The vCPU threads' ids (QEMU names them "CPU n/TCG")."""
        t_end = time.time() + timeout
        while time.time() < t_end:
            pid = self._qemu_pid()
            if pid:
                tids = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()
                        if (t / "comm").read_text().startswith("CPU ")]
                if tids:
                    return tids
            time.sleep(0.05)
        raise GuestError("no vCPU thread found in QEMU")

    def _qemu_pid(self) -> int | None:
        # ip netns exec execs qemu in place: the Popen's pid is QEMU's
        if self.qemu and Path(f"/proc/{self.qemu.pid}/comm").exists():
            return self.qemu.pid if "qemu" in Path(f"/proc/{self.qemu.pid}/comm").read_text() else None
        return None

    def wait_marker(self, name: str, timeout: float) -> None:
        """Until the job writes ``name`` (the guest booted and is set up)."""
        t_end = time.time() + timeout
        while not (self.dir / "job" / name).exists():
            if self.qemu.poll() is not None or time.time() > t_end:
                err = self.dir / "job" / "job.err"
                raise GuestError(f"the guest ended or took over {timeout:g} s before {name!r}: "
                                 f"{err.read_text()[-2000:] if err.exists() else ''}{self.console()[-1500:]}")
            time.sleep(0.02)

    def wait(self, timeout: float) -> dict:
        try:
            self.qemu.wait(timeout)
        except subprocess.TimeoutExpired:
            raise GuestError(f"the guest did not finish in {timeout:g} s; console: {self.console()[-2000:]}") \
                from None
        res = self.dir / "job" / "result.json"
        if not res.exists():
            err = (self.dir / "job" / "job.err")
            raise GuestError(f"the guest's job left no result: {err.read_text()[-3000:] if err.exists() else ''}"
                             f"{self.console()[-1500:]}")
        return json.loads(res.read_text())

    def console(self) -> str:
        p = self.dir / "console.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def close(self) -> None:
        if os.environ.get("BWF_KEEP_GUEST"):     # a copy of the run's console, spec and result, for a post-mortem
            with contextlib.suppress(OSError):
                shutil.copytree(self.dir, os.environ["BWF_KEEP_GUEST"], dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("*.sock"))
        for p in ([self.qemu] if self.qemu else []) + self.procs:
            if p.poll() is None:
                p.kill()
            with contextlib.suppress(Exception):
                p.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()


@contextlib.contextmanager
def cpu_share(tids: list[int], cpu: int, slice_ms: float | None, off_ms: float | None = None):
    """The guest's vCPU threads on host CPU ``cpu``, alone there without
    ``slice_ms``. With it, the VM is scheduled as the seed paper's is: it
    runs for ``slice_ms`` and then waits ``off_ms`` (default three slices:
    three other VMs' turns). The waiting is real -- a SCHED_FIFO CPU hog
    on ``cpu`` at priority 2, the vCPU toggled between priority 3 (its
    turn: it runs whenever it is runnable, as a VM does that still has
    credit) and 1 (the others' turn: it does not run at all) by a timer
    thread elsewhere. A plain round robin of equals would not do: the vCPU
    thread blocks for a moment now and then (QEMU's big lock, a halted
    guest), and each time it would go behind every hog for a whole round.
    Yields a dict: ``turns``, the (on_at, off_at) times it switched, and
    ``usage``, (time, the vCPU threads' CPU seconds) sampled at each
    switch (:func:`share` of it: the CPU the VM really had)."""
    if slice_ms is not None and not (1 <= slice_ms <= 10_000):
        raise ValueError(f"slice_ms {slice_ms!r}: 1..10000")
    off_ms = 3 * slice_ms if slice_ms is not None and off_ms is None else off_ms
    if off_ms is not None and not (0 < off_ms <= 60_000):
        raise ValueError(f"off_ms {off_ms!r}: 0..60000")
    turns: list = []
    usage: list = []
    stop = threading.Event()

    def sample() -> None:
        ns = 0
        for tid in tids:
            with contextlib.suppress(OSError):
                ns += int(Path(f"/proc/{tid}/schedstat").read_text().split()[0])
        usage.append((time.monotonic(), ns / 1e9))
    hog = None
    th = None

    def prio(p: int) -> None:
        for tid in tids:
            with contextlib.suppress(ProcessLookupError):
                os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(p))

    def toggle() -> None:
        # on time even with the other CPU busy (the delay lines, the receiver)
        os.sched_setscheduler(threading.get_native_id(), os.SCHED_FIFO, os.sched_param(10))
        t = time.monotonic()
        while not stop.is_set():
            sample()
            prio(3)
            on_at = time.monotonic()
            t += slice_ms / 1e3
            if stop.wait(max(0.0, t - time.monotonic())):
                break
            prio(1)
            turns.append((on_at, time.monotonic()))
            t += off_ms / 1e3
            stop.wait(max(0.0, t - time.monotonic()))

    try:
        for tid in tids:
            os.sched_setaffinity(tid, {cpu})
        if slice_ms is not None:
            hog = subprocess.Popen(["chrt", "-f", "2", "taskset", "-c", str(cpu), "sh", "-c", "while :; do :; done"],
                                   start_new_session=True)
            th = threading.Thread(target=toggle, daemon=True)
            th.start()
        else:
            def every_half_second() -> None:
                while not stop.wait(0.5):
                    sample()
            th = threading.Thread(target=every_half_second, daemon=True)
            th.start()
        yield {"turns": turns, "usage": usage}
    finally:
        stop.set()
        if th:
            th.join(5)
        # the vCPU back to normal first: a hog starved by it could not run to die
        for tid in tids:
            with contextlib.suppress(ProcessLookupError):
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
        if hog:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(hog.pid, signal.SIGKILL)
            hog.wait(5)


def share(usage: list, until: float | None = None) -> float | None:
    """The CPU share the vCPU threads had, from :func:`cpu_share`'s samples
    (those before ``until`` only: QEMU's threads end with the guest)."""
    pts = [u for u in usage if until is None or u[0] <= until]
    pts = [u for u in pts if u[1] > 0]
    if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
        return None
    return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])


# ---- inside the guest ------------------------------------------------------

def _nic_by_mac(mac: str) -> str:
    for dev in Path("/sys/class/net").iterdir():
        if (dev / "address").read_text().strip().lower() == mac.lower():
            return dev.name
    raise GuestError(f"no NIC with MAC {mac}")


def job(spec_path: str) -> None:
    """The guest's side of a run (PID 1's child): NICs, routes and MPTCP
    endpoints as the testbed gives the sender namespace, the agent's BPF
    programs loaded and the connection's control selected, the sender run;
    result.json next to the spec."""
    from experiments.coupled import testbed as coupled
    from hostagent import cc
    from mininet_topos.delayline import offloads_off
    spec = json.loads(Path(spec_path).read_text())
    out_dir = Path(spec_path).parent
    result: dict = {"kernel": os.uname().release}
    try:
        os.makedirs("/sys/fs/cgroup", exist_ok=True)
        _run("mount", "-t", "cgroup2", "none", "/sys/fs/cgroup")
        for k, v in coupled.SENDER_SYSCTLS.items():
            _run("sysctl", "-qw", f"{k}={v}")
        devs = [_nic_by_mac(nic["mac"]) for nic in spec["nics"]]
        for dev in devs:
            offloads_off(dev)
        for cmd in coupled.sender_commands(spec["nics"], devs, spec["subflows"]):
            _run(*cmd)
        t0 = time.time()
        cc.load()
        result["cc_load_s"] = time.time() - t0
        coupled.select([a for nic in spec["nics"] for a in nic["addrs"]], spec["kind"])
        # all NICs answer ARP before the connection starts (the receiver waits in its accept)
        for nic in spec["nics"]:
            subprocess.run(["ping", "-c", "2", "-i", "0.2", "-I", nic["addrs"][0], nic["peer"]],
                           capture_output=True)
        result["clocksource"] = Path("/sys/devices/system/clocksource/clocksource0/current_clocksource").read_text().strip()
        result["t_ready"] = time.time()
        (out_dir / "ready").write_text("1")
        r = subprocess.run([sys.executable, "-c", coupled.SENDER, spec["dst"], str(spec["seconds"]), "262",
                            spec["src"], "0", "", "0"], capture_output=True, text=True, timeout=spec["seconds"] + 60)
        result["sender"] = json.loads(r.stdout) if r.returncode == 0 else {"error": r.stderr[-2000:]}
        result["stats"] = coupled.stats()
    except Exception as exc:   # the host reads why from result.json
        result["error"] = f"{type(exc).__name__}: {exc}"
    result["t_end"] = time.time()
    (out_dir / "result.json").write_text(json.dumps(result))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m experiments.vmguest")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("setup")
    j = sub.add_parser("job")
    j.add_argument("spec")
    args = ap.parse_args(argv)
    if args.cmd == "setup":
        print(json.dumps(setup(), indent=1))
    elif args.cmd == "job":
        job(args.spec)


if __name__ == "__main__":
    main()
