"""The main job's pure parts: its tenants are admitted on its fabric, and
the lowest-1-s-window figure it prints is computed as it says."""

from pathlib import Path

import pytest

from controller import config
from experiments import product, registry
from mininet_topos import builders


def test_the_main_jobs_tenants_are_admitted_and_fill_the_mixed_tors(tmp_path):
    cfg = product.Config()
    builders.fattree(4, link_mbps=cfg.link_mbps, fabric_mbps=cfg.fabric_mbps).save(tmp_path / "topology.json")
    (tmp_path / "bwfabric").mkdir()
    loaded = config.load(product.write_config(cfg, tmp_path / "bwfabric", "bwfabric"))
    assert len(loaded.vms()) == 16 and loaded.cfg.controller.routing == "lessor"
    from controller import admission
    rows = {r["cut"]: r for r in admission.headroom(loaded.topology, loaded.guarantees(), 0.9)}
    assert rows["ToR e0_0 uplinks"]["capacity_mbps"] == 10.0       # two 5 Mb/s uplinks for two 10 Mb/s hosts
    assert config.load(product.write_config(cfg, tmp_path / "bwfabric", "best-effort")).cfg.tenants == {}


def test_static_reservation_holds_every_vm_to_its_guarantee_with_one_subflow(tmp_path):
    """The reservation baseline: agents on every VM's host, no WC subflow,
    BG not demoted (the host's class at rate = ceil = the guarantee)."""
    from hostagent import plan
    cfg = product.Config()
    builders.fattree(4, link_mbps=cfg.link_mbps, fabric_mbps=cfg.fabric_mbps).save(tmp_path / "topology.json")
    (tmp_path / "reservation").mkdir()
    loaded = config.load(product.write_config(cfg, tmp_path / "reservation", "reservation"))
    assert len(loaded.vms()) == 16 and not loaded.cfg.controller.prio_queues
    assert all(t.wc_subflows == 0 for t in loaded.cfg.tenants.values())
    from controller import tenancy
    hc = tenancy.host_config(loaded, "h1")["h1"]
    assert hc.demote_bg is False and hc.wc_subflows == 0 and not plan.marker_plan(hc)
    classes = {s.classid: s for s in plan.tc_plan(hc) if isinstance(s, plan.TcClass)}
    assert classes[plan.CLASS_BG].ceil_bps == 3_000_000


def test_bwfabric_with_lrc_runs_lrc_in_combined_mode(tmp_path):
    cfg = product.Config(lrc=True)
    builders.fattree(4, link_mbps=cfg.link_mbps, fabric_mbps=cfg.fabric_mbps).save(tmp_path / "topology.json")
    (tmp_path / "bwfabric").mkdir()
    loaded = config.load(product.write_config(cfg, tmp_path / "bwfabric", "bwfabric"))
    assert loaded.cfg.lrc.enabled and loaded.cfg.lrc.mode == "combined"
    assert not config.load(product.write_config(product.Config(lrc=False), tmp_path / "bwfabric",
                                                "bwfabric")).cfg.lrc.enabled
    assert product.Config().lrc          # the main job's bwfabric runs LRC


def test_the_max_min_ideal_is_each_mixed_tor_uplinks_shared_by_its_two_senders():
    """k=4, 5 Mb/s fabric: a mixed ToR's two uplinks (10 Mb/s) shared
    max-min by its analytics and batch senders, each over its four paths."""
    topo = builders.fattree(4, link_mbps=10.0, fabric_mbps=5.0)
    ideal = product.max_min_ideal(topo)
    assert set(ideal) == {*product.ANALYTICS.values(), *product.BATCH.values()}
    assert all(r == pytest.approx(5.0) for r in ideal.values())
    # a faster fabric: the hosts' 10 Mb/s links limit
    assert sum(product.max_min_ideal(builders.fattree(4, link_mbps=10.0, fabric_mbps=10.0)).values()) == \
        pytest.approx(80.0)


