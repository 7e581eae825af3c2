"""An etcd server of a run's own (Debian's ``etcd-server``), for the tests
and experiments of active/standby controllers: one member, its data in a
directory of the run, its client and peer ports free ports of 127.0.0.1.
Stopped by its PID (never by name: another etcd on the machine is not ours).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from experiments.configs import free_port


class EtcdError(RuntimeError):
    pass


class EtcdProcess:
    def __init__(self, workdir: Path, name: str = "bwfabric-test"):
        self.workdir = Path(workdir)
        self.name = name
        self.client_port = free_port()
        self.peer_port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def start(self, timeout_s: float = 20.0) -> "EtcdProcess":
        exe = shutil.which("etcd")
        if exe is None:
            raise EtcdError("etcd is not installed (Debian: apt-get install etcd-server; ./bwfabric.sh test "
                            "installs it)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        peer = f"http://127.0.0.1:{self.peer_port}"
        self._log = open(self.workdir / "etcd.log", "a")
        self.proc = subprocess.Popen(
            [exe, "--name", self.name, "--data-dir", str(self.workdir / "data"),
             "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"{self.name}={peer}", "--initial-cluster-state", "new",
             "--heartbeat-interval", "100", "--election-timeout", "500"],
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise EtcdError(f"etcd exited ({self.proc.returncode}): "
                                f"{(self.workdir / 'etcd.log').read_text()[-2000:]}")
            try:
                self.client().status()
                return self
            except Exception:   # noqa: BLE001 - not up yet
                if time.monotonic() > deadline:
                    self.stop()
                    raise EtcdError(f"etcd did not answer within {timeout_s} s") from None
                time.sleep(0.1)

    def client(self):
        from etcd3gw.client import Etcd3Client
        return Etcd3Client(host="127.0.0.1", port=self.client_port, timeout=2)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if getattr(self, "_log", None):
            self._log.close()

    def __enter__(self) -> "EtcdProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
