"""benchmarks/flow_stats.py: the reply it packs is what os-ken parses back
(every entry's match and counters), and LESSOR trusts every entry."""

import random

from benchmarks import flow_stats as B
from controller.network_view import NetworkView
from mininet_topos.builders import fattree


def test_a_packed_reply_parses_back_entry_by_entry():
    view = NetworkView(fattree(4))
    entries = B.tor_entries(view, "e0_0", 25, random.Random(3))
    raw, = B.reply_bytes(entries, xid=9, seconds=4)
    msg = B.parse(raw)
    assert type(msg).__name__ == "OFPFlowStatsReply" and msg.xid == 9 and len(msg.body) == 25 and msg.flags == 0
    for (match, count), got in zip(entries, msg.body):
        assert dict(got.match.items()) == dict(match.items())
        assert (got.byte_count, got.packet_count, got.duration_sec) == (count, count // 1500, 4)


def test_every_entry_reaches_pre_as_the_tors_own():
    r = B.measure(4, 40, rounds=2)
    assert r["flows_known"] == 40 and r["entries"] == 40 and r["all_per_s"] > 0


def test_a_long_reply_is_split_as_a_switch_splits_it():
    view = NetworkView(fattree(4))
    entries = B.tor_entries(view, "e0_0", 1500, random.Random(3))
    messages = B.reply_bytes(entries)
    assert len(messages) > 1 and all(len(m) <= B.MAX_MESSAGE for m in messages)
    parsed = [B.parse(m) for m in messages]
    assert [m.flags for m in parsed] == [1] * (len(parsed) - 1) + [0]          # OFPMPF_REPLY_MORE
    assert sum(len(m.body) for m in parsed) == 1500
