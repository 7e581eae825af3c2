"""Host agent processes on an emulated fabric: one ``bwfabric agent`` per
Mininet host (in the host's network namespace), each with its key derived
from the run's master secret -- the one the controller's configuration
names (:func:`experiments.configs.write`). The controller configures them;
this module only starts, kills and restarts them.

The BPF side (WC congestion control, sock_ops) is loaded once per machine
by :class:`BpfLoaded`, *before* the fabric starts: Mininet hosts get
private mount namespaces when they are created, so a bpffs mounted later
is invisible to the agents inside them."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from experiments.fabric import Fabric
from hostagent import cc
from bwcommon.channel import host_key, load_secret, write_secret

STOP_S = 60.0       # for every agent to remove what it put in force and exit, all together


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
    """Agents listening on ``unix:<workdir>/<host>.sock`` (the address
    template of experiments.configs), keys from ``<workdir>/master.key``."""

    def __init__(self, fab: Fabric, workdir: Path, hosts: list[str]):
        self.fab, self.workdir, self.hosts = fab, Path(workdir).resolve(), list(hosts)
        self.procs: dict[str, object] = {}
        self.starts: dict[str, int] = {}

    def start(self) -> "Agents":
        probe = self.fab.host(self.hosts[0]).cmd(f"ls {cc.BPFFS}").split() if self.hosts else cc.MAPS
        missing = [m for m in cc.MAPS if m not in probe]
        if missing:
            raise AgentError(f"the WC congestion control's maps ({', '.join(missing)}) are not visible in host "
                             f"{self.hosts[0]}'s mount namespace at {cc.BPFFS}: load it before the fabric starts "
                             "(experiments.agents.BpfLoaded, or `python -m hostagent.cc load`)")
        master = load_secret(self.workdir / "master.key", private=True)
        for h in self.hosts:
            key_file = self.workdir / f"{h}.key"
            if not key_file.exists():
                write_secret(key_file, host_key(master, h).hex())
            self.launch(h)
        for h in self.hosts:
            self.wait_listening(h)
        return self

    def launch(self, h: str) -> None:
        self.starts[h] = self.starts.get(h, 0) + 1
        log = open(self.workdir / f"agent-{h}.log", "a")
        self.procs[h] = self.fab.host(h).popen(
            [sys.executable, "-m", "bwfabric.cli", "agent", "--host", h, "--key-file", str(self.workdir / f"{h}.key"),
             "--listen", f"unix:{self.workdir / (h + '.sock')}", "--state-dir", str(self.workdir / f"state-{h}")],
            stdout=log, stderr=-2)

    def wait_listening(self, h: str, timeout_s: float = 20.0) -> float:
        """Seconds until the agent's socket exists (after a launch)."""
        t0 = time.monotonic()
        while not (self.workdir / f"{h}.sock").exists():
            if self.procs[h].poll() is not None or time.monotonic() > t0 + timeout_s:
                raise AgentError(f"agent {h} did not start: "
                                 f"{(self.workdir / f'agent-{h}.log').read_text()[-1000:]}")
            time.sleep(0.02)
        return time.monotonic() - t0

    def kill(self, h: str) -> None:
        """SIGKILL: the agent dies without removing anything (a crash)."""
        p = self.procs[h]
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        (self.workdir / f"{h}.sock").unlink(missing_ok=True)

    def restart(self, h: str) -> float:
        """Launch again (what systemd's Restart= does); seconds until it listens."""
        self.launch(h)
        return self.wait_listening(h)

    def dead(self) -> list[str]:
        return [h for h, p in self.procs.items() if p.poll() is not None]

    def stop(self) -> None:
        from experiments.controller_proc import record_death
        for h in self.dead():
            record_death(f"agent {h} exited with {self.procs[h].poll()} before the run ended; "
                         f"see {self.workdir / f'agent-{h}.log'}")
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        # each agent removes what it put in force (tc, nftables, BPF map entries) before it exits:
        # on a loaded machine that took more than 10 s, and an agent killed halfway left its VM's
        # bucket, pacing and A_l entries in the machine-wide maps
        deadline = time.monotonic() + STOP_S
        for h, p in self.procs.items():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except Exception:
                record = self.workdir / f"agent-{h}.log"
                print(f"agent {h} did not finish its teardown in {STOP_S:g} s: killed (see {record})",
                      file=sys.stderr)
                p.kill()

    def __enter__(self) -> "Agents":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_in_force(api, hosts, timeout_s: float = 30.0) -> float:
    """Until every agent of ``hosts`` confirmed the configuration the
    controller wants for it and reads it back in force; returns the seconds
    it took (AgentError after ``timeout_s``)."""
    t0 = time.monotonic()
    want = set(hosts)
    while True:
        states = {a["host"]: a for a in api.get("/v1/agents")["agents"]}
        pending = sorted(h for h in want if h not in states or not states[h]["connected"]
                         or states[h]["version_in_force"] != states[h]["desired_version"] or not states[h]["in_force"])
        if not pending:
            return time.monotonic() - t0
        if time.monotonic() > t0 + timeout_s:
            raise AgentError("agents not in force after %.0f s: %s" % (timeout_s, "; ".join(
                f"{h}: {states.get(h, {}).get('last_error') or 'waiting'}" for h in pending)))
        time.sleep(0.05)
