"""Host agents on an emulated fabric: one ``bwfabric agent`` per Mininet host
(in the host's network namespace), a fresh master secret per run, and the
controller-side clients that configure them over the authenticated channel.
The BPF side (WC congestion control, sock_ops) is loaded once per machine
by :class:`BpfLoaded`, *before* the fabric starts: Mininet hosts get
private mount namespaces when they are created, so a bpffs mounted later
is invisible to the agents inside them."""

from __future__ import annotations

import secrets
import sys
import time
from pathlib import Path

from experiments.fabric import Fabric
from hostagent import cc
from hostagent.client import AgentClient
from hostagent.channel import host_key, write_secret


class AgentError(RuntimeError):
    pass


class BpfLoaded:
    """Context: the WC congestion control and sock_ops program are loaded
    while inside; unloaded at the end if this context loaded them."""

    def __init__(self):
        self.loaded = False

    def __enter__(self) -> "BpfLoaded":
        if not cc.cc_registered():
            cc.load()
            self.loaded = True
        else:
            cc.load()      # idempotent: checks the pins, attaches sock_ops if missing
        return self

    def __exit__(self, *exc) -> None:
        if self.loaded:
            try:
                cc.unload(wait_s=15)
            except cc.CcError as exc:
                print(f"warning: {exc}", file=sys.stderr)


class Agents:
    def __init__(self, fab: Fabric, workdir: Path, hosts: list[str] | None = None):
        self.fab = fab
        self.workdir = workdir
        self.hosts = hosts or [h.name for h in fab.topo.hosts]
        self.master = secrets.token_bytes(32)
        self.procs: dict[str, object] = {}
        self.clients: dict[str, AgentClient] = {}

    def start(self) -> "Agents":
        self.workdir.mkdir(parents=True, exist_ok=True)
        probe = self.fab.host(self.hosts[0]).cmd(f"ls {cc.BPFFS}").split()
        missing = [m for m in cc.MAPS if m not in probe]
        if missing:
            raise AgentError(f"the WC congestion control's maps ({', '.join(missing)}) are not visible in host "
                             f"{self.hosts[0]}'s mount namespace at {cc.BPFFS}: load it before the fabric starts "
                             "(experiments.agents.BpfLoaded, or `python -m hostagent.cc load`)")
        for h in self.hosts:
            key_file = self.workdir / f"{h}.key"
            key_file.unlink(missing_ok=True)
            write_secret(key_file, host_key(self.master, h).hex())
            sock = self.workdir / f"{h}.sock"
            self.procs[h] = self.fab.host(h).popen(
                [sys.executable, "-m", "bwfabric.cli", "agent", "--host", h, "--key-file", str(key_file),
                 "--listen", f"unix:{sock}", "--state-dir", str(self.workdir / f"state-{h}")],
                stdout=open(self.workdir / f"agent-{h}.log", "w"), stderr=-2)
            self.clients[h] = AgentClient(f"unix:{sock}", h, host_key(self.master, h))
        deadline = time.monotonic() + 20
        for h in self.hosts:
            while not (self.workdir / f"{h}.sock").exists():
                if self.procs[h].poll() is not None or time.monotonic() > deadline:
                    raise AgentError(f"agent {h} did not start: "
                                     f"{(self.workdir / f'agent-{h}.log').read_text()[-1000:]}")
                time.sleep(0.1)
        return self

    def configure(self, host: str, **cfg) -> dict:
        """Send a configuration; the interface, address and NIC rate come
        from the topology unless given."""
        topo = self.fab.topo
        link = next(lk for lk in topo.links if host in (lk.a, lk.b))
        base = dict(host=host, interface=f"{host}-eth0", address=topo.host(host).ip,
                    nic_mbps=link.capacity_mbps)
        reply = self.clients[host].request("config", {**base, **cfg})
        if not reply.get("ok"):
            raise AgentError(f"agent {host}: {reply.get('error')}")
        return reply

    def dead(self) -> list[str]:
        return [h for h, p in self.procs.items() if p.poll() is not None]

    def stop(self) -> None:
        from experiments.controller_proc import record_death
        for h in self.dead():
            record_death(f"agent {h} exited with {self.procs[h].poll()} before the run ended; "
                         f"see {self.workdir / f'agent-{h}.log'}")
        for c in self.clients.values():
            c.close()
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(10)
            except Exception:
                p.kill()

    def __enter__(self) -> "Agents":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
