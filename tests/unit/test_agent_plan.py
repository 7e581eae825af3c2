"""Host agent planners and the paper's host-side formulas."""

import pytest

from hostagent import plan as P
from bwcommon.policy import (ALPHA_SCALE, PolicyError, competition_level, receive_buffer_bytes,
                              wc_increase_factor)


def _cfg(**kw):
    base = dict(host="s1", interface="s1-eth0", address="10.0.0.1", nic_mbps=100, guarantee_mbps=35)
    return P.HostConfig.from_dict({**base, **kw})


def test_eq7_wc_subflows_of_a_vm_sum_to_a_l_reno_flows():
    # AIMD rate grows as sqrt(alpha): K subflows at alpha = A^2/K^2 sum to A Reno flows
    for a_l in (0.5, 1.0, 4 / 3):
        for k in (1, 2, 3, 5):
            alpha = wc_increase_factor(a_l, k)
            assert k * alpha ** 0.5 == pytest.approx(a_l)
    assert wc_increase_factor(1.0, 1) == 1.0 and wc_increase_factor(1.0, 2) == 0.25
    with pytest.raises(PolicyError, match="K"):
        wc_increase_factor(1.0, 0)


def test_competition_levels_by_policy():
    assert competition_level("guarantee", 35, unit_mbps=7.5) == pytest.approx(35 / 7.5)
    assert competition_level("equal", 35) == 1.0
    assert competition_level("explicit", 35, explicit=0) == 0.0
    with pytest.raises(PolicyError, match="unknown fairness policy"):
        competition_level("fair", 35)
    with pytest.raises(PolicyError, match="explicit"):
        competition_level("explicit", 35)


def test_eq1_receive_buffer():
    # beta 3, 2 ms max RTT, 100 Mb/s in total: 3 * 0.002 * 100e6 / 8 = 75 000 B -> the floor
    assert receive_buffer_bytes(0.002, 100e6) == 128 * 1024
    assert receive_buffer_bytes(0.020, 1e9) == int(3 * 0.020 * 1e9 / 8)
    assert receive_buffer_bytes(0.020, 1e9, beta=4) == int(4 * 0.020 * 1e9 / 8)
    assert receive_buffer_bytes(10.0, 1e10) == 64 * 1024 * 1024          # capped
    with pytest.raises(PolicyError):
        receive_buffer_bytes(0.01, 1e6, beta=0)


def test_config_errors_name_every_problem():
    with pytest.raises(P.PlanError) as exc:
        _cfg(guarantee_mbps=150, wc_subflows=-1, address="10.0.0", policy="x", pair_limits_mbps={"h2": 5},
             stale_loss_cnt=0, rto_min_ms=0.5, ecn="on", pace_bg=1, rcvbuf_initial_kb=1)
    msg = str(exc.value)
    for part in ("guarantee_mbps 150", "wc_subflows -1", "address '10.0.0'", "policy 'x'", "'h2'",
                 "stale_loss_cnt 0", "rto_min_ms 0.5", "ecn 'on'", "pace_bg 1", "rcvbuf_initial_kb 1"):
        assert part in msg
    with pytest.raises(P.PlanError, match="unknown configuration keys"):
        _cfg(rate=5)
    with pytest.raises(P.PlanError, match="lacks guarantee_mbps"):
        P.HostConfig.from_dict(dict(host="s1", interface="e", address="10.0.0.1", nic_mbps=10))


def test_tc_plan_limits_bg_to_the_guarantee_and_leaves_wc_to_the_nic():
    steps = P.tc_plan(_cfg(demote_bg=False))
    qdisc = [s for s in steps if isinstance(s, P.TcQdisc)]
    classes = {s.classid: s for s in steps if isinstance(s, P.TcClass)}
    filters = [s for s in steps if isinstance(s, P.TcFilter)]
    assert qdisc == [P.TcQdisc("s1-eth0", "1:", P.CLASS_WC)]          # unmatched -> WC
    assert classes[P.CLASS_BG].rate_bps == classes[P.CLASS_BG].ceil_bps == 35_000_000
    assert classes[P.CLASS_WC].ceil_bps == 100_000_000 and classes[P.CLASS_WC].prio > classes[P.CLASS_BG].prio
    assert filters == [P.TcFilter("s1-eth0", 1000, (0x00, 0xFC), P.CLASS_BG)]
    # every class hangs under the root at the NIC rate; the root under the qdisc
    assert all(c.parent == P.CLASS_ROOT for k, c in classes.items() if k != P.CLASS_ROOT)
    # leaf FIFOs take whole GSO super-packets (64 KiB): a shorter one stalls TCP
    leaves = {s.parent: s.limit_bytes for s in steps if isinstance(s, P.TcLeaf)}
    assert set(leaves) == {P.CLASS_BG, P.CLASS_WC} and min(leaves.values()) >= 2 * 65536


def test_the_marker_holds_the_hose_so_bg_may_borrow_to_the_nic():
    cfg = _cfg()
    marks = P.marker_plan(cfg)
    # 35 Mb/s in bytes/s, as deep as the ToR meter's burst (50 ms at the rate here)
    assert marks == [P.BgBucket("10.0.0.1", None, 4_375_000, 218_750), P.TcMarker("s1-eth0")]
    classes = {s.classid: s for s in P.tc_plan(cfg) if isinstance(s, P.TcClass)}
    assert classes[P.CLASS_BG].rate_bps == 35_000_000 and classes[P.CLASS_BG].ceil_bps == 100_000_000
    assert classes[P.CLASS_BG].prio < classes[P.CLASS_WC].prio
    # young flows' WC (bwf_mark steers it) has WC's share; the rest of WC a 1 % floor, borrowing to the NIC
    young, wc = classes[P.CLASS_YOUNG], classes[P.CLASS_WC]
    assert (young.rate_bps, young.ceil_bps) == (65_000_000, 100_000_000) and young.prio == wc.prio
    assert (wc.rate_bps, wc.ceil_bps) == (1_000_000, 100_000_000)
    assert {s.parent for s in P.tc_plan(cfg) if isinstance(s, P.TcLeaf)} == {P.CLASS_BG, P.CLASS_WC, P.CLASS_YOUNG}
    # small guarantees: two GSO super-packets deep; nothing guaranteed is still a bucket (8 kb/s)
    assert P.marker_plan(_cfg(guarantee_mbps=0.5))[0] == P.BgBucket("10.0.0.1", None, 62_500, 131_072)
    assert P.marker_plan(_cfg(guarantee_mbps=0))[0].rate_Bps == P.MIN_CLASS_BPS // 8
    # the bucket's key and value as bwf_mark reads them: (saddr, daddr) in network order; u64 LE
    b = P.BgBucket("10.0.0.1", "10.0.0.9", 1, 2)
    assert b.key() == bytes([10, 0, 0, 1, 10, 0, 0, 9]) and b.value() == (1).to_bytes(8, "little") + \
        (2).to_bytes(8, "little")
    assert P.marker_plan(cfg)[0].key() == bytes([10, 0, 0, 1, 0, 0, 0, 0])
    # off: no marker, BG held at its rate by HTB
    other = _cfg(demote_bg=False)
    assert P.marker_plan(other) == []
    bg = next(s for s in P.tc_plan(other) if isinstance(s, P.TcClass) and s.classid == P.CLASS_BG)
    assert bg.ceil_bps == bg.rate_bps
    assert P.CLASS_YOUNG not in {s.classid for s in P.tc_plan(other) if isinstance(s, P.TcClass)}
    # the whole plan puts the bucket and the marker in
    assert {type(s) for s in P.host_plan(cfg).steps} >= {P.BgBucket, P.TcMarker}


