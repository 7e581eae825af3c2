"""experiments.ktrace: MPTCP tracepoint text -> events on the wall clock ->
connection-level stalls, attributed to their senders."""

import gzip

import pytest

from experiments import ktrace

BASE = 6730946059569999559          # a connection's data sequence numbers (64 bit)
OTHER = 5150521931513753609


def _line(ts, name, body, cpu=0):
    return f"    ovs-vswitchd-28299   [{cpu:03d}] ..s2. {ts:.6f}: {name}: {body}"


def _ack(ts, old, new, wnd_end):
    return _line(ts, "ack_update_msk", f"data_ack={new} old_snd_una={old} new_snd_una={new} "
                 f"new_wnd_end={wnd_end} msk_wnd_end={wnd_end}")


def _frag(ts, seq, n):
    return _line(ts, "mptcp_sendmsg_frag", f"data_ack=0 data_seq={seq} subflow_seq=1 data_len={n} csum=0 "
                 "use_map=1 dsn64=1 data_fin=0 use_ack=0 ack64=0 mpc_map=0 frozen=0 reset_transient=0 "
                 "reset_reason=0 csum_reqd=0 infinite_map=0")


def _trace(body, wall=1_795_575_209.5, ts0=100.0):
    head = ["# tracer: nop", "#", _line(ts0, "tracing_mark_write", f"bwfabric-wall {wall:.6f}", cpu=1)]
    return head + body


def test_parse_puts_events_on_the_wall_clock():
    ev = ktrace.parse(_trace([_frag(101.25, BASE, 1448),
                              _line(101.5, "mptcp_subflow_get_send",
                                    "active=1 free=0 snd_wnd=1571840 pace=1575000 backup=0 ratio=2290649")]))
    assert [e.name for e in ev] == ["mptcp_sendmsg_frag", "mptcp_subflow_get_send"]
    assert ev[0].t == pytest.approx(1_795_575_209.5 + 1.25)
    assert ev[0].f["data_seq"] == BASE and ev[1].f["free"] == 0 and ev[1].f["pace"] == 1575000


def test_parse_needs_the_wall_clock_marker():
    with pytest.raises(ktrace.KtraceError, match="bwfabric-wall"):
        ktrace.parse(["# tracer: nop", _frag(101.0, BASE, 1448)])


def _stalled_connection():
    """1 MB sent in 1 KB..., then the DATA_ACK stands still 1.2 s at BASE+500000 while
    data up to the window's edge is sent, then jumps; OTHER advances steadily."""
    body, una = [], BASE
    for i in range(1000):
        body.append(_frag(100.0 + i * 1e-4, BASE + i * 1448, 1448))
    for i in range(5):                                   # steady progress
        body.append(_ack(100.1 + i * 0.05, una, una + 100_000, una + 100_000 + 2_000_000))
        una += 100_000
    body.append(_frag(100.5, BASE + 1000 * 1448, 2_000_000))        # fills the window during the stall
    body.append(_ack(101.5, una, una + 1_900_000, una + 4_000_000))     # 1.2 s later: the hole is filled
    for i in range(3):
        body.append(_ack(100.1 + i * 0.1, OTHER + i, OTHER + i + 1, OTHER + 10**6))
    return body


def test_stalls_finds_a_standing_data_ack_and_whether_the_window_filled():
    ev = ktrace.parse(_trace(_stalled_connection(), wall=1000.0, ts0=100.0))
    got = ktrace.stalls(ev, min_s=0.3)
    assert len(got) == 1, got                    # OTHER sent nothing: left out (min_sent)
    s = got[0]
    assert s["t"] == pytest.approx(1000.3) and s["seconds"] == pytest.approx(1.2)
    assert s["snd_una"] == BASE + 500_000 and s["jump_bytes"] == 1_900_000
    assert s["window_bytes"] == 2_000_000 and s["window_full"]
    assert ktrace.stalls(ev, min_s=1.5) == []    # shorter than asked: not a stall


def test_a_stall_with_room_left_in_the_window_is_not_window_full():
    body = [_frag(100.0, BASE, 1_200_000), _ack(100.1, BASE, BASE + 100_000, BASE + 100_000 + 8_000_000),
            _frag(100.3, BASE + 1_200_000, 50_000), _ack(100.9, BASE + 100_000, BASE + 200_000, BASE + 9_000_000)]
    (s,) = ktrace.stalls(ktrace.parse(_trace(body, wall=0.0, ts0=100.0)), min_s=0.5)
    assert not s["window_full"] and s["seconds"] == pytest.approx(0.8)


def _retransmit(ts, saddr, sport, daddr, dport):
    return _line(ts, "tcp_retransmit_skb", f"skbaddr=00000000c0ffee00 skaddr=000000009a1b2c3d family=AF_INET "
                 f"sport={sport} dport={dport} saddr={saddr} daddr={daddr} saddrv6=::ffff:{saddr} "
                 f"daddrv6=::ffff:{daddr} state=TCP_ESTABLISHED err=0")


def test_report_places_stalls_in_runs_and_names_their_sender(tmp_path):
    body = _stalled_connection() + [_retransmit(100.8, "10.0.0.3", 40001, "10.0.0.7", 5202),
                                    _retransmit(101.2, "10.0.0.3", 40001, "10.0.0.7", 5202),
                                    _retransmit(101.0, "10.0.0.1", 40009, "10.0.0.5", 5201),   # another sender
                                    _retransmit(103.0, "10.0.0.3", 40000, "10.0.0.7", 5201)]   # after the stall
    text = "\n".join(_trace(body, wall=1000.0, ts0=100.0)) + "\n"
    path = tmp_path / "ktrace.txt.gz"
    with gzip.open(path, "wt") as fh:
        fh.write(text)
    ev = ktrace.read(path)
    assert ktrace.overwritten(path) == 0
    snaps = [{"s1": [OTHER + 5], "s3": [BASE + 3_000_000]}]
    (r,) = ktrace.report(ev, [999.0], snaps, {"s1": "10.0.0.1", "s3": "10.0.0.3"})
    assert r["run"] == 0 and r["sender"] == "s3" and r["t"] == pytest.approx(1.3)
    assert r["retransmits"] == {"40001->10.0.0.7:5202": 2}       # its own, during the stall
    assert ev[-1].f["saddr"] == "10.0.0.3" and ev[-1].f["state"] == "TCP_ESTABLISHED"
    assert ktrace.owner(BASE, {"s1": [OTHER]}) is None       # no connection of that host near it


def test_kernel_trace_says_what_is_missing(tmp_path):
    with pytest.raises(ktrace.KtraceError, match="mptcp and tcp tracepoints"):
        with ktrace.KernelTrace(tmp_path / "t.gz", tracefs=tmp_path):
            pass


def test_overwritten_events_are_counted(tmp_path):
    path = tmp_path / "t.gz"
    with gzip.open(path, "wt") as fh:
        fh.write("# tracer: nop\n#\n# entries-in-buffer/entries-written: 1500/2000   #P:2\n#\n" + _frag(1.0, BASE, 8) + "\n")
    assert ktrace.overwritten(path) == 500
