"""What a result records about the machine it was measured on (issue #32
§3): every namespace's settings, found by the processes in them, and the
differences between two records."""

import os
import subprocess
import uuid

import pytest

from experiments import environment as E


def test_differences_name_each_setting_that_differs_and_skip_what_always_does():
    a = {"kernel": "6.18", "time": "x", "sysctls": {"net.core.wmem_default": "212992"},
         "namespaces": {"net:[1]": {"pid": 1, "net.ipv4.tcp_ecn": "2"}}, "load": {"loadavg": [0.1]}}
    b = {"kernel": "6.18", "time": "y", "sysctls": {"net.core.wmem_default": "33554432"},
         "namespaces": {"net:[1]": {"pid": 7, "net.ipv4.tcp_ecn": "1"}, "net:[2]": {}}, "load": {"loadavg": [2]}}
    assert E.differences(a, b) == ["namespaces.net:[1].net.ipv4.tcp_ecn: '2' vs '1'",
                                   "namespaces.net:[2]: only in the second",
                                   "sysctls.net.core.wmem_default: '212992' vs '33554432'"]
    assert E.differences(a, a) == []


def test_namespaces_are_named_as_two_runs_would_name_them():
    got = E.stable_names(["net:[1]", "net:[2]", "net:[3]", "net:[4]", "net:[5]"], "net:[1]",
                         {"net:[2]": "netns:a"}, {"net:[3]": "mininet:h1", "net:[4]": "mininet:h1"})
    assert got == {"net:[1]": "root", "net:[2]": "netns:a", "net:[3]": "mininet:h1 net:[3]",
                   "net:[4]": "mininet:h1 net:[4]", "net:[5]": "net:[5]"}
    # a named namespace wins over a Mininet label; the root is the root whatever it is called
    assert E.stable_names(["net:[2]"], "net:[9]", {"net:[2]": "netns:a"}, {"net:[2]": "mininet:h1"}) == \
        {"net:[2]": "netns:a"}


@pytest.mark.skipif(os.geteuid() != 0, reason="creates a network namespace")
def test_a_namespaces_own_settings_are_recorded(tmp_path):
    name = f"bwfenv-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    proc = None
    try:
        subprocess.run(["ip", "netns", "exec", name, "sysctl", "-qw", "net.ipv4.tcp_ecn=1"], check=True)
        proc = subprocess.Popen(["ip", "netns", "exec", name, "sleep", "30"])
        inode = None
        for _ in range(100):
            try:
                inode = os.readlink(f"/proc/{proc.pid}/ns/net")
            except OSError:
                pass
            if inode and inode != os.readlink("/proc/self/ns/net"):
                break
            import time
            time.sleep(0.02)
        snap = E.snapshot()
        # keyed by a name two runs share, not by the inode (never the same twice)
        mine = snap["namespaces"][f"netns:{name}"]
        assert mine["net.ipv4.tcp_ecn"] == "1" and not mine["root"] and mine["inode"] == inode
        assert snap["namespaces"]["root"]["root"]
        with E.Recorder(tmp_path, during_s=0.0):
            pass
        assert {"before", "during", "after"} <= set(__import__("json").loads((tmp_path / "environment.json").read_text()))
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        subprocess.run(["ip", "netns", "del", name], check=False)


def test_emulation_set_up_raises_socket_limits_and_never_lowers_them(tmp_path):
    """ensure_ovs raises each machine-wide limit the figures need to at
    least its value (a fresh kernel's 212992 caps bwf_sockops's WC send
    buffers), and leaves a larger one alone."""
    from experiments import ovs
    low, high = tmp_path / "low", tmp_path / "high"
    low.write_text("212992\n")
    high.write_text("67108864\n")
    ovs.raise_default(str(low), ovs.SOCKET_MAX_SYSCTLS["/proc/sys/net/core/wmem_max"])
    ovs.raise_default(str(high), ovs.SOCKET_MAX_SYSCTLS["/proc/sys/net/core/wmem_max"])
    assert int(low.read_text()) == 16777216 and int(high.read_text()) == 67108864
    assert set(ovs.SOCKET_MAX_SYSCTLS) == {"/proc/sys/net/core/wmem_max", "/proc/sys/net/core/rmem_max",
                                           "/proc/sys/net/core/netdev_max_backlog"}