def test_tc_plan_pipe_model_adds_per_destination_bg_classes_tried_first():
    steps = P.tc_plan(_cfg(pair_limits_mbps={"10.0.0.6": 20, "10.0.0.5": 10}, demote_bg=False))
    filters = sorted((s for s in steps if isinstance(s, P.TcFilter)), key=lambda f: f.pref)
    assert [(f.dst, f.target) for f in filters] == [("10.0.0.5", "1:100"), ("10.0.0.6", "1:101"),
                                                    (None, P.CLASS_BG)]
    rates = {s.classid: s.rate_bps for s in steps if isinstance(s, P.TcClass)}
    assert rates["1:100"] == 10_000_000 and rates["1:101"] == 20_000_000


def test_with_the_marker_each_pair_is_a_bucket_under_the_hose_not_a_class():
    """Pipe model and LRC: a pair's BG limit is a bucket of bwf_mark (key
    source, destination), the hose's bucket first in the plan; no BG class
    per pair (the hose class borrows to the NIC); LRC's WC ceilings (``wc:
    ceiling``) stay HTB classes."""
    cfg = _cfg(pair_limits_mbps={"10.0.0.6": 20, "10.0.0.5": 10})
    marks = P.marker_plan(cfg)
    assert marks[0] == P.BgBucket("10.0.0.1", None, 4_375_000, 218_750)
    assert marks[1:3] == [P.BgBucket("10.0.0.1", "10.0.0.5", 1_250_000, 131_072),
                          P.BgBucket("10.0.0.1", "10.0.0.6", 2_500_000, 131_072)]
    assert marks[3] == P.TcMarker("s1-eth0")
    steps = P.tc_plan(cfg)
    assert not any(isinstance(s, P.TcClass) and P.in_pair_slots(s.classid, P.PAIR_CLASS_BASE) for s in steps)
    assert [f.target for f in steps if isinstance(f, P.TcFilter)] == [P.CLASS_BG]
    bg = next(s for s in steps if isinstance(s, P.TcClass) and s.classid == P.CLASS_BG)
    assert bg.ceil_bps == 100_000_000
    # LRC's limits in force, in place of the pipe model's: their BG as buckets, their WC ceilings as classes
    lrc_cfg = _cfg(lrc={"peers": {"10.0.0.2": {"weight": 1, "guarantee_mbps": 5}}})
    limits = {"10.0.0.2": P.PairLimit(4.0, 6.0)}
    assert P.BgBucket("10.0.0.1", "10.0.0.2", 500_000, 131_072) in P.marker_plan(lrc_cfg, limits)
    classes = {s.classid: s for s in P.tc_plan(lrc_cfg, None, limits) if isinstance(s, P.TcClass)}
    assert classes[f"1:{P.WC_PAIR_CLASS_BASE:x}"].ceil_bps == 6_000_000
    assert f"1:{P.PAIR_CLASS_BASE:x}" not in classes
    assert [b for b in P.host_plan(lrc_cfg, lrc_limits=limits).of(P.BgBucket) if b.dst] == \
        [P.BgBucket("10.0.0.1", "10.0.0.2", 500_000, 131_072)]


def test_nft_plan_marks_joins_wc_and_everything_else_bg():
    table = P.nft_plan(_cfg())
    lines = [ln.strip() for ln in table.text.splitlines()]
    join = "tcp flags syn tcp option mptcp subtype 1 ct mark set 0x20"
    assert lines.count(join) == 2                                    # our SYNs out, the peer's in
    assert "ct mark 0x20 ip dscp set cs1" in lines and "ct mark != 0x20 ip dscp set cs0" in lines
    assert lines.index("ct mark 0x20 ip dscp set cs1") > lines.index(join)
    assert "type filter hook prerouting priority mangle; policy accept;" in lines
    # only the connecting side joins: announcements from our own clients are dropped on the way in
    pre = lines[lines.index("chain pre {"):lines.index("chain out {")]
    assert "ct direction original tcp option mptcp subtype 3 drop" in pre


