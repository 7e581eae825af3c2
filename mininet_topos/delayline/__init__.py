"""The delay line (``delayline.c``): a userspace element that holds frames
between two interfaces for a one-way delay, optionally jittered (never
reordered) and gated on/off for VM-scheduling emulation. This kernel has
no netem (docs/platform.md); emulated links get their delay here.

:func:`build` compiles it (gcc) into ``build/delayline/`` once per source
change; :class:`DelayLine` runs it between two interfaces of one network
namespace (both need GRO/GSO/TSO and TX checksum offload off: see
:func:`offloads_off`) and returns its statistics when stopped.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from bwcommon.buildcache import build_dir

SOURCE = Path(__file__).with_name("delayline.c")
BUILD = build_dir("delayline")


class DelayLineError(RuntimeError):
    pass


def build() -> Path:
    """The binary for the current source (compiled if the source changed)."""
    if shutil.which("gcc") is None:
        raise DelayLineError("building the delay line needs gcc (apt-get install gcc)")
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    binary = BUILD / f"delayline-{digest}"
    if not binary.exists():
        BUILD.mkdir(parents=True, exist_ok=True)
        tmp = binary.with_suffix(".tmp")
        res = subprocess.run(["gcc", "-O2", "-Wall", "-pthread", "-o", str(tmp), str(SOURCE)],
                             capture_output=True, text=True)
        if res.returncode != 0:
            raise DelayLineError(f"gcc failed: {res.stderr.strip()[-2000:]}")
        tmp.replace(binary)
    return binary


def offloads_off(dev: str, netns: str | None = None) -> None:
    """The delay line moves frames as they are: no GRO/GSO/TSO super-frames,
    no TX checksums left to the NIC (a veth's partial checksum would leave
    as a wrong one)."""
    cmd = ["ethtool", "-K", dev, "gro", "off", "gso", "off", "tso", "off", "tx", "off"]
    subprocess.run((["ip", "netns", "exec", netns] if netns else []) + cmd, capture_output=True, check=False)


@dataclass
class DelayLine:
    a: str
    b: str
    delay_us: float
    jitter_us: float = 0.0
    on_ms: float = 0.0
    off_ms: float = 0.0
    off_gap_us: float = 0.0
    gate: str = "both"                  # which directions the gate holds: both, ab (a -> b) or ba
    tos: tuple | None = None            # (value, mask): carry only IPv4 frames with TOS & mask == value
    not_tos: tuple | None = None        # (value, mask): carry every other frame
    step_us: float = 0.0                # the delay grows by this...
    step_every_s: float = 0.0           # ...every this many seconds
    spin_us: float | None = None        # spin this close to a due frame (the binary's default 60; 0: never)
    mtu: int = 1500
    netns: str | None = None
    prefix: tuple = ()                  # a command prefix instead, e.g. ("mnexec", "-a", pid) for a Mininet node
    proc: subprocess.Popen | None = None

    def args(self) -> list[str]:
        for name in ("delay_us", "jitter_us", "on_ms", "off_ms", "off_gap_us"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 or v == float("inf"):
                raise DelayLineError(f"{name} {v!r} must be a finite number >= 0")
        if self.jitter_us > self.delay_us:
            raise DelayLineError(f"jitter_us {self.jitter_us} above delay_us {self.delay_us}")
        if (self.on_ms > 0) != (self.off_ms > 0):
            raise DelayLineError("gating needs both on_ms and off_ms")
        if self.gate not in ("both", "ab", "ba"):
            raise DelayLineError(f"gate {self.gate!r} must be both, ab or ba")
        for name in ("step_us", "step_every_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 or v == float("inf"):
                raise DelayLineError(f"{name} {v!r} must be a finite number >= 0")
        if self.spin_us is not None and (isinstance(self.spin_us, bool) or not isinstance(self.spin_us, (int, float))
                                         or not 0 <= self.spin_us <= 10000):
            raise DelayLineError(f"spin_us {self.spin_us!r} must be a number in [0, 10000]")
        if (self.step_us > 0) != (self.step_every_s > 0):
            raise DelayLineError("a delay step needs both step_us and step_every_s")
        if self.tos is not None and self.not_tos is not None:
            raise DelayLineError("tos and not_tos exclude each other (two lines carry the two classes)")
        for name in ("tos", "not_tos"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, tuple) and len(v) == 2 and
                                      all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= 255
                                          for x in v)):
                raise DelayLineError(f"{name} {v!r} must be (value, mask), bytes")
        out = ["--a", self.a, "--b", self.b, "--delay-us", f"{self.delay_us:g}", "--mtu", str(self.mtu)]
        if self.jitter_us:
            out += ["--jitter-us", f"{self.jitter_us:g}"]
        if self.tos is not None:
            out += ["--tos", f"{self.tos[0]:#x}/{self.tos[1]:#x}"]
        if self.not_tos is not None:
            out += ["--not-tos", f"{self.not_tos[0]:#x}/{self.not_tos[1]:#x}"]
        if self.step_us:
            out += ["--step-us", f"{self.step_us:g}", "--step-every-s", f"{self.step_every_s:g}"]
        if self.spin_us is not None:
            out += ["--spin-us", f"{self.spin_us:g}"]
        if self.on_ms:
            out += ["--on-ms", f"{self.on_ms:g}", "--off-ms", f"{self.off_ms:g}", "--off-gap-us", f"{self.off_gap_us:g}",
                    "--gate", self.gate]
        return out

    def start(self) -> "DelayLine":
        cmd = [str(build()), *self.args()]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]
        elif self.prefix:
            cmd = [*self.prefix, *cmd]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.started = time.monotonic()
        # it says so once both sockets are bound and its threads run: until then frames would be lost
        line = self.proc.stderr.readline()
        if "one way" not in line:
            self.proc.wait(5)
            raise DelayLineError(f"the delay line did not start: {line.strip()} {self.proc.stderr.read()[-1000:]}")
        return self

    def cpu_seconds(self) -> float | None:
        """utime + stime of the running line so far (``ip netns exec`` execs
        it: the same pid); None when it is not running."""
        if self.proc is None:
            return None
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return None

    def stop(self) -> dict:
        """Stop it; its statistics (frames, drops, hold error per direction)."""
        if self.proc is None:
            return {}
        cpu_s = self.cpu_seconds()
        wall = time.monotonic() - self.started
        self.proc.terminate()
        try:
            out, err = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
        self.proc = None
        try:
            stats = json.loads(out.strip().splitlines()[-1])
            stats["cpu_cores"] = None if cpu_s is None else round(cpu_s / wall, 3)
            return stats
        except (ValueError, IndexError):
            raise DelayLineError(f"delay line gave no statistics: {err.strip()[-1000:]}") from None
