"""A delay line's own testbed: namespaces A and B joined through M, which
runs the line (used by the delay-line benchmark, its test and the
experiments that put a line on one path). Removed on exit."""

from __future__ import annotations

import re
import subprocess
import uuid
from contextlib import contextmanager

from mininet_topos.delayline import offloads_off


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=check)


@contextmanager
def testbed():
    """A (10.77.0.1) -- M (delay line between xa and xb) -- B (10.77.0.2)."""
    tag = uuid.uuid4().hex[:6]
    a, m, b = f"dlA{tag}", f"dlM{tag}", f"dlB{tag}"
    try:
        for ns in (a, m, b):
            sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", "a0", "netns", a, "type", "veth", "peer", "name", "xa", "netns", m)
        sh("ip", "link", "add", "b0", "netns", b, "type", "veth", "peer", "name", "xb", "netns", m)
        sh("ip", "-n", a, "addr", "add", "10.77.0.1/24", "dev", "a0")
        sh("ip", "-n", b, "addr", "add", "10.77.0.2/24", "dev", "b0")
        for ns, dev in ((a, "a0"), (b, "b0"), (m, "xa"), (m, "xb")):
            sh("ip", "-n", ns, "link", "set", dev, "up")
            offloads_off(dev, ns)
        for ns in (a, b):
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        yield a, m, b
    finally:
        for ns in (a, m, b):
            sh("ip", "netns", "del", ns, check=False)


def ping_rtts(ns: str, dst: str, count: int = 20, interval: float = 0.05) -> list[float]:
    out = sh("ip", "netns", "exec", ns, "ping", "-c", str(count), "-i", str(interval), dst, check=False).stdout
    return [float(x) for x in re.findall(r"time=([0-9.]+) ms", out)]