def test_mptcp_sysctl_and_bpf_plans():
    cfg = _cfg(wc_subflows=2, unit_mbps=7.5)
    mp = P.mptcp_plan(cfg)
    assert mp[0] == P.MptcpLimits(2, 2)
    assert [(e.id, e.port, e.flags) for e in mp[1:]] == [(101, 10101, "signal"), (102, 10102, "signal")]
    assert P.mptcp_plan(_cfg(wc_subflows=0)) == [P.MptcpLimits(0, 0)]
    sysctls = {s.key: s.value for s in P.sysctl_plan(cfg, rcvbuf_bytes=500000)}
    assert sysctls["net.mptcp.enabled"] == "1" and sysctls["net.ipv4.tcp_rmem"] == "4096 500000 500000"
    # the window a connection opens with: rcvbuf_initial_kb (3 MiB), at most B
    big = {s.key: s.value for s in P.sysctl_plan(cfg, rcvbuf_bytes=6_000_000)}
    assert big["net.ipv4.tcp_rmem"] == "4096 3145728 6000000"
    small = {s.key: s.value for s in P.sysctl_plan(_cfg(rcvbuf_initial_kb=64), rcvbuf_bytes=6_000_000)}
    assert small["net.ipv4.tcp_rmem"] == "4096 65536 6000000"
    # the connection-level send buffer: tcp_wmem[0] is what an MPTCP socket holds beyond its subflows
    assert sysctls["net.ipv4.tcp_wmem"] == "500000 500000 500000"
    assert sysctls["net.mptcp.stale_loss_cnt"] == "4"
    assert sysctls["net.ipv4.tcp_ecn"] == "1"                         # WC queues mark instead of dropping
    assert {s.key: s.value for s in P.sysctl_plan(_cfg(ecn=False))}["net.ipv4.tcp_ecn"] == "2"
    assert {s.key: s.value for s in P.sysctl_plan(_cfg(stale_loss_cnt=1))}["net.mptcp.stale_loss_cnt"] == "1"
    assert "net.ipv4.tcp_rto_min_us" not in sysctls                  # the kernel's own unless configured
    assert {s.key: s.value for s in P.sysctl_plan(_cfg(rto_min_ms=10))}["net.ipv4.tcp_rto_min_us"] == "10000"
    assert "net.ipv4.tcp_rto_max_ms" not in sysctls
    assert {s.key: s.value for s in P.sysctl_plan(_cfg(rto_max_ms=1000))}["net.ipv4.tcp_rto_max_ms"] == "1000"
    for bad in (999, 120_001, 1.5, float("nan"), True):
        with pytest.raises(P.PlanError, match="rto_max_ms"):
            _cfg(rto_max_ms=bad)
    # A_l for bwf_wc; BG paced at 0.98 x its 35 Mb/s guarantee (what the bucket counts beyond TCP's
    # bytes: frame headers, returned ACKs), in bytes/s, for bwf_sockops
    # (and no entry of another run's for this address in the maps whose key it owns: BG/WC, paced or not)
    assert P.bpf_plan(cfg) == [P.BpfMapSet(P.BPF_MAP, "10.0.0.1", round(35 / 7.5 * ALPHA_SCALE)),
                               P.BpfMapAbsent(P.BPF_CCSEL_MAP, "10.0.0.1"),
                               P.BpfMapSet(P.BPF_PACE_MAP, "10.0.0.1", round(35e6 / 8 * 0.98))]
    assert P.bpf_plan(_cfg(pace_bg=False))[1:] == [P.BpfMapAbsent(P.BPF_CCSEL_MAP, "10.0.0.1"),
                                                   P.BpfMapAbsent(P.BPF_PACE_MAP, "10.0.0.1")]
    assert [type(s) for s in P.bpf_plan(_cfg(guarantee_mbps=0))][-1] is P.BpfMapAbsent     # no guarantee: not paced
    whole = P.host_plan(cfg)
    assert len(whole.of(P.NftTable)) == 1 and whole == P.host_plan(cfg)  # deterministic


def test_the_tenants_mptcp_congestion_control_is_a_bwf_ccsel_entry():
    # bgwc (the default) is no entry; each coupled one is its index in MPTCP_CCS, a u32 for bwf_sockops
    # (bgwc: no entry, and none of another run's for this address either)
    assert [s for s in P.bpf_plan(_cfg()) if s.map == P.BPF_CCSEL_MAP] == [P.BpfMapAbsent(P.BPF_CCSEL_MAP,
                                                                                           "10.0.0.1")]
    for i, kind in enumerate(P.MPTCP_CCS):
        steps = [s for s in P.bpf_plan(_cfg(mptcp_cc=kind)) if s.map == P.BPF_CCSEL_MAP]
        assert steps == ([P.BpfMapAbsent(P.BPF_CCSEL_MAP, "10.0.0.1")] if kind == "bgwc" else
                         [P.BpfMapSet(P.BPF_CCSEL_MAP, "10.0.0.1", i, width=4)])
    # the order is bwf_sockops' (set_coupled: 1 LIA, 2 MPTCP-D, 3 LIA-VM, 4 Reno)
    assert P.MPTCP_CCS[1:] == ("lia", "mptcp_d", "lia_vm", "uncoupled")
    with pytest.raises(P.PlanError, match="mptcp_cc"):
        _cfg(mptcp_cc="cubic")


SS_SAMPLE = """ESTAB 0      0      10.9.1.1:37807 10.9.1.2:10101
\t bwf_wc wscale:9,9 rto:204 rtt:2.489/4.425 mss:1448 cwnd:110 send 511948574bps delivery_rate 2734976bps tcp-ulp-mptcp flags:Jjec
ESTAB 0      3360   10.9.1.1:42874 10.9.1.2:5001
\t reno wscale:9,9 rto:220 rtt:19.891/7.242 mss:1448 cwnd:138 delivery_rate 24522528bps tcp-ulp-mptcp flags:Mmec
ESTAB 0      0      10.9.1.1:22 10.9.1.5:40000
\t cubic wscale:7,7 rto:204 rtt:0.5/0.2 mss:1448 delivery_rate 1000000bps
"""


def test_live_subflows_feed_eq1():
    from hostagent.observe import Subflow, buffer_inputs, parse_ss
    subs = parse_ss(SS_SAMPLE)
    assert len(subs) == 2                                  # the plain TCP socket is not a subflow
    max_rtt, total = buffer_inputs(subs)
    assert max_rtt == pytest.approx(0.019891) and total == pytest.approx(2734976 + 24522528)
    assert len(parse_ss(SS_SAMPLE, mptcp_only=False)) == 3
    assert buffer_inputs([]) == (0.0, 0.0)
    # Eq. 1 with these: 3 * 19.9 ms * 27.3 Mb/s / 8 = 203 KB
    assert receive_buffer_bytes(max_rtt, total) == int(3 * 0.019891 * (2734976 + 24522528) / 8)
    # a receiver: its own rtt times ACKs only; rcv_rtt and rcv_space give the round trip and rate it sees
    rx = parse_ss("ESTAB 0 0 10.0.0.5:10101 10.0.0.1:35679\n\t bwf_wc rtt:1/0.5 ato:48 mss:8948 cwnd:10 "
                  "app_limited rcv_rtt:15.75 rcv_space:56588 tcp-ulp-mptcp flags:Jec\n")
    assert rx == [Subflow(0.01575, pytest.approx(56588 * 8 / 0.01575))]


