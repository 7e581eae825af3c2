"""Real host agents (the daemon's request handling, channel and transport)
served on unix sockets inside the test process, for tests of the
controller's side of the channel. What the agent would do to a kernel is
recorded instead of done: these tests are about who sends what to whom;
the kernel side has its own root tests (tests/integration)."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from bwcommon.channel import host_key
from bwcommon.transport import listen
from bwtesting.executors import RecordingExecutor
from hostagent.agent import Agent

MASTER = bytes(range(32))
ROOT = Path(__file__).resolve().parents[2]


def until(cond, timeout: float = 15.0) -> bool:
    """Poll ``cond`` every 5 ms until it holds (True) or ``timeout`` s pass
    (False): generous, as it returns the moment ``cond`` holds."""
    import time
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.005)
    return False


def fabric_data(workdir: Path, vms: dict, **agents) -> dict:
    """examples/fattree4.yaml as a dict for agents on ``unix:<workdir>/<host>.sock``
    (the master key written there), tenant ``t`` holding ``vms``, no API;
    ``agents`` overrides the agents section's settings."""
    import yaml

    from bwcommon.channel import write_secret
    write_secret(workdir / "master.key", MASTER.hex())
    data = yaml.safe_load((ROOT / "examples" / "fattree4.yaml").read_text())
    data["fabric"]["topology"] = str(ROOT / "examples" / "fattree4.json")
    data["agents"] = {"master_key_file": str(workdir / "master.key"),
                      "address_template": f"unix:{workdir}/{{host}}.sock", **agents}
    data["tenants"] = {"t": {"vms": vms}}
    data.pop("api")
    return data


class LocalAgent:
    """One agent daemon on ``unix:<dir>/<host>.sock``; ``restart`` is a new
    process's worth of state from the same state directory."""

    def __init__(self, workdir: Path, host: str):
        self.workdir, self.host = workdir, host
        self.address = f"unix:{workdir / (host + '.sock')}"
        self.agent: Agent | None = None
        self.sock = None

    def start(self) -> "LocalAgent":
        """(VMs in namespaces of their own get recording executors too, in
        ``vm_executors``; their namespaces are not entered: these tests are
        about the channel.)"""
        from contextlib import nullcontext
        self.executor = RecordingExecutor()
        self.vm_executors: dict[str, RecordingExecutor] = {}

        def factory(name, netns):
            return self.vm_executors.setdefault(name, RecordingExecutor())
        self.agent = Agent(self.host, host_key(MASTER, self.host), self.workdir / f"state-{self.host}",
                           executor=self.executor, executor_factory=factory, enter=lambda ns: nullcontext())
        self.sock = listen(self.address)
        self.thread = threading.Thread(target=self.agent.serve, args=(self.sock,), daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        import time
        deadline = time.monotonic() + 5
        while self.agent is not None and getattr(self.agent, "server", None) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if self.agent is not None and getattr(self.agent, "server", None) is not None:
            self.agent.server.stop.set()
            self.agent.server.close_all()
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)    # wakes the accept loop now, not at its 0.5 s timeout
            except OSError:
                pass
            self.sock.close()
            self.thread.join(5)
        Path(self.address[5:]).unlink(missing_ok=True)

    def restart(self) -> "LocalAgent":
        self.stop()
        return self.start()