def test_web_stats_p50_p99_and_slowdown_against_line_rate():
    flows = [{"size": 10_000, "fct": 0.1 * (i + 1), "complete": True} for i in range(10)]
    flows += [{"size": 1_250_000, "fct": 2.0, "complete": True},      # 1 s at 10 Mb/s: slowdown 2
              {"size": 50_000, "fct": None, "complete": False}]
    w = product.web_stats(flows, 10.0)
    assert w["short_flows"] == 10 and w["completed"] == 11 and w["flows"] == 12
    assert w["small_fct_p50_ms"] == pytest.approx(550.0)
    assert w["small_fct_p99_ms"] == pytest.approx(991.0)
    # 10 KB at 10 Mb/s = 8 ms: slowdowns 12.5, 25, ..., 125, and 2
    assert w["slowdown_mean"] == pytest.approx((sum(12.5 * (i + 1) for i in range(10)) + 2) / 11)


def _summary(held_a, held_b, p50, p99, of_ideal):
    return {"analytics": {"held": held_a}, "batch": {"held": held_b},
            "web": {"small_fct_p50_ms": p50, "small_fct_p99_ms": p99}, "aggregate": {"of_ideal": of_ideal}}


def test_verdicts_compare_bwfabric_with_the_same_runs_best_effort():
    runs = [{"bwfabric": _summary(0.98, 1.2, 300, 900, 0.91), "best-effort": _summary(0.0, 9.0, 400, 900, 0.7)},
            {"bwfabric": _summary(0.96, 1.2, 500, 800, 0.89), "best-effort": _summary(0.0, 9.0, 400, 900, 0.95)}]
    v = product.verdicts(runs)
    first, second = v[0]["checks"], v[1]["checks"]
    assert all(first.values()), first
    held = [k for k in second if k.startswith("analytics")][0]
    assert second[held] is False and second[[k for k in second if k.startswith("batch")][0]] is True
    assert second["web p50 <= best effort's"] is False and second["web p99 <= best effort's"] is True
    assert second["aggregate >= best effort's"] is False
    assert second[f"aggregate >= {product.AGGREGATE_OF_IDEAL} of the max-min ideal"] is False
    # a missing percentile is a miss, not a pass
    runs[0]["bwfabric"]["web"]["small_fct_p99_ms"] = None
    assert product.verdicts(runs)[0]["checks"]["web p99 <= best effort's"] is False


def test_a_stall_is_every_batch_vm_s_udp_falling_at_once_and_a_miss_beside_one_says_so():
    steady = {"udp-b1": 4.0, "udp-b2": 4.0, "bg-h1": 4.0}
    rates = [{"t": 0.5 * i, **steady} for i in range(1, 21)]
    rates[9].update({"udp-b1": 3.0, "udp-b2": 3.4, "bg-h1": 3.0})      # t = 5.0: the whole fabric
    rates[13].update({"udp-b1": 2.0})                                   # t = 7.0: one VM alone
    assert product.stalls(rates, ["b1", "b2"], 0.0, 10.0) == [5.0]
    assert product.stalls(rates, ["b1"], 0.0, 10.0) == []               # one sender proves nothing
    assert product.stalls(rates, ["b1", "b2", "silent"], 0.0, 10.0) == [5.0]
    low, mean, span = product.vm_low_window(rates, "h1", 1.0, 0.0, 10.0)
    assert low == pytest.approx(3.5) and span in ((4.5, 5.0), (5.0, 5.5))
    ok = _summary(1.0, 1.2, 300, 900, 0.95)
    missed = {**_summary(0.95, 1.2, 300, 900, 0.95), "stalls": [5.0]}
    missed["analytics"]["low_window"] = [4.5, 5.0]
    v = product.verdicts([{"bwfabric": missed}, {"bwfabric": {**missed, "stalls": [9.0]}}, {"bwfabric": ok}])
    assert v[0]["notes"] == ["analytics 0.95 of g in 4.5-5.0 s, beside an emulator stall at 5.0 s"]
    assert v[1]["notes"] == [] and v[2]["notes"] == []
    assert not v[0]["checks"][[k for k in v[0]["checks"] if k.startswith("analytics")][0]]  # still missed


def test_spread_is_median_and_range_ignoring_missing():
    assert product.spread([3.0, None, 1.0, 2.0]) == {"median": 2.0, "low": 1.0, "high": 3.0, "n": 3}
    assert product.spread([None])["median"] is None