def test_bgwc_share_error_and_window_mean():
    from experiments.bgwc import share_error, window_mean
    assert share_error({"a": 2.0, "b": 1.0}, {"a": 2, "b": 1}) == pytest.approx(0.0)
    assert share_error({"a": 1.0, "b": 1.0}, {"a": 2, "b": 1}) == pytest.approx(0.5)   # b: 1/2 vs 1/3
    assert share_error({"a": 1.0, "b": 1.0, "c": 5.0}, {"a": 1, "b": 1, "c": 0}) is not None
    assert share_error({"a": 0.0}, {"a": 1}) is None
    rates = [{"t": 1.0, "x": 2.0}, {"t": 2.0, "x": 4.0}, {"t": 3.0, "x": 6.0}]
    assert window_mean(rates, "x", 1.0, 3.0) == 5.0 and window_mean(rates, "y", 0, 9) == 0.0


def test_eq1_sizer_keeps_the_largest_rtt_of_its_window_and_the_nic_rate():
    from hostagent.observe import BufferSizer
    nic = 100e6
    sizer = BufferSizer(window_s=30, change=0.2)
    assert sizer.update(0.0, 0.0, nic, 3, None) is None                 # nothing live: nothing to size
    b = sizer.update(1.0, 0.040, nic, 3, None)
    assert b == int(3 * 0.040 * nic / 8)                                 # 1.5 MB for 40 ms at 100 Mb/s
    assert sizer.update(3.0, 0.045, nic, 3, b) is None                   # within 20 %: left alone
    assert sizer.update(5.0, 0.010, nic, 3, b) is None                   # a lull keeps the 40 ms peak
    bigger = sizer.update(7.0, 0.100, nic, 3, b)
    assert bigger == int(3 * 0.100 * nic / 8)
    # 30 s after the 100 ms peak only the lull's samples remain -> shrinks
    assert sizer.update(37.5, 0.010, nic, 3, bigger) == int(3 * 0.010 * nic / 8)
    # the configured hint is a floor: measured RTTs raise the buffer, never lower it below the hint's
    assert sizer.update(38.0, 0.010, nic, 3, None, floor_rtt_s=0.050) == int(3 * 0.050 * nic / 8)


def test_fig13_verdict_on_a_synthetic_trace():
    from experiments.bgwc import fig13_verdict
    rates = []
    for i in range(1, 81):                       # 0.5 s samples, 40 s
        t = i * 0.5
        r = {"t": t, "bg-s1": 35.0, "wc-s1": 5.0, "bg-s3": 20.0, "wc-s3": 0.0, "bg-s4": 10.0, "wc-s4": 0.0}
        if t <= 10:                              # S2 runs until 10 s...
            r.update({"bg-s2": 25.0, "wc-s2": 5.0})
        elif t <= 11:                            # ...the others' WC needs 1 s to take its 30 Mb/s
            r.update({"wc-s1": 10.0, "wc-s3": 5.0, "wc-s4": 5.0})
        elif t <= 25:
            r.update({"wc-s1": 15.0, "wc-s3": 10.0, "wc-s4": 10.0})
        elif t <= 26:                            # S2 back at 25 s: slow start for 1 s
            r.update({"bg-s2": 10.0})
        else:
            r.update({"bg-s2": 24.5 if t != 28 else 20.0, "wc-s2": 1.0})
        rates.append(r)
    v = fig13_verdict(rates, 10.0, 25.0, 25.0, 100.0)
    assert v["freed_mbps"] == pytest.approx(30.0)
    assert v["captured_fraction_2s"] == pytest.approx(1.0) and v["link_use_2s_after_stop"] == pytest.approx(1.0)
    # 24.5 >= 97 % of 25 from 26.5 s on, but the dip at 28 s breaks that hold: held from 28.5 s
    assert v["s2_regained_97pct_after_s"] == pytest.approx(3.5)
    assert v["s2_regained_97pct_1s_means_after_s"] == pytest.approx(4.0)   # the dip is in (27, 29]'s means
    assert v["s2_bg_2_to_4s_after_restart_of_guarantee"] == pytest.approx((3 * 24.5 + 20) / 4 / 25)  # (27, 29]
    # back at 99 % in 0.5 s samples of 96 % / 102 %: never held per sample, held on 1 s means from 27 s
    for r in rates:
        if r["t"] > 26:
            r["bg-s2"] = 24.0 if int(r["t"] * 2) % 2 else 25.5
    v = fig13_verdict(rates, 10.0, 25.0, 25.0, 100.0)
    assert v["s2_regained_97pct_after_s"] is None
    assert v["s2_regained_97pct_1s_means_after_s"] == pytest.approx(2.0)


def test_backup_toggling_rule():
    from experiments.bgwc import decide_backup
    assert decide_backup(True, [True, True], 3, 5) is True                 # not yet 3 busy samples
    assert decide_backup(True, [False, True, True, True], 3, 5) is False   # BG queued 3 times: let WC help
    assert decide_backup(False, [False] * 4, 3, 5) is False                # idle for 4 samples only
    assert decide_backup(False, [True] + [False] * 5, 3, 5) is True        # idle 5: WC back to backup
    assert decide_backup(False, [False, True, False, False, False], 3, 5) is False


def test_meter_stats_parsing():
    from experiments.bgwc import parse_meter_stats
    text = ("OFPST_METER reply (OF1.3) (xid=0x2):\n"
            "meter:4 flow_count:1 packet_in_count:616 byte_in_count:5040756 duration:8.584s bands:\n"
            "0: packet_count:0 byte_count:0\n\n"
            "meter:1 flow_count:1 packet_in_count:1969 byte_in_count:17305867 duration:8.584s bands:\n"
            "0: packet_count:12 byte_count:107376\n")
    assert parse_meter_stats(text) == {4: {"packets": 616, "dropped": 0}, 1: {"packets": 1969, "dropped": 12}}


