"""What an emulated host's network namespace starts with does not depend on
the machine (issue #32 §3): a new namespace inherits the root's default
congestion control and tcp_rmem/tcp_wmem, and machine images change them
(this one's: BBR; and Mininet's own start sets the root's tcp_rmem/wmem
to 10240 87380 16777216, its fixLimits). The fabric sets the kernel's own defaults in every host,
whatever the root has -- here the root is given others for the test."""

from pathlib import Path

import pytest

from experiments.fabric import HOST_TCP_DEFAULTS, Fabric, FabricError
from mininet_topos import builders

pytestmark = pytest.mark.root
OF_PORT = 6697
ROOT_ODD = {"net.ipv4.tcp_congestion_control": "reno", "net.ipv4.tcp_rmem": "8192 65536 1048576",
            "net.ipv4.tcp_wmem": "8192 32768 1048576", "net.ipv4.tcp_ecn": "1"}
ALLOWED = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")


def _path(key: str) -> Path:
    return Path("/proc/sys") / key.replace(".", "/")


@pytest.fixture
def odd_root():
    """The root namespace with other TCP defaults, and cubic not allowed."""
    saved = {k: _path(k).read_text() for k in ROOT_ODD}
    allowed = ALLOWED.read_text()
    try:
        for k, v in ROOT_ODD.items():
            _path(k).write_text(v)
        ALLOWED.write_text(" ".join(c for c in allowed.split() if c != "cubic") or "reno")
        yield
    finally:
        for k, v in saved.items():
            _path(k).write_text(v)
        ALLOWED.write_text(allowed)


def test_every_host_gets_the_kernels_tcp_defaults_whatever_the_root_namespace_has(odd_root):
    topo = builders.star(n_senders=2, link_mbps=100.0)
    with Fabric(topo, of_port=OF_PORT) as fab:
        for h in topo.hosts:
            res = fab.run_in(h.name, "sysctl", "-n", *HOST_TCP_DEFAULTS)
            assert res.returncode == 0, res.stderr
            got = [" ".join(line.split()) for line in res.stdout.splitlines()]
            assert got == list(HOST_TCP_DEFAULTS.values()), (h.name, got)
        assert "cubic" in ALLOWED.read_text().split()       # allowed again, so a namespace may have it
        assert any("cubic" in w for w in fab.warnings), fab.warnings


def test_hosts_take_the_sysctls_asked_over_the_defaults_and_an_unknown_one_is_refused_before_any_start():
    topo = builders.star(n_senders=2, link_mbps=100.0)
    with pytest.raises(FabricError, match="net.ipv4.tcp_bogus"):
        Fabric(topo, of_port=OF_PORT, host_tcp={"net.ipv4.tcp_bogus": "1"})
    for hostile in ("1'; touch /tmp/bwf_pwned; '", "1\n", "", float("nan"), 1):
        with pytest.raises(FabricError, match="net.ipv4.tcp_ecn"):
            Fabric(topo, of_port=OF_PORT, host_tcp={"net.ipv4.tcp_ecn": hostile})
    want = {**HOST_TCP_DEFAULTS, "net.ipv4.tcp_ecn": "1"}
    with Fabric(topo, of_port=OF_PORT, host_tcp={"net.ipv4.tcp_ecn": "1"}) as fab:
        for h in topo.hosts:
            res = fab.run_in(h.name, "sysctl", "-n", *want)
            assert res.returncode == 0, res.stderr
            assert [" ".join(line.split()) for line in res.stdout.splitlines()] == list(want.values()), h.name
