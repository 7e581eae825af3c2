"""Link loads from port statistics: byte deltas over the switch's own
duration counters, the host direction from rx, resets and garbage ignored."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.network_view import NetworkView
from controller.portstats import PortLoads
from mininet_topos import builders

VIEW = NetworkView(builders.fattree(4, link_mbps=10))
H1_PORT = VIEW.port("e0_0", "h1")
UP = VIEW.port("e0_0", "a0_0")


def test_rates_come_from_the_switchs_durations_not_the_controllers_clock():
    p = PortLoads(VIEW)
    p.record("e0_0", [(H1_PORT, 0, 0, 10, 0), (UP, 0, 0, 10, 0)], now=100.0)
    # the reply arrives 3 s later by the controller's clock, but the switch counted 2.5 s
    p.record("e0_0", [(H1_PORT, 1_250_000, 2_500_000, 12, 500_000_000), (UP, 625_000, 0, 12, 500_000_000)],
             now=103.0)
    loads = p.link_loads()
    assert loads[("e0_0", "h1")] == pytest.approx(4e6)          # tx towards the host
    assert loads[("h1", "e0_0")] == pytest.approx(8e6)          # the host's direction: what the port received
    assert loads[("e0_0", "a0_0")] == pytest.approx(2e6)
    assert ("a0_0", "e0_0") not in loads                        # a switch's own port tells its direction


def test_a_reset_counter_or_a_repeated_reply_gives_no_sample():
    p = PortLoads(VIEW)
    p.record("e0_0", [(UP, 1000, 0, 10, 0)], now=0.0)
    p.record("e0_0", [(UP, 500, 0, 11, 0)], now=1.0)            # counter went back: the port reset
    p.record("e0_0", [(UP, 900, 0, 11, 0)], now=2.0)            # same duration: no time passed
    assert p.link_loads() == {}
    p.record("e0_0", [(UP, 1400, 0, 12, 0)], now=3.0)
    assert p.link_loads()[("e0_0", "a0_0")] == pytest.approx(500 * 8 / 1.0)


def test_a_reset_receive_counter_gives_no_sample_of_the_hosts_direction():
    """A host port's rx counter going back (the port reset; tx alone may
    not show it) must not read as negative load, -40 Mb/s or so."""
    p = PortLoads(VIEW)
    p.record("e0_0", [(H1_PORT, 1000, 5_000_000, 10, 0)], now=0.0)
    p.record("e0_0", [(H1_PORT, 2000, 0, 11, 0)], now=1.0)
    assert ("h1", "e0_0") not in p.link_loads()
    assert all(v >= 0 for v in p.link_loads().values())
    p.record("e0_0", [(H1_PORT, 3000, 125_000, 12, 0)], now=2.0)
    assert p.link_loads()[("h1", "e0_0")] == pytest.approx(1e6)


def test_a_switch_without_durations_uses_the_controllers_clock():
    p = PortLoads(VIEW)
    p.record("e0_0", [(UP, 0, 0, 0xFFFFFFFF, 0)], now=10.0)
    p.record("e0_0", [(UP, 1_000_000, 0, 0xFFFFFFFF, 0)], now=12.0)
    assert p.link_loads()[("e0_0", "a0_0")] == pytest.approx(4e6)


_value = st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True), st.none(),
                   st.booleans(), st.text(max_size=3))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([H1_PORT, UP, 99, -1]), _value, _value, _value, _value), max_size=6))
def test_garbage_in_a_reply_is_refused_and_never_stored(rows):
    p = PortLoads(VIEW)
    p.record("e0_0", [(UP, 0, 0, 1, 0)], now=0.0)
    p.record("e0_0", rows, now=1.0)
    p.record("e0_0", rows, now=2.0)
    for v in p.link_loads().values():
        assert isinstance(v, float) and 0 <= v < float("inf")


def test_a_refused_row_leaves_the_rest_of_the_reply_read_and_is_counted():
    p = PortLoads(VIEW)
    p.record("e0_0", [(UP, 0, 0, 10, 0), (H1_PORT, 0, 0, 10, 0)], now=0.0)
    # a duration's nanoseconds of 10^9 or more is not a duration: that row alone is refused
    p.record("e0_0", [(UP, 625_000, 0, 11, 10**9), (H1_PORT, 125_000, 250_000, 11, 0)], now=1.0)
    assert ("e0_0", "a0_0") not in p.link_loads()
    assert p.link_loads()[("e0_0", "h1")] == pytest.approx(1e6)
    assert (p.replies, p.ports_parsed, p.refused) == (2, 4, 1)
    # the largest nanoseconds a switch may send is taken
    p.record("e0_0", [(UP, 1_250_000, 0, 12, 10**9 - 1)], now=2.0)
    assert p.link_loads()[("e0_0", "a0_0")] == pytest.approx(1_250_000 * 8 / (3 - 1e-9), rel=1e-12)


def test_an_idle_direction_reads_as_zero_not_as_no_sample():
    p = PortLoads(VIEW)
    p.record("e0_0", [(H1_PORT, 5000, 0, 10, 0)], now=0.0)
    p.record("e0_0", [(H1_PORT, 5000, 125_000, 11, 0)], now=1.0)    # nothing sent to h1, h1 sent 1 Mb/s
    assert p.link_loads()[("e0_0", "h1")] == 0.0
    assert p.link_loads()[("h1", "e0_0")] == pytest.approx(1e6)


def test_counters_are_64_bit_and_every_refusal_counted():
    p = PortLoads(VIEW)
    p.record("e0_0", [(UP, 2**64 - 1, 0, 10, 0), (H1_PORT, 2**64, 0, 10, 0), (H1_PORT, 0, -1, 10, 0)], now=0.0)
    assert p.refused == 2 and p.tx_bytes == {("e0_0", UP): 2**64 - 1}
    p.record("e0_0", [(UP, 0, 2**65, 10, 0)], now=1.0)
    assert p.refused == 3


def test_one_ports_reset_or_unknown_peer_leaves_the_other_ports_of_the_reply():
    p = PortLoads(VIEW)
    p.record("e0_0", [(UP, 1000, 0, 10, 0), (99, 0, 0, 10, 0), (H1_PORT, 0, 1_000_000, 10, 0)], now=0.0)
    # UP reset (its counter went back), port 99 has no peer: h1's port still gives its samples
    p.record("e0_0", [(UP, 10, 0, 11, 0), (99, 5, 5, 11, 0), (H1_PORT, 125_000, 1_250_000, 11, 0)], now=1.0)
    loads = p.link_loads()
    assert ("e0_0", "a0_0") not in loads
    assert loads[("e0_0", "h1")] == pytest.approx(1e6)
    assert loads[("h1", "e0_0")] == pytest.approx(250_000 * 8)          # the delta, not the total
    assert p.tx_bytes[("e0_0", H1_PORT)] == 125_000
