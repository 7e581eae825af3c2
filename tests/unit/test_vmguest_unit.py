"""experiments.vmguest's pure parts: the gate's settings refused by name
before anything is touched, and the CPU share from its samples."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from experiments import vmguest

BAD_SLICES = st.one_of(st.just(math.nan), st.just(math.inf), st.just(-math.inf),
                       st.floats(max_value=0.999, allow_nan=False), st.floats(min_value=10_000.001, allow_nan=False))


@given(BAD_SLICES)
def test_cpu_share_refuses_a_slice_out_of_range_by_name(slice_ms):
    with pytest.raises(ValueError, match="slice_ms"):
        with vmguest.cpu_share([], 0, slice_ms):
            pass


@given(st.one_of(st.just(math.nan), st.just(math.inf), st.floats(max_value=0.0, allow_nan=False)))
def test_cpu_share_refuses_an_off_time_out_of_range_by_name(off_ms):
    with pytest.raises(ValueError, match="off_ms"):
        with vmguest.cpu_share([], 0, 30.0, off_ms):
            pass


def test_share_is_cpu_seconds_over_wall_seconds_up_to_until():
    usage = [(10.0, 1.0), (11.0, 1.25), (12.0, 1.5), (13.0, 2.5)]
    assert vmguest.share(usage) == pytest.approx(1.5 / 3)
    assert vmguest.share(usage, until=12.0) == pytest.approx(0.25)
    assert vmguest.share(usage[:1]) is None
    assert vmguest.share([(1.0, 0.0), (2.0, 0.0)]) is None      # the threads were gone
