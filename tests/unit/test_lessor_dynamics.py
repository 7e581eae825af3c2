"""The measurement functions of the link-failure and polling experiments."""

import pytest

from experiments.lessor_dynamics import BIN_S, busiest_fabric_link, failure_metrics, failure_verdict, polling_verdict


def test_busiest_fabric_link_ignores_host_links_and_direction():
    installed = {
        "f1": ["h1", "e0", "a0", "c1", "a1", "e1", "h5"],
        "f2": ["h6", "e1", "a1", "c1", "a0", "e0", "h2"],   # same core link, other direction
        "f3": ["h3", "e0", "a0", "c2", "a1", "e1", "h7"],
    }
    link, n = busiest_fabric_link(installed, {"h1", "h2", "h3", "h5", "h6", "h7"})
    assert n == 3 and link in (("a0", "e0"), ("a1", "e1"))  # the edge-agg links carry all three
    del installed["f3"]
    link, n = busiest_fabric_link({"f1": installed["f1"]}, {"h1", "h5"})
    assert n == 1
    with pytest.raises(RuntimeError, match="nothing to fail"):
        busiest_fabric_link({"f": ["h1", "e0", "h2"]}, {"h1", "h2"})


def _series(rate_before, gap_s, rate_after, end_rate=None, horizon=10.0):
    pts = []
    for i in range(-50, int(horizon / BIN_S)):
        t = i * BIN_S
        if t < 0:
            r = rate_before
        elif t < gap_s:
            r = 0.0
        else:
            r = rate_after if end_rate is None or t < horizon - 4 else end_rate
        pts.append((round(t, 3), r))
    return pts


def test_failure_metrics_gap_recovery_and_blackhole():
    m = failure_metrics(_series(10.0, 0.3, 9.0), horizon_s=10.0)
    assert m["pre_mbps"] == pytest.approx(10.0)
    assert m["longest_zero_s"] == pytest.approx(0.3, abs=BIN_S)
    assert m["half_rate_back_after_s"] == pytest.approx(0.4, abs=BIN_S)
    assert m["end_mbps"] == pytest.approx(9.0)
    dead = failure_metrics(_series(10.0, 100.0, 0.0), horizon_s=10.0)
    assert dead["half_rate_back_after_s"] is None and dead["end_mbps"] == 0.0
    assert dead["longest_zero_s"] == pytest.approx(10.0, abs=BIN_S)


def test_polling_verdict_reads_alg1_behaviour():
    phases = {"storm_from_s": 10, "storm_to_s": 20}
    bounds = {"lower": 0.5, "upper": 0.7}
    d = [{"t": 1, "cpu": 0.01, "period_s": 2.5}, {"t": 4, "cpu": 0.01, "period_s": 0.5},
         {"t": 12, "cpu": 0.9, "period_s": 1.0}, {"t": 14, "cpu": 0.8, "period_s": 2.0},
         {"t": 25, "cpu": 0.05, "period_s": 1.0}]
    v = polling_verdict(d, phases, bounds)
    assert v["shrinks_when_idle"] and v["grows_over_upper"]
    assert v["storm_max_cpu"] == 0.9 and v["storm_max_period_s"] == 2.0
    flat = [{**x, "cpu": 0.3, "period_s": 0.5} for x in d]
    v = polling_verdict(flat, phases, bounds)
    assert not v["shrinks_when_idle"] and not v["grows_over_upper"]


def test_failure_verdict():
    ok = {"h5": failure_metrics(_series(10.0, 0.3, 9.0), 10.0), "h6": failure_metrics(_series(10.0, 0.2, 9.0), 10.0)}
    v = failure_verdict(ok, period_s=0.5, updates=[0.03, 0.11])
    assert v["rerouted_within_one_period"] and v["blackholed"] == [] and v["affected_flows"] == 2
    assert v["last_update_s"] == 0.11 and v["worst_tcp_zero_run_s"] == pytest.approx(0.3, abs=BIN_S)
    assert not failure_verdict(ok, period_s=0.1, updates=[0.03, 0.11])["rerouted_within_one_period"]
    assert not failure_verdict(ok, period_s=0.5, updates=[])["rerouted_within_one_period"]
    dead = {**ok, "h7": failure_metrics(_series(10.0, 100.0, 0.0), 10.0)}
    assert failure_verdict(dead, period_s=5.0, updates=[0.1])["blackholed"] == ["h7"]


def test_controller_updates_are_read_from_its_log(tmp_path):
    import datetime
    from experiments.lessor_dynamics import controller_updates
    t = datetime.datetime(2026, 11, 22, 7, 28, 20, 130833).timestamp()
    (tmp_path / "c.log").write_text(
        "2026-11-22 07:28:01,106 bwfabric INFO starting\n"
        "2026-11-22 07:28:20,167 LessorApp INFO ports e0_0:3 down: updating 2 switches (a0_0, e0_0)\n"
        "2026-11-22 07:28:20,200 LessorApp INFO ports e0_0:3 up: updating 2 switches (a0_0, e0_0)\n"
        "2026-11-22 07:28:20,245 LessorApp INFO ports e0_0:3 up, a0_0:1 down: updating 1 switches (e3_1)\n")
    assert controller_updates(tmp_path / "c.log", t) == [pytest.approx(0.0362, abs=1e-3),
                                                          pytest.approx(0.1142, abs=1e-3)]
