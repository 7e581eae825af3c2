"""Two network namespaces of a test's own joined by a veth pair (addresses
/24, up, TSO/GSO off so queues count real packets); deleted afterwards, by
name, whatever the test did."""

import subprocess
import uuid
from contextlib import contextmanager


def ns(name, *cmd, **kw):
    return subprocess.run(["ip", "netns", "exec", name, *cmd], capture_output=True, text=True, **kw)


@contextmanager
def veth_pair(prefix: str, ip_a: str, ip_b: str):
    """Yields (namespace a, namespace b, a's device, b's device)."""
    tag = uuid.uuid4().hex[:5]
    a, b = f"{prefix}-a-{tag}", f"{prefix}-b-{tag}"
    dev_a, dev_b = f"{prefix[:4]}a{tag}", f"{prefix[:4]}b{tag}"
    made = []
    try:
        for n in (a, b):
            subprocess.run(["ip", "netns", "add", n], check=True)
            made.append(n)
        subprocess.run(["ip", "link", "add", dev_a, "netns", a, "type", "veth", "peer", "name", dev_b, "netns", b],
                       check=True)
        for n, dev, ip in ((a, dev_a, ip_a), (b, dev_b, ip_b)):
            for cmd in (["ip", "addr", "add", f"{ip}/24", "dev", dev], ["ip", "link", "set", dev, "up"],
                        ["ip", "link", "set", "lo", "up"], ["ethtool", "-K", dev, "tso", "off", "gso", "off"]):
                res = ns(n, *cmd)
                assert res.returncode == 0, (cmd, res.stderr)
        yield a, b, dev_a, dev_b
    finally:
        for n in made:
            subprocess.run(["ip", "netns", "del", n])