def test_sched_best_prefers_the_simplest_within_the_margin():
    from experiments.bgwc import sched_best

    def v(paced, bg, link):
        return {"paced_bg_share": paced, "backlogged_bg_of_guarantee": bg, "backlogged_link_use": link}
    measured = {"default": v(0.995, 0.998, 0.987), "backup": v(1.0, 0.999, 0.349), "toggle": v(0.993, 0.998, 0.994)}
    assert sched_best(measured) == "default"                     # toggle's 0.993 vs 0.987: not worth a loop
    measured["default"] = v(0.60, 0.98, 0.87)                    # the paper's Fig. 5 problem
    assert sched_best(measured) == "toggle"


def test_bgwc_config_refuses_bad_options_by_name():
    from experiments.bgwc import Config
    from experiments.options import OptionError
    Config(queue_kb=1000).check()
    for bad, name in ((dict(queue_kb=2), "queue_kb"), (dict(queue_kb=10, mtu=9000), "queue_kb"), (dict(mtu=100), "mtu"), (dict(kind="fig99"), "kind"),
                      (dict(beta=0), "beta"), (dict(reps=0), "reps"), (dict(rcvbuf_initial_kb=2), "rcvbuf_initial_kb"),
                      (dict(rtt_hint_ms=-1), "rtt_hint_ms"), (dict(rtt_hint_ms=20_000), "rtt_hint_ms")):
        with pytest.raises(OptionError, match=name):
            Config(**bad).check()
    Config(queue_kb=10, mtu=1500).check()       # two 1500-byte packets fit in 10 KB
    Config(rcvbuf_initial_kb=0).check()         # 0: the agents' default
    Config(rtt_hint_ms=0).check()
    from experiments.bgwc import agent_defaults
    assert not {"rcvbuf_initial_kb", "rtt_hint_ms", "rto_min_ms"} & set(agent_defaults(
        Config(rcvbuf_initial_kb=0, rtt_hint_ms=0)))                          # the agents' own defaults
    got = agent_defaults(Config(rcvbuf_initial_kb=8192, rtt_hint_ms=200, link_mbps=60))
    assert (got["rcvbuf_initial_kb"], got["rtt_hint_ms"], got["unit_mbps"]) == (8192, 200, pytest.approx(4.5))


@pytest.mark.parametrize("kind", ["fig12", "table3", "adversarial"])
def test_bgwc_configures_bwfabric_through_a_config_file_that_passes_its_checks(tmp_path, kind):
    from controller import config, tenancy
    from experiments.bgwc import Config, pair_tenants, write_config
    from mininet_topos import builders
    cfg = Config(kind=kind, link_mbps=60)
    builders.bgwc_testbed(link_mbps=60).save(tmp_path / "topology.json")
    path, unmanaged = write_config(cfg, tmp_path, 18080)
    loaded = config.load(path)
    assert (tuple(loaded.cfg.agents.unmanaged), bool(tenancy.meter_rates(loaded))) == (
        (("s4",), True) if kind == "adversarial" else ((), kind != "table3"))
    assert "s4" not in tenancy.host_configs(loaded) if kind == "adversarial" else True
    # every Table 3 row is admitted; a row's "off" sender has no tenant
    for row in ((400, 200, 200), (400, 200, None)):
        g = {s: (r or 0) * cfg.scale for s, r in zip(("s1", "s2", "s3"), row)}
        tenants = pair_tenants(cfg, g, explicit={s: 1.0 for s in g})
        assert config.from_data({**loaded.raw, "tenants": tenants}).cfg.tenants.keys() == {
            f"p{s[1:]}" for s, v in g.items() if v}


SS_STALL = """ESTAB 0 2895360 10.0.0.1:48252 10.0.0.5:7100
\t reno wscale:9,9 rto:204 rtt:2.1/0.3 mss:8948 cwnd:12 ssthresh:9 bytes_acked:9437 pacing_rate 22050000bps delivery_rate 20811000bps unacked:9 retrans:0/3 lastsnd:4 rcv_ssthresh:64076 snd_wnd:524288 lastack:4 tcp-ulp-mptcp flags:Mmec token:0000(id:0)/1a1bf318(id:0) seq:1 sfseq:1 ssnoff:1 maplen:0
ESTAB 0 65536 10.0.0.1:39817 10.0.0.5:10101
\t bwf_wc wscale:9,9 rto:1632 backoff:3 rtt:48.2/12 mss:8948 cwnd:1 ssthresh:2 unacked:4 lost:4 retrans:1/57 lastsnd:812 lastack:1630 busy:900ms rwnd_limited:450ms(50.0%) tcp-ulp-mptcp flags:Jjec token:c5a26b77(id:0)/1a1bf318(id:0) seq:1 sfseq:0 ssnoff:2 maplen:0
ESTAB 0 0 10.0.0.1:22 10.0.0.9:5000
\t cubic rto:204 rtt:1/0.5 cwnd:10
"""


def test_subflow_states_tell_a_wc_subflow_in_rto_backoff():
    from hostagent.observe import subflow_states
    bg, wc = subflow_states(SS_STALL)          # the plain TCP socket is not a subflow
    assert (bg["role"], bg["send_q"], bg["cwnd"], bg["backoff"], bg["retrans"]) == ("bg", 2895360, 12, 0, 3)
    assert (wc["role"], wc["rto"], wc["backoff"], wc["lost"], wc["lastack"]) == ("wc", 1632, 3, 4, 1630)
    assert (wc["rwnd_limited"], bg["rwnd_limited"]) == (50.0, 0.0)
    assert wc["local"] == "10.0.0.1:39817" and wc["peer"] == "10.0.0.5:10101" and wc["retrans"] == 57
    assert (wc["rtt"], wc["ssthresh"], bg["rtt"]) == (48.2, 2, 2.1)      # smoothed RTT (ms), not minrtt
    assert (bg["pacing_rate"], bg["delivery_rate"], wc["pacing_rate"]) == (22050000, 20811000, 0)
    assert (bg["snd_wnd"], bg["rcv_ssthresh"], bg["bytes_acked"]) == (524288, 64076, 9437)


