"""The emulator's own fidelity checks: OVS port-socket drops parsed from ss,
the RPS mask/command the fabric applies to host interfaces, and the WC
congestion control's repair counters (bpftool array dumps)."""

import pytest

from experiments.fabric import rps_command, rps_mask
from experiments.ovs import parse_socket_drops

SS = """Netid State  Recv-Q Send-Q Local Address:Port Peer Address:PortProcess
p_raw UNCONN 0      0                [0]:*                *     users:(("ovs-vswitchd",pid=6033,fd=63)) skmem:(r0,rb212992,t0,tb33554432,f0,w0,o0,bl0,d0)
p_raw UNCONN 0      0                *:sl-eth1          *     users:(("ovs-vswitchd",pid=6033,fd=70))
\t skmem:(r0,rb2097152,t0,tb212992,f0,w0,o0,bl0,d125)
p_raw UNCONN 0      0                *:sl-eth2          *     users:(("ovs-vswitchd",pid=6033,fd=71)) skmem:(r0,rb2097152,t0,tb212992,f0,w0,o0,bl0,d18)
p_raw UNCONN 0      0                *:eth0             *     users:(("dhclient",pid=700,fd=5)) skmem:(r0,rb212992,t0,tb212992,f0,w0,o0,bl0,d999)
"""


def test_socket_drops_sum_only_that_process_with_skmem_on_either_line():
    assert parse_socket_drops(SS, 6033) == 125 + 18
    assert parse_socket_drops(SS, 700) == 999
    assert parse_socket_drops(SS, 1) == 0
    assert parse_socket_drops("", 6033) == 0


def test_rps_mask_covers_every_cpu():
    assert rps_mask(1) == "1"
    assert rps_mask(2) == "3"
    assert rps_mask(12) == "fff"
    with pytest.raises(ValueError, match="n_cpus=0"):
        rps_mask(0)


def test_rps_command_writes_the_device_queue_in_a_fresh_sysfs():
    cmd = rps_command("s1-eth0", n_cpus=4)
    assert cmd.startswith("unshare -m ")
    assert "umount -l /sys && mount -t sysfs sysfs /sys" in cmd
    assert cmd.endswith("echo f > /sys/class/net/s1-eth0/queues/rx-0/rps_cpus'")


def test_array_map_dumps_read_in_key_order_with_or_without_btf():
    from hostagent.cc import parse_array_dump
    with_btf = [{"key": 1, "value": 7}, {"key": 0, "value": 3}]
    raw = [{"key": ["0x01", "0x00", "0x00", "0x00"], "value": ["0x07"] + ["0x00"] * 7},
           {"key": ["0x00", "0x00", "0x00", "0x00"], "value": ["0x10", "0x01"] + ["0x00"] * 6}]
    assert parse_array_dump(with_btf) == [3, 7]
    assert parse_array_dump(raw) == [0x110, 7]