def test_lowest_window_and_mean_of_a_vm():
    rates = [{"t": 0.5 * i, "bg-h1": v, "wc-h1": 1.0, "bg-h2": 9.0} for i, v in enumerate([4, 4, 0, 4, 4, 4])]
    low, mean = product.vm_rates(rates, "h1", 1.0, 0.0, 10.0)
    # samples after t=0: 4, 0, 4, 4, 4 (+1 WC each); 1 s windows of two samples: 3, 3, 5, 5
    assert low == pytest.approx(3.0) and mean == pytest.approx(1 + 16 / 5)


def test_bad_options_are_refused_before_anything_starts(capsys, tmp_path):
    assert registry.run("main", ["web_load=2"], tmp_path) == 2
    assert "web_load" in capsys.readouterr().err
    assert registry.run("main", ["schemes=ospf"], tmp_path) == 2
    assert registry.run("main", ["reps=0"], tmp_path) == 2
    for bad in ("vms_per_host=3", "stale_loss_cnt=0", "stale_loss_cnt=101", "guarantees=nan,1", "guarantees=4",
                "guarantees=0,1", "guarantees=4,11", "guarantees=inf,1", "rtt_hint_ms=0", "rtt_hint_ms=inf",
                "rtt_hint_ms=20000", "bg_first=maybe"):
        assert registry.run("main", [bad], tmp_path) == 2
        assert bad.split("=")[0] in capsys.readouterr().err


def test_a_relative_results_directory_gives_absolute_agent_addresses(tmp_path, monkeypatch):
    """`./bwfabric.sh experiment` writes under results/ (relative): the
    agents' unix sockets must still be absolute paths."""
    monkeypatch.chdir(tmp_path)
    cfg = product.Config()
    out = Path("results") / "main"
    (out / "bwfabric").mkdir(parents=True)
    builders.fattree(4, link_mbps=cfg.link_mbps, fabric_mbps=cfg.fabric_mbps).save(out / "topology.json")
    loaded = config.load(product.write_config(cfg, out / "bwfabric", "bwfabric"))
    assert loaded.cfg.agents.address_template.startswith(f"unix:{tmp_path}/")


def test_meter_stats_are_parsed_per_meter_with_their_drop_band():
    from experiments.ovs import parse_meter_stats
    text = ("OFPST_METER reply (OF1.3) (xid=0x2):\n"
            "meter:1 flow_count:2 packet_in_count:689 byte_in_count:829498 duration:8.705s bands:\n"
            "0: packet_count:13 byte_count:19682\n\n"
            "meter:12 flow_count:2 packet_in_count:523 byte_in_count:307145 duration:8.705s bands:\n"
            "0: packet_count:0 byte_count:0\n")
    assert parse_meter_stats(text) == {1: {"bytes_in": 829498, "dropped_packets": 13, "dropped_bytes": 19682},
                                       12: {"bytes_in": 307145, "dropped_packets": 0, "dropped_bytes": 0}}
    assert parse_meter_stats("OFPST_METER reply (OF1.3) (xid=0x2):\n") == {}


