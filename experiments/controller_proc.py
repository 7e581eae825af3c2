"""Run ``bwfabric controller`` as a child process and measure its CPU.

A controller that exits before the experiment stops it is a failed run:
``stop`` records it in ``died`` and in the module's ``DEATHS`` (which
``experiments.registry`` turns into a loud failure and a non-zero exit),
while the experiment still writes what it measured -- traffic keeps
flowing on the rules already installed, which is worth reporting."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

DEATHS: list[str] = []   # every process an experiment depended on that died under it (this process)


def record_death(what: str) -> None:
    DEATHS.append(what)
    print(f"\n*** FAILED RUN: {what} ***\n", file=sys.stderr, flush=True)


class ControllerProcess:
    """``bwfabric controller --config FILE`` (see experiments.configs.write)."""

    def __init__(self, config_file: Path, log_file: Path, cpu_interval: float = 1.0):
        self.config_file = config_file
        self.cmd = [sys.executable, "-m", "bwfabric.cli", "controller", "--config", str(config_file)]
        self.log_file = log_file
        self.cpu_interval = cpu_interval
        self.proc: subprocess.Popen | None = None
        self.cpu_samples: list[tuple[float, float]] = []  # (t, percent of one core)
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None
        self.died: str | None = None      # set if it exited before stop()
        self._terminated = False          # stop() ended it

    def start(self) -> "ControllerProcess":
        self._log = open(self.log_file, "a")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT)
        time.sleep(0.5)
        if self.proc.poll() is not None:
            raise RuntimeError(f"controller exited at once ({self.proc.returncode}); "
                               f"see {self.log_file}:\n{Path(self.log_file).read_text()[-2000:]}")
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        return self

    def _sample(self) -> None:
        p = psutil.Process(self.proc.pid)
        p.cpu_percent(None)
        t0 = time.monotonic()
        while not self._stop.wait(self.cpu_interval):
            try:
                self.cpu_samples.append((time.monotonic() - t0, p.cpu_percent(None)))
            except psutil.NoSuchProcess:
                return

    def cpu_between(self, t_from: float, t_to: float) -> float:
        vals = [c for t, c in self.cpu_samples if t_from <= t <= t_to]
        return sum(vals) / len(vals) if vals else 0.0

    def elapsed(self) -> float:
        return self.cpu_samples[-1][0] if self.cpu_samples else 0.0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def restart(self) -> None:
        """Stop (SIGTERM) if running, and start again, as an operator's restart does."""
        self.stop()
        self._stop = threading.Event()
        self.cpu_samples = []
        self._terminated = False
        self.start()

    def kill(self) -> None:
        """SIGKILL, as a crash does (a fault a test injects: not a death of the run)."""
        self._terminated = True
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self.proc and self.proc.poll() is not None and self.died is None and not self._terminated:
            self.died = (f"the controller ({self.config_file}) exited with {self.proc.returncode} "
                         f"before the run ended; see {self.log_file}")
            record_death(self.died)
        if self.proc and self.proc.poll() is None:
            self._terminated = True
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self._sampler:
            self._sampler.join(2)
        if getattr(self, "_log", None):
            self._log.close()

    def __enter__(self) -> "ControllerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