def test_meter_rates_use_each_counters_own_read_times():
    from experiments.bgwc import interval_rates
    # s6 was read 0.1 s late at the second sample: 1.25 MB over 1.1 s, not over the 1.0 s between samples
    samples = [(0.0, {"bg-s1": 0, "bg-s2": 0}, {"bg-s1": 0.0, "bg-s2": 0.0}),
               (1.0, {"bg-s1": 1_250_000, "bg-s2": 1_375_000}, {"bg-s1": 1.0, "bg-s2": 1.1}),
               (2.0, {"bg-s1": 2_500_000, "bg-s2": 2_500_000, "wc-s1": 10}, {"bg-s1": 2.0, "bg-s2": 2.0, "wc-s1": 2.0})]
    rows = interval_rates(samples)
    assert [r["t"] for r in rows] == [1.0, 2.0]
    assert rows[0]["bg-s1"] == pytest.approx(10.0) and rows[0]["bg-s2"] == pytest.approx(10.0)
    assert rows[1]["bg-s2"] == pytest.approx(10.0)          # 1.125 MB in 0.9 s
    assert rows[1]["wc-s1"] == 0.0                           # a counter first seen: no interval yet


def test_msk_queues_read_connection_level_queues():
    from hostagent.observe import msk_queues
    text = ("ESTAB 87274  0      10.0.0.5:7100 10.0.0.1:57146\n"
            "\t subflows_max:2 remote_key token:c11aac25 write_seq:851998a43820943c snd_una:851998a43820943c "
            "rcv_nxt:baa8cf898a27484a\n"
            "LISTEN 0 4096 0.0.0.0:7100 0.0.0.0:*\n")
    assert msk_queues(text) == [{"local": "10.0.0.5:7100", "peer": "10.0.0.1:57146", "recv_q": 87274, "send_q": 0,
                                 "write_seq": 0x851998a43820943c, "snd_una": 0x851998a43820943c,
                                 "rcv_nxt": 0xbaa8cf898a27484a},
                                {"local": "0.0.0.0:7100", "peer": "0.0.0.0:*", "recv_q": 0, "send_q": 4096}]


def test_the_coupled_parameters_default_to_the_programs_own():
    """A host's default tuning writes into bwf_ccconf exactly the defaults
    bwf_coupled.bpf.c falls back to (conf(CONF_X, default)), so a host whose
    operator tunes nothing runs the controls as documented; only MPTCP-D
    and LIA-VM VMs plan the entries."""
    import re
    from pathlib import Path as FsPath
    src = (FsPath(P.__file__).parent / "bpf" / "bwf_coupled.bpf.c").read_text()
    index = {name: int(i) for name, i in re.findall(r"#define (CONF_\w+)\s+(\d+)", src)}
    defaults = {index[name]: int(d) for name, d in re.findall(r"conf\((CONF_\w+), (\d+)\)", src)}
    base = dict(host="h1", interface="h1-eth0", address="10.0.0.1", nic_mbps=100, guarantee_mbps=1)
    for kind in ("mptcp_d", "lia_vm"):
        steps = P.ccconf_plan(P.HostConfig.from_dict({**base, "mptcp_cc": kind}))
        assert {s.index: s.value for s in steps} == {**{i: defaults[i] for i, _ in P.CCCONF.values()},
                                                     P.CCCONF_ESE_OFF: defaults[P.CCCONF_ESE_OFF]}
    for kind in ("bgwc", "lia", "uncoupled"):
        assert P.ccconf_plan(P.HostConfig.from_dict({**base, "mptcp_cc": kind})) == []
    tuned = P.ccconf_plan(P.HostConfig.from_dict({**base, "mptcp_cc": "mptcp_d", "ese_beta": 0.35, "ese": False}))
    assert {s.index: s.value for s in tuned}[2] == 350 and {s.index: s.value for s in tuned}[6] == 1


def test_a_coupled_vm_keeps_the_kernels_send_buffer_shape():
    """BG/WC's send-buffer floor (tcp_wmem[0] = B) is for subflows bwf_sockops
    clamps; a VM on a coupled control gets the kernel's shape with B as the
    ceiling (with the floor at B, ESE's closings deadlocked its connections)."""
    base = dict(host="h1", interface="h1-eth0", address="10.0.0.1", nic_mbps=100, guarantee_mbps=1)
    for kind, want in (("bgwc", lambda b: f"{b} {b} {b}"), ("mptcp_d", lambda b: f"4096 16384 {b}"),
                       ("lia", lambda b: f"4096 16384 {b}")):
        sysctls = {s.key: s.value for s in P.sysctl_plan(P.HostConfig.from_dict({**base, "mptcp_cc": kind}),
                                                         rcvbuf_bytes=500_000)}
        assert sysctls["net.ipv4.tcp_wmem"] == want(500_000), kind


# ---- per-pair slots: a destination keeps its class and filter while it stays (issue #33's survivors) ----
def test_pair_slots_keep_every_kept_destination_and_fill_the_lowest_free():
    first = P.pair_slots(["10.0.0.9", "10.0.0.3", "10.0.0.5"])
    assert first == {"10.0.0.3": 0, "10.0.0.5": 1, "10.0.0.9": 2}          # address order, from 0
    # 10.0.0.5 leaves, 10.0.0.4 and 10.0.0.7 come: the others keep theirs, the new take slot 1, then 3
    second = P.pair_slots(["10.0.0.3", "10.0.0.9", "10.0.0.7", "10.0.0.4"], first)
    assert second == {"10.0.0.3": 0, "10.0.0.9": 2, "10.0.0.4": 1, "10.0.0.7": 3}
    # kept slots as the kernel has them, whatever order they were given in
    assert P.pair_slots(["10.0.0.3", "10.0.0.9"], {"10.0.0.9": 7, "10.0.0.3": 4}) == {"10.0.0.3": 4, "10.0.0.9": 7}


def test_pair_slots_start_afresh_from_a_corrupt_read_back():
    # two destinations in one slot, or a slot out of range: the read-back is not to be trusted
    assert P.pair_slots(["10.0.0.3", "10.0.0.9"], {"10.0.0.3": 5, "10.0.0.9": 5}) == {"10.0.0.3": 0, "10.0.0.9": 1}
    assert P.pair_slots(["10.0.0.3"], {"10.0.0.3": P.MAX_PAIRS}) == {"10.0.0.3": 0}
    assert P.pair_slots(["10.0.0.3"], {"10.0.0.3": -1}) == {"10.0.0.3": 0}
    with pytest.raises(P.PlanError, match=f"at most {P.MAX_PAIRS}"):
        P.pair_slots([f"10.0.{i // 250}.{i % 250 + 1}" for i in range(P.MAX_PAIRS + 1)])


