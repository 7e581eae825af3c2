"""The delay line (issue #23 §1) between two namespaces: frames held for
the configured delay in both directions, never reordered; gated on/off, a
frame waits for the gate."""

import re
import subprocess

import pytest

from benchmarks.delayline import ping_rtts
from benchmarks.delayline import testbed as _testbed
from mininet_topos.delayline import DelayLine

pytestmark = pytest.mark.root


def test_ping_through_the_delay_line_takes_twice_the_delay():
    with _testbed() as (a, m, b):
        line = DelayLine("xa", "xb", 3000, netns=m).start()
        rtts = ping_rtts(a, "10.77.0.2", count=20, interval=0.02)
        stats = line.stop()
    assert len(rtts) >= 18
    med = sorted(rtts)[len(rtts) // 2]
    assert 6.0 <= med <= 7.0, rtts                 # 2 x 3 ms, plus the hold error and the stack
    assert min(rtts) >= 6.0
    for d in ("a_to_b", "b_to_a"):
        assert stats[d]["frames"] >= 20 and stats[d]["drops"] == 0
        assert stats[d]["hold_error_us"]["median"] < 200


def test_without_the_delay_line_nothing_passes():
    """The namespaces are joined only through it (the test above measures the line, not a bypass)."""
    with _testbed() as (a, m, b):
        assert ping_rtts(a, "10.77.0.2", count=3, interval=0.05) == []


def test_a_closed_gate_holds_frames_until_it_opens():
    with _testbed() as (a, m, b):
        line = DelayLine("xa", "xb", 100, on_ms=30, off_ms=90, netns=m).start()
        rtts = ping_rtts(a, "10.77.0.2", count=40, interval=0.013)
        line.stop()
    assert len(rtts) >= 35
    # a frame that meets the closed gate waits up to 90 ms; one sent while it is open goes through at once
    assert max(rtts) > 40 and min(rtts) < 5, rtts


def test_jitter_never_reorders():
    with _testbed() as (a, m, b):
        line = DelayLine("xa", "xb", 2000, jitter_us=1500, netns=m).start()
        out = subprocess.run(["ip", "netns", "exec", a, "ping", "-c", "50", "-i", "0.002", "10.77.0.2"],
                             capture_output=True, text=True).stdout
        line.stop()
    seqs = [int(x) for x in re.findall(r"icmp_seq=(\d+)", out)]
    assert len(seqs) >= 45 and seqs == sorted(seqs)