def test_two_vms_per_host_put_two_tenants_on_every_server_with_the_one_vm_load(tmp_path):
    """vms_per_host=2 (issue #32 §4): every server holds two VMs of different
    tenants, each in its own namespace and address; the configuration loads
    and is admitted; every server's and every ToR's guarantees are those of
    the one-VM layout; each backlogged VM's peer is its tenant's VM two pods
    on; the max-min ideal gives a mixed ToR's four senders a quarter of its
    uplinks each."""
    from controller import admission
    cfg = product.Config(vms_per_host=2)
    topo = builders.with_vm_blocks(builders.fattree(4, link_mbps=cfg.link_mbps, fabric_mbps=cfg.fabric_mbps))
    topo.save(tmp_path / "topology.json")
    lay = product.layout(2, topo, tag="t")
    per_server: dict = {}
    for v in lay.vms:
        per_server.setdefault(v.host, []).append(v.tenant)
    assert len(per_server) == 16 and all(len(ts) == 2 and len(set(ts)) == 2 for ts in per_server.values())
    assert len({v.endpoint for v in lay.vms}) == 32 and all(v.endpoint.startswith("bwmt") for v in lay.vms)
    for s, p in lay.peer.items():
        a, b = next(v for v in lay.vms if v.endpoint == s), next(v for v in lay.vms if v.endpoint == p)
        assert a.tenant == b.tenant and product.PEER[a.host] == b.host
    (tmp_path / "bwfabric").mkdir()
    loaded = config.load(product.write_config(cfg, tmp_path / "bwfabric", "bwfabric", lay))
    assert len(loaded.vms()) == 32 and {len(v) for v in loaded.host_vms().values()} == {2}
    one = config.load(product.write_config(product.Config(), tmp_path / "bwfabric", "bwfabric"))
    assert sum(loaded.guarantees().values()) == pytest.approx(sum(one.guarantees().values()))
    assert set(loaded.guarantees().values()) == {1.75, 1.0}        # 3 + 0.5 (mixed ToRs), 1 + 1 (web)
    rows = {r["cut"]: r for r in admission.headroom(loaded.topology, loaded.guarantees(), 0.9)}
    rows1 = {r["cut"]: r for r in admission.headroom(one.topology, one.guarantees(), 0.9)}
    assert {c: r["crossing_mbps"] for c, r in rows.items() if c.startswith("ToR")} == \
        pytest.approx({c: r["crossing_mbps"] for c, r in rows1.items() if c.startswith("ToR")})
    ideal = product.max_min_ideal(topo, lay)
    assert set(ideal) == set(lay.senders) and len(ideal) == 16
    assert all(r == pytest.approx(2.5) for r in ideal.values())
    # the web load is split between the two web tenants, each among its own VMs
    flows = product.web_flows(product.Config(vms_per_host=2, duration=30), lay, seed=3)
    tenant = {v.endpoint: v.tenant for v in lay.vms}
    assert flows and all(tenant[f.src] == tenant[f.dst] in lay.web_tenants for f in flows)
    assert {tenant[f.src] for f in flows} == {"web", "search"}
    with pytest.raises(product.OptionError):
        product.layout(3, topo)


def test_a_vms_rate_is_all_its_tcp_whatever_its_dscp_when_the_meter_counts_it():
    rates = [{"t": 0.5 * i, "tcp-x": 5.0, "bg-x": 3.0, "wc-x": 1.0, "udp-x": 0.5} for i in range(1, 5)]
    low, mean = product.vm_rates(rates, "x", 1.0, 0.0, 10.0)
    assert low == pytest.approx(5.5) and mean == pytest.approx(5.5)


def test_bg_is_demoted_only_where_the_fabric_has_a_wc_class(tmp_path):
    """The marker demotes BG beyond a VM's bucket to WC: with prio queues
    (bwfabric) a lower class; without them (an LRC paper-mode fabric,
    reservation) the demoted traffic would go as fast as BG and the VM's
    limit would hold nothing -- there the agents limit BG with HTB."""
    from controller import config, tenancy
    from hostagent import plan
    cfg = product.Config()
    builders.fattree(4, link_mbps=cfg.link_mbps, fabric_mbps=cfg.fabric_mbps).save(tmp_path / "topology.json")
    (tmp_path / "x").mkdir()
    with_pq = config.load(product.write_config(cfg, tmp_path / "x", "bwfabric"))
    assert with_pq.cfg.controller.prio_queues and with_pq.cfg.agents.defaults.demote_bg is not False
    assert tenancy.host_config(with_pq, "h1")["h1"].demote_bg is True
    from experiments import configs
    tenants = product.tenants()
    for t in tenants.values():
        t["wc_subflows"] = 0
    lrc_paper = configs.write(tmp_path / "x" / "paper.yaml", tmp_path / "topology.json", "single_path", 6653,
                              prio_queues=False, tenants=tenants, agents_dir=tmp_path / "x" / "agents",
                              lrc={"enabled": True, "mode": "paper"})
    hc = tenancy.host_config(config.load(lrc_paper), "h1")["h1"]
    assert hc.demote_bg is False and not plan.marker_plan(hc)