def test_in_pair_slots_is_exactly_the_slot_range():
    base = P.PAIR_CLASS_BASE
    assert P.in_pair_slots(f"1:{base:x}", base) and P.in_pair_slots(f"1:{base + P.MAX_PAIRS - 1:x}", base)
    assert not P.in_pair_slots(f"1:{base - 1:x}", base) and not P.in_pair_slots(f"1:{base + P.MAX_PAIRS:x}", base)
    assert not P.in_pair_slots(f"2:{base:x}", base) and not P.in_pair_slots("1:zz", base)


def test_pair_slots_at_their_edges():
    """Address order, not text order, for new destinations (10.0.0.10 after
    10.0.0.9); a kept slot 0 is kept; exactly MAX_PAIRS destinations fit,
    one more is refused by name."""
    assert P.pair_slots(["10.0.0.10", "10.0.0.9"]) == {"10.0.0.9": 0, "10.0.0.10": 1}
    assert P.pair_slots(["10.0.0.3", "10.0.0.9"], {"10.0.0.9": 0}) == {"10.0.0.9": 0, "10.0.0.3": 1}
    many = [f"10.1.{i // 250}.{i % 250 + 1}" for i in range(P.MAX_PAIRS)]
    assert sorted(P.pair_slots(many).values()) == list(range(P.MAX_PAIRS))
    with pytest.raises(P.PlanError, match=f"{P.MAX_PAIRS + 1} pair destinations, at most {P.MAX_PAIRS}"):
        P.pair_slots([*many, "10.9.9.9"])


def test_a_nic_puts_bg_before_wc_exactly():
    """The NIC's (and a switch port's) tree, step by step: unmatched
    traffic is BG; BG (prio 0) holds the rate less WC's floor, WC (prio 1)
    its floor and borrows up to the rate; each a byte FIFO; ToS 0x20 to
    WC."""
    steps = P.nic_plan("eth0", 10e6, 225_000)
    assert steps == [
        P.TcQdisc("eth0", "1:", "1:10"),
        P.TcClass("eth0", "1:1", "1:", 10_000_000, 10_000_000, 0),
        P.TcClass("eth0", "1:10", "1:1", 9_900_000, 10_000_000, 0),
        P.TcLeaf("eth0", "1:10", "1010:", 225_000),
        P.TcClass("eth0", "1:20", "1:1", 100_000, 10_000_000, 1),
        P.TcLeaf("eth0", "1:20", "1020:", 225_000),
        P.TcFilter("eth0", 1, (0x20, 0xfc), "1:20"),
    ]
    # the floor is at least 8 kb/s (HTB needs a rate): 1 % of 1 Mb/s is 10 kb/s, of 500 kb/s 8 kb/s
    assert P.nic_plan("eth0", 1e6, 1)[4].rate_bps == 10_000
    assert P.nic_plan("eth0", 500e3, 1)[4].rate_bps == 8_000
    assert P.nic_plan("eth0", 10e6, 1, wc_floor_fraction=0.25)[2].rate_bps == 7_500_000


@pytest.mark.parametrize("rate, queue, fraction", [
    (16_000, 100, 0.01),        # the rate is exactly twice the floor
    (10e6, 0, 0.01), (10e6, -1, 0.01),
    (10e6, 100, 0.0), (10e6, 100, 0.5), (10e6, 100, -0.1),
    (10_000_001, 100, 0.5)])    # an odd rate: half of it floored leaves the rate above twice the floor
def test_a_nic_plan_that_cannot_work_is_refused_by_name(rate, queue, fraction):
    with pytest.raises(P.PlanError, match="eth0: need a rate above twice WC's floor"):
        P.nic_plan("eth0", rate, queue, wc_floor_fraction=fraction)


def test_a_nic_plan_just_inside_its_edges():
    assert P.nic_plan("eth0", 16_001, 1)[2].rate_bps == 8_001          # just above twice the floor
    assert P.nic_plan("eth0", 10e6, 1, wc_floor_fraction=0.49)[4].rate_bps == 4_900_000


def test_a_nic_queue_is_20_ms_at_its_rate_at_least_150_frames():
    assert P.nic_queue_bytes(10e6) == 225_000                # 150 x 1500 B (20 ms would be 25 kB)
    assert P.nic_queue_bytes(90e6) == 225_000
    assert P.nic_queue_bytes(90_000_400) == 225_001          # 20 ms just past 150 frames
    assert P.nic_queue_bytes(1e9) == 2_500_000


def test_the_sysctls_a_vm_gets():
    """Eq. 1 at the NIC rate and the RTT hint (3 x 50 ms x 100 Mb/s / 8 =
    1,875,000 B) as the receive ceiling and the whole send buffer (BG/WC);
    a coupled control keeps the kernel's send shape under B; RTO bounds
    and conntrack accounting only when asked."""
    S = P.Sysctl
    assert P.sysctl_plan(_cfg()) == [
        S("net.mptcp.enabled", "1"), S("net.mptcp.stale_loss_cnt", "4"), S("net.ipv4.tcp_congestion_control", "reno"),
        S("net.ipv4.tcp_ecn", "1"), S("net.ipv4.tcp_rmem", "4096 1875000 1875000"),
        S("net.ipv4.tcp_wmem", "1875000 1875000 1875000")]
    got = P.sysctl_plan(_cfg(mptcp_cc="lia", rto_min_ms=5, rto_max_ms=1000, ecn=False), rcvbuf_bytes=10_000)
    assert got[3:] == [S("net.ipv4.tcp_ecn", "2"), S("net.ipv4.tcp_rmem", "4096 10000 10000"),
                       S("net.ipv4.tcp_wmem", "4096 16384 16384"), S("net.ipv4.tcp_rto_min_us", "5000"),
                       S("net.ipv4.tcp_rto_max_ms", "1000")]
    assert P.sysctl_plan(_cfg(mptcp_cc="lia"), rcvbuf_bytes=20_000)[5] == S("net.ipv4.tcp_wmem", "4096 16384 20000")
    lrc = P.sysctl_plan(_cfg(lrc={"peers": {}}))
    assert lrc[-1] == S("net.netfilter.nf_conntrack_acct", "1") and len(lrc) == 7


