"""LRC at the host: open pairs from conntrack entries, Algorithm 1 beside
the controller's B_i, limits per mode, the plan's per-pair classes."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from bwcommon.lrc import LrcError, LrcParams
from hostagent import plan as P
from hostagent.lrc import Entry, LrcHost, Timeouts, active_peers

ME = "10.0.0.1"
T = Timeouts(tcp_established=432000, udp=30, udp_stream=120, tcp_unacknowledged=300)


def policy(mode="combined", wc="ceiling", **params):
    return P.LrcPolicy(mode=mode, wc=wc, weight=1.0, params=LrcParams(**params),
                       peers={"10.0.0.2": P.LrcPeer(weight=1.0, guarantee_mbps=10),
                              "10.0.0.3": P.LrcPeer(weight=3.0, guarantee_mbps=10),
                              "10.0.0.9": P.LrcPeer(weight=1.0, guarantee_mbps=0)})


def test_active_peers_by_idle_time():
    entries = [
        Entry(ME, "10.0.0.2", 6, True, True, 432000 - 1),      # TCP, 1 s idle
        Entry("10.0.0.3", ME, 17, False, False, 30 - 1),        # UDP towards us, 1 s idle: the pair is open too
        Entry(ME, "10.0.0.9", 6, True, True, 432000 - 50),     # TCP idle 50 s
        Entry(ME, "10.0.0.9", 6, False, True, 119),             # TCP not established (TIME_WAIT...)
        Entry(ME, "10.0.0.7", 6, True, True, 432000),           # not a peer
        Entry("10.0.0.5", "10.0.0.6", 6, True, True, 432000),   # not ours
    ]
    assert active_peers(entries, ME, {"10.0.0.2", "10.0.0.3", "10.0.0.9"}, 2.0, T) == {"10.0.0.2", "10.0.0.3"}
    # a sender's entry: data in flight, refreshed to the unacknowledged timeout (300 s)
    sending = [Entry(ME, "10.0.0.2", 6, True, True, 299), Entry(ME, "10.0.0.3", 6, True, True, 290)]
    assert active_peers(sending, ME, {"10.0.0.2", "10.0.0.3"}, 2.0, T) == {"10.0.0.2"}
    assured = [Entry(ME, "10.0.0.9", 17, False, True, 120 - 3)]
    assert active_peers(assured, ME, {"10.0.0.9"}, 2.0, T) == set()
    assert active_peers(assured, ME, {"10.0.0.9"}, 5.0, T) == {"10.0.0.9"}


def test_algorithm1_halves_then_the_controllers_b():
    h = LrcHost(ME, 100.0, 40.0, policy())
    assert h.observe({"10.0.0.2"}, 0.0) is True
    assert h.guarantees(0.0) == {"10.0.0.2": pytest.approx(40)}        # alone: the whole hose
    assert h.observe({"10.0.0.2", "10.0.0.3"}, 0.1) is True
    # weights 1 and 3: 10 and 30, at once, before the controller says anything
    assert h.guarantees(0.1) == {"10.0.0.2": pytest.approx(10), "10.0.0.3": pytest.approx(30)}
    h.set_terms({"10.0.0.2": [5.0, 1.5, 4.0], "10.0.0.3": [5.0, 2.0, 50.0]}, now=0.2)
    # the receiver's half (controller) is smaller for .2, the sender's for .3
    assert h.guarantees(0.2) == {"10.0.0.2": pytest.approx(4), "10.0.0.3": pytest.approx(30)}
    # the controller's B_i goes stale after fallback_s: the sender half again
    assert h.guarantees(0.2 + 5.1)["10.0.0.2"] == pytest.approx(10)
    assert h.observe(set(), 1.0) is False          # still within pair_idle_s (2 s)
    assert h.observe(set(), 2.5) is True and h.open == []


def test_limits_per_mode_follow_v():
    for mode in ("combined", "paper"):
        h = LrcHost(ME, 100.0, 40.0, policy(mode, alpha=20.0))     # α·τ_v = 1: v = w·r̃ in one step
        h.observe({"10.0.0.2"}, 0.0)
        h.set_terms({"10.0.0.2": [30.0, 2.0, 40.0]}, now=0.0)
        h.step(0.0)
        lim = h.limits(0.0)["10.0.0.2"]
        if mode == "combined":
            assert (lim.bg_mbps, lim.wc_mbps) == (pytest.approx(40), pytest.approx(60 - 40))
        else:
            assert (lim.bg_mbps, lim.wc_mbps) == (pytest.approx(60), None)
        h.set_terms({"10.0.0.2": [10.0, 2.0, 40.0]}, now=0.1)
        h.step(0.1)
        lim = h.limits(0.1)["10.0.0.2"]
        assert lim.bg_mbps + (lim.wc_mbps or 0) == pytest.approx(40)       # max(B, v) = B


def test_combined_competition_gives_the_excess_to_the_wc_competition_level():
    h = LrcHost(ME, 100.0, 40.0, policy("combined", wc="competition", alpha=20.0))
    h.observe({"10.0.0.2", "10.0.0.3"}, 0.0)
    h.set_terms({"10.0.0.2": [30.0, 2.0, 10.0], "10.0.0.3": [10.0, 2.0, 30.0]}, now=0.0)
    h.step(0.0)
    lim = h.limits(0.0)
    assert lim["10.0.0.2"] == P.PairLimit(pytest.approx(10)) and lim["10.0.0.3"] == P.PairLimit(pytest.approx(30))
    # excess: (60 - 10) + max(0, 20 - 30) = 50 Mb/s, in units of U = 25
    assert h.competition(0.0, 25.0) == pytest.approx(2.0)
    assert LrcHost(ME, 100.0, 40.0, policy("combined", wc="ceiling")).competition(0.0, 25.0) is None
    assert LrcHost(ME, 100.0, 40.0, policy("paper")).competition(0.0, 25.0) is None


def test_terms_refused_whole_and_by_name():
    h = LrcHost(ME, 100.0, 40.0, policy())
    h.observe({"10.0.0.2", "10.0.0.3"}, 0.0)
    h.set_terms({"10.0.0.2": [5.0, 1.0, 4.0]}, now=0.0)
    with pytest.raises(LrcError, match="not a peer"):
        h.set_terms({"10.0.0.2": [6.0, 1.0, 4.0], "10.9.9.9": [1.0, 1.0, 1.0]}, now=0.1)
    with pytest.raises(LrcError, match="r_tilde"):
        h.set_terms({"10.0.0.2": [6.0, 1.0, 4.0], "10.0.0.3": [float("nan"), 1.0, 1.0]}, now=0.1)
    with pytest.raises(LrcError, match=r"factors\[10.0.0.3\]"):
        h.set_terms({"10.0.0.3": "fast"}, now=0.1)
    assert h.rates.pairs["10.0.0.2"].r_tilde == 5.0 and h.terms_refused == 3


@given(st.one_of(st.just(float("nan")), st.just(float("inf")), st.floats(max_value=0), st.text(max_size=2),
                 st.none()))
def test_bad_factor_values_change_nothing(bad):
    h = LrcHost(ME, 100.0, 40.0, policy())
    h.observe({"10.0.0.2"}, 0.0)
    h.set_terms({"10.0.0.2": [5.0, 1.0, 4.0]}, now=0.0)
    with pytest.raises((LrcError, TypeError)):
        h.set_terms({"10.0.0.2": [bad, 1.0, 4.0]}, now=0.1)
    assert h.rates.pairs["10.0.0.2"].r_tilde == 5.0 and h.rates.pairs["10.0.0.2"].received_at == 0.0


def _cfg(demote_bg: bool = True, **vm):
    return P.HostConfig.from_dict({"settings": {"host": "h1", "interface": "h1-eth0", "address": ME, "nic_mbps": 100,
                                                "demote_bg": demote_bg},
                                   "vm": {"guarantee_mbps": 40, **vm}})


def test_with_the_marker_only_bucket_rates_move_between_lrc_plans():
    cfg = _cfg(lrc=policy().model_dump())
    a = P.host_plan(cfg, None, {}, {"10.0.0.2": P.PairLimit(10, 20), "10.0.0.3": P.PairLimit(30, 0.0)})
    b = P.host_plan(cfg, None, {"10.0.0.2": 0, "10.0.0.3": 1},
                    {"10.0.0.2": P.PairLimit(12, 50), "10.0.0.3": P.PairLimit(28, 1)})
    moved = [(x, y) for x, y in zip(a.steps, b.steps) if x != y]
    assert len(a.steps) == len(b.steps)
    assert {type(x) for x, _ in moved} == {P.BgBucket, P.TcClass}
    assert {(x.dst, y.rate_Bps) for x, y in moved if isinstance(x, P.BgBucket)} == \
        {("10.0.0.2", 1_500_000), ("10.0.0.3", 3_500_000)}
    assert all(P.in_pair_slots(x.classid, P.WC_PAIR_CLASS_BASE) for x, _ in moved if isinstance(x, P.TcClass))


def test_plan_has_a_bg_and_a_wc_class_per_pair_with_stable_leaves():
    cfg = _cfg(demote_bg=False, lrc=policy().model_dump())
    a = P.tc_plan(cfg, {}, {"10.0.0.2": P.PairLimit(10, 20), "10.0.0.3": P.PairLimit(30, 0.0)})
    b = P.tc_plan(cfg, {"10.0.0.2": 0, "10.0.0.3": 1}, {"10.0.0.2": P.PairLimit(12, 50), "10.0.0.3": P.PairLimit(28, 1)})
    classes = {s.classid: s for s in a if isinstance(s, P.TcClass)}
    assert classes["1:100"].rate_bps == 10_000_000 and classes["1:300"].rate_bps == 20_000_000
    assert classes["1:301"].rate_bps == P.MIN_CLASS_BPS          # a WC ceiling of 0 is "nothing"
    filters = {s.pref: s for s in a if isinstance(s, P.TcFilter)}
    assert filters[P.WC_PAIR_PREF_BASE].tos == (P.TOS_WC, P.TOS_MASK) and filters[P.WC_PAIR_PREF_BASE].dst == "10.0.0.2"
    assert filters[P.PAIR_PREF_BASE + 1].tos == (P.TOS_BG, P.TOS_MASK)
    # only rates move between the two plans: same classes, filters and leaves
    assert [s for s in a if not isinstance(s, P.TcClass)] == [s for s in b if not isinstance(s, P.TcClass)]
    assert [s.classid for s in a if isinstance(s, P.TcClass)] == [s.classid for s in b if isinstance(s, P.TcClass)]
    paper = P.tc_plan(_cfg(False, wc_subflows=0, lrc=policy("paper").model_dump()), {}, {"10.0.0.2": P.PairLimit(60)})
    assert not any(isinstance(s, P.TcClass) and s.classid.startswith("1:3") for s in paper)


def test_lrc_policy_refused_by_name():
    with pytest.raises(P.PlanError, match="exclude each other"):
        _cfg(lrc=policy().model_dump(), pair_limits_mbps={"10.0.0.2": 5})
    with pytest.raises(P.PlanError, match="wc_subflows must be 0"):
        _cfg(wc_subflows=1, lrc=policy("paper").model_dump())
    with pytest.raises(P.PlanError, match="not an IPv4 address"):
        _cfg(lrc={"peers": {"h2": {"weight": 1, "guarantee_mbps": 1}}})
    with pytest.raises(P.PlanError, match="alpha"):
        _cfg(lrc={"params": {"alpha": float("nan")}})
    with pytest.raises(ValidationError):
        P.LrcPeer(weight=0, guarantee_mbps=1)


def test_proc_conntrack_text_parsed():
    from hostagent.lrc import parse_proc_conntrack
    text = ("ipv4     2 udp      17 29 src=10.9.0.1 dst=10.9.0.2 sport=44052 dport=9 [UNREPLIED] src=10.9.0.2 "
            "dst=10.9.0.1 sport=9 dport=44052 mark=0 zone=0 use=3\n"
            "ipv4     2 tcp      6 431999 ESTABLISHED src=10.9.0.1 dst=10.9.0.3 sport=5 dport=80 src=10.9.0.3 "
            "dst=10.9.0.1 sport=80 dport=5 [ASSURED] mark=0 zone=0 use=2\n"
            "ipv4     2 tcp      6 119 SYN_SENT src=10.9.0.1 dst=10.9.0.4 sport=59930 dport=80 [UNREPLIED] "
            "src=10.9.0.4 dst=10.9.0.1 sport=80 dport=59930 mark=0 zone=0 use=3\n"
            "ipv6     10 tcp      6 300 ESTABLISHED src=::1 dst=::1 sport=1 dport=2\n"
            "garbage line\nipv4 2 tcp 6 x ESTABLISHED src=1 dst=2\n")
    got = parse_proc_conntrack(text)
    assert got == [Entry("10.9.0.1", "10.9.0.2", 17, False, False, 29, 44052, 9),
                   Entry("10.9.0.1", "10.9.0.3", 6, True, True, 431999, 5, 80),
                   Entry("10.9.0.1", "10.9.0.4", 6, False, False, 119, 59930, 80)]
    assert active_peers(got, "10.9.0.1", {"10.9.0.2", "10.9.0.3", "10.9.0.4"}, 2.0, T) == {"10.9.0.2", "10.9.0.3"}
    # with nf_conntrack_acct: packets= and bytes= per direction
    acct = ("ipv4     2 tcp      6 299 ESTABLISHED src=10.0.0.1 dst=10.0.0.5 sport=56760 dport=7100 packets=9000 "
            "bytes=13000000 src=10.0.0.5 dst=10.0.0.1 sport=7100 dport=56760 packets=4500 bytes=234000 [ASSURED] "
            "mark=0 zone=0 use=4\n")
    e = parse_proc_conntrack(acct)[0]
    assert (e.orig_bytes, e.reply_bytes, e.key) == (13_000_000, 234_000, (6, "10.0.0.1", 56760, "10.0.0.5", 7100))


def test_a_pair_is_what_this_vm_sends_on_not_its_acks():
    def entries(sent, acks):      # we send data to .2 on a connection we opened; .3 sends data to us
        return [Entry(ME, "10.0.0.2", 6, True, True, 299, 1000, 80, sent, acks),
                Entry("10.0.0.3", ME, 6, True, True, 299, 2000, 80, 10 * sent, acks)]
    seen: dict = {}
    peers = {"10.0.0.2", "10.0.0.3"}
    assert active_peers(entries(10_000, 300), ME, peers, 2.0, T, seen) == set()          # first sight: no delta
    # we sent 1 MB to .2 (its ACKs: 30 kB); .3 sent 10 MB to us and got 30 kB of our ACKs: not a pair of ours
    assert active_peers(entries(1_010_000, 30_300), ME, peers, 2.0, T, seen) == {"10.0.0.2"}
    assert active_peers(entries(1_010_000, 30_300), ME, peers, 2.0, T, seen) == set()    # nothing moved
    # without byte counts (acct off): the idle rule alone, both directions
    bare = [Entry(ME, "10.0.0.2", 6, True, True, 299), Entry("10.0.0.3", ME, 6, True, True, 299)]
    assert active_peers(bare, ME, peers, 2.0, T, {}) == {"10.0.0.2", "10.0.0.3"}
