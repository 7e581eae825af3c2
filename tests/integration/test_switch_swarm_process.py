"""benchmarks/switch_swarm.py against the real controller process: a k = 4
swarm is served -- every switch handshaken, routing's rules and groups
received, every ToR polled -- with no OpenFlow error (the figures are the
benchmark's to print; the mechanisms are checked here). Needs no root."""

from benchmarks import switch_swarm as S


def test_a_real_controller_serves_a_k4_swarm():
    r = S.run(4, seconds=8, flows_per_tor=16, window_s=8)     # polled twice in the whole run: no race with load
    assert r["controller_alive"] and r["errors"] == 0 and r["unknown"] == 0, r["log_tail"]
    assert (r["switches"], r["connected"], r["handshaken"], r["tors"]) == (20, 20, 20, 8)
    assert r["flow_mods"] > 20 * 10 and r["group_mods"] > 0 and r["mods_per_s_peak5"] > 0
    assert r["tors_polled"] == 8 and r["period_median_s"] is not None