def test_the_join_endpoints_and_the_marking_table():
    assert P.mptcp_plan(_cfg(wc_subflows=2)) == [
        P.MptcpLimits(2, 2), P.MptcpEndpoint(101, "10.0.0.1", "s1-eth0", 10101, "signal"),
        P.MptcpEndpoint(102, "10.0.0.1", "s1-eth0", 10102, "signal")]
    t = P.nft_plan(_cfg())
    assert t.name == "bwfabric" and t.text == (
        "table ip bwfabric {\n"
        "  chain pre {\n"
        "    type filter hook prerouting priority mangle; policy accept;\n"
        "    tcp flags syn tcp option mptcp subtype 1 ct mark set 0x20\n"
        "    ct direction original tcp option mptcp subtype 3 drop\n"
        "  }\n"
        "  chain out {\n"
        "    type route hook output priority mangle; policy accept;\n"
        "    tcp flags syn tcp option mptcp subtype 1 ct mark set 0x20\n"
        "    ct mark 0x20 ip dscp set cs1\n"
        "    ct mark != 0x20 ip dscp set cs0\n"
        "  }\n"
        "}")


def test_leaves_buckets_and_bg_pacing_in_whole_units():
    assert P._leaf("eth0", "1:1f", 800_000) == P.TcLeaf("eth0", "1:1f", "101f:", 262_144)
    assert P._leaf("eth0", "1:10", 10**9).limit_bytes == 625_000            # 5 ms at 1 Gb/s
    b = P._bucket("10.0.0.1", "10.0.0.2", 1.0000001)
    assert b.rate_Bps == 125_000 and type(b.rate_Bps) is int
    assert P._bucket("10.0.0.1", None, 0.001).rate_Bps == P.MIN_CLASS_BPS // 8    # at least 8 kb/s
    pace = P.bpf_plan(_cfg(guarantee_mbps=0.5))[-1]
    assert pace == P.BpfMapSet("bwf_bgpace", "10.0.0.1", 61_250)             # 0.98 x 0.5 Mb/s in bytes/s
    assert P.bpf_plan(_cfg(guarantee_mbps=0.5), a_l=2.0)[0] == P.BpfMapSet("bwf_alevel", "10.0.0.1", 2048)


def test_the_vms_htb_tree_with_the_marker():
    """demote_bg (the default): young WC first (WC's share), old WC a 1 %
    floor that borrows, BG's hose at the guarantee borrowing up to the NIC
    (what reaches it already conforms), each a byte FIFO; unmatched is WC."""
    C, L, F = P.TcClass, P.TcLeaf, P.TcFilter
    assert P.tc_plan(_cfg(nic_mbps=10, guarantee_mbps=4)) == [
        P.TcQdisc("s1-eth0", "1:", "1:20"),
        C("s1-eth0", "1:1", "1:", 10_000_000, 10_000_000, 0),
        C("s1-eth0", "1:21", "1:1", 6_000_000, 10_000_000, 1), L("s1-eth0", "1:21", "1021:", 262_144),
        C("s1-eth0", "1:20", "1:1", 100_000, 10_000_000, 1), L("s1-eth0", "1:20", "1020:", 262_144),
        C("s1-eth0", "1:10", "1:1", 4_000_000, 10_000_000, 0), L("s1-eth0", "1:10", "1010:", 262_144),
        F("s1-eth0", 1000, (0x00, 0xfc), "1:10")]
    # a guarantee near the NIC leaves WC 1 % of it, never less than HTB's 8 kb/s
    steps = P.tc_plan(_cfg(nic_mbps=0.5, guarantee_mbps=0.5))
    assert steps[2].rate_bps == 5_000 and steps[4].rate_bps == P.MIN_CLASS_BPS


def test_the_vms_htb_tree_without_the_marker_and_with_pairs():
    """demote_bg off: WC at the NIC less BG; pipe-model pairs get a BG class
    each in their slot (rate = ceiling, prio 0, a FIFO of 5 ms at the rate),
    filtered by destination before the hose; LRC's limits size the pairs'
    FIFOs by the NIC and add a WC ceiling per pair."""
    C, L, F = P.TcClass, P.TcLeaf, P.TcFilter
    cfg = _cfg(nic_mbps=100, guarantee_mbps=35, demote_bg=False, pair_limits_mbps={"10.0.0.9": 20, "10.0.0.3": 15})
    assert P.tc_plan(cfg, slots={"10.0.0.9": 0}) == [
        P.TcQdisc("s1-eth0", "1:", "1:20"),
        C("s1-eth0", "1:1", "1:", 100_000_000, 100_000_000, 0),
        C("s1-eth0", "1:20", "1:1", 65_000_000, 100_000_000, 1), L("s1-eth0", "1:20", "1020:", 262_144),
        C("s1-eth0", "1:100", "1:1", 20_000_000, 20_000_000, 0), L("s1-eth0", "1:100", "1100:", 262_144),
        F("s1-eth0", 10, (0x00, 0xfc), "1:100", dst="10.0.0.9"),
        C("s1-eth0", "1:101", "1:1", 15_000_000, 15_000_000, 0), L("s1-eth0", "1:101", "1101:", 262_144),
        F("s1-eth0", 11, (0x00, 0xfc), "1:101", dst="10.0.0.3"),
        C("s1-eth0", "1:10", "1:1", 35_000_000, 35_000_000, 0), L("s1-eth0", "1:10", "1010:", 262_144),
        F("s1-eth0", 1000, (0x00, 0xfc), "1:10")]
    lrc = P.tc_plan(_cfg(nic_mbps=1000, guarantee_mbps=35, demote_bg=False),
                    lrc_limits={"10.0.0.5": P.PairLimit(10.0, 30.0)})
    assert lrc[4:10] == [
        C("s1-eth0", "1:100", "1:1", 10_000_000, 10_000_000, 0), L("s1-eth0", "1:100", "1100:", 625_000),
        F("s1-eth0", 10, (0x00, 0xfc), "1:100", dst="10.0.0.5"),
        C("s1-eth0", "1:300", "1:1", 30_000_000, 30_000_000, 1), L("s1-eth0", "1:300", "1300:", 625_000),
        F("s1-eth0", 1100, (0x20, 0xfc), "1:300", dst="10.0.0.5")]
