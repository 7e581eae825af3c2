"""bwf_aqm's every-class mode (mininet_topos.queues.aqm, ``every_class``):
the routing comparisons' ``early_drop`` -- random early drop of every data
packet on a switch port, ACKs never; without it, only WC (ToS 0x20) packets.

A port whose virtual queue drains at 1 Mb/s gets a burst far above its
thresholds (a 1.4 MB flood in well under a second: the virtual queue sits at
twice its maximum, where the drop probability is 1), in one run per case:
ToS 0 data packets are dropped early with ``every_class`` and never without
it; packets below 128 bytes (ACKs) never, either way. Drops are counted by
the classifier and seen as packets missing at the receiver.

What breaks it: the flag not packed into the port's entry, the classifier
ignoring it, or the length test (ACK-sized packets dropped)."""

import subprocess
import sys
import textwrap

import pytest

from mininet_topos.queues import aqm
from tests.integration.netns_pair import ns, veth_pair

pytestmark = pytest.mark.root

A, B = "10.64.0.1", "10.64.0.2"
RATE_BPS, QUEUE = 1_000_000, 30_000
COUNT = 1000

FLOOD = textwrap.dedent('''
    import socket, sys
    size, tos, count = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
    for _ in range(count):
        s.sendto(b"x" * size, ("%s", 7400))
''' % B)


def _flood(snd: str, size: int, tos: int) -> None:
    res = ns(snd, sys.executable, "-c", FLOOD, str(size), str(tos), str(COUNT), timeout=60)
    assert res.returncode == 0, res.stderr


def _ip_in(rcv: str) -> int:
    rows = [ln.split() for ln in ns(rcv, "cat", "/proc/net/snmp").stdout.splitlines() if ln.startswith("Ip:")]
    return dict(zip(rows[0][1:], map(int, rows[1][1:])))["InReceives"]


@pytest.fixture()
def port():
    was_loaded = not aqm.load()
    try:
        with veth_pair("aqmx", A, B) as pair:
            yield pair
    finally:
        if not was_loaded:
            aqm.unload()


@pytest.mark.parametrize("every_class", [False, True])
def test_every_class_drops_data_of_any_class_early_and_never_acks(port, every_class):
    snd, rcv, dev, _ = port
    aqm.attach(dev, RATE_BPS, aqm.AqmParams.for_queue(QUEUE, every_class=every_class), netns=snd)
    got = {}
    for name, size, tos in (("data", 1400, 0x00), ("acks", 60, 0x00), ("wc", 1400, 0x20)):
        before, in_before = aqm.stats(dev, netns=snd), _ip_in(rcv)
        _flood(snd, size, tos)
        after = aqm.stats(dev, netns=snd)
        got[name] = {"dropped": after["wc_dropped"] - before["wc_dropped"], "arrived": _ip_in(rcv) - in_before}
    print(f"every_class={every_class}: {got}")
    # WC data is dropped early in either mode (the port's classifier is attached and working)
    assert got["wc"]["dropped"] > COUNT // 4
    # packets of 128 bytes or less: never, either mode
    assert got["acks"]["dropped"] == 0
    if every_class:
        assert got["data"]["dropped"] > COUNT // 4
        # dropped at the port, not merely counted: that many fewer reached the receiver
        assert got["data"]["arrived"] <= COUNT - got["data"]["dropped"]
    else:
        assert got["data"]["dropped"] == 0


@pytest.mark.parametrize("bad", [float("nan"), 0.0, 1.5])
def test_params_refuse_a_bad_probability_by_name(bad):
    with pytest.raises(aqm.AqmError, match="max_p"):
        aqm.AqmParams(3000, 6000, bad, every_class=True)


def test_params_refuse_a_non_boolean_flag_by_name():
    with pytest.raises(aqm.AqmError, match="every_class"):
        aqm.AqmParams(3000, 6000, 0.1, every_class="yes")


def test_the_classifiers_ack_length_is_the_ack_bands():
    """One ACK: below the same IP length bwf_aqm never drops and ack_first's band serves first."""
    import re
    from mininet_topos.queues import ACK_MAX_IP_BYTES
    defined = re.search(r"#define ACK_MAX_BYTES (\d+)", aqm.SOURCE.read_text())
    assert defined and int(defined.group(1)) == ACK_MAX_IP_BYTES
