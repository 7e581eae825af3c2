"""The flow-level simulator's packet-level check (issue #34 §1 (b),
experiments/flowsim/ns3check.py and ns3_packet.py) without ns-3 itself:
the routes it hands ns-3 are the single_path app's, the spec carries the
flow-level simulator's own connections, the comparison counts what it
says, and every setting and spec is refused by name. ns-3 runs in
tests/integration/test_ns3_check.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from apps.routing.logic import DestinationRouting
from experiments.flowsim import ns3_packet
from experiments.flowsim.engine import Engine, Flows
from experiments.flowsim.net import SimError, SimNet
from experiments.flowsim.ns3check import Ns3Config, compare, routes, run_ns3, spec
from experiments.flowsim.command import parse_sets
from experiments.flowsim.routing import make_router
from experiments.flowsim.workload import open_loop
from experiments.workloads import SizeCdf
from mininet_topos.builders import fattree

MB = 1e6


@pytest.fixture(scope="module")
def k4():
    return SimNet(fattree(4, link_mbps=1000.0))


def test_the_static_routes_are_the_single_path_apps_paths(k4):
    table = routes(k4)
    single = DestinationRouting(k4.view, multipath=False)
    hosts = k4.view.hosts
    for src in hosts:
        for dst in hosts:
            if src == dst:
                continue
            path, node = [src], k4.tor_of[src]
            while node != dst:
                path.append(node)
                node = table[node][dst]
                assert len(path) < 10, path
            assert tuple(path + [dst]) == single.single_path(src, dst)
    # some switch sends two destinations different ways: the routes are per destination, not per switch
    assert any(len({table[sw][h] for h in hosts if sw in table and h in table[sw]}) > 1 for sw in table)


def test_the_spec_carries_the_flow_level_simulators_own_connections(k4):
    cfg = parse_sets(Ns3Config, ["k=4", "loads=0.3", "seconds=0.5", "warmup=0.1", "drain=1"])
    flows = open_loop(k4, SizeCdf.load("websearch"), 0.3, 0.5, 7)
    doc = spec(cfg, k4, routes(k4), flows)
    ns3_packet.check(doc)                                   # what the driver requires, all there
    assert set(ns3_packet.KEYS) <= set(doc)
    names = [e.name for e in k4.endpoints]
    assert [f[:2] for f in doc["flows"]] == [[names[s], names[d]] for s, d in zip(flows.src, flows.dst)]
    assert [f[2] for f in doc["flows"]] == pytest.approx(list(flows.start_s))
    assert [f[3] for f in doc["flows"]] == [int(b) for b in flows.size_bytes]
    # each cable once, at the view's capacity, both ways in the simulator's directed links
    cables = {tuple(sorted(lk[:2])) for lk in doc["links"]}
    assert len(cables) == len(doc["links"]) == len(k4.links) // 2
    assert all(lk[2] == 1e9 for lk in doc["links"])
    assert doc["marks"] == [0.1, 0.5] and doc["end_s"] == pytest.approx(1.5)


@pytest.mark.parametrize("bad, word", [
    ({"hosts": None}, "missing hosts"),
    ({"links": [["h1", "nowhere", 1e9]]}, "link h1-nowhere"),
    ({"links": [["h1", "e0_0", 0]]}, "link h1-e0_0"),
    ({"flows": [["h1", "h1", 0.0, 100]]}, "flow h1 -> h1"),
    ({"flows": [["h1", "x", 0.0, 100]]}, "flow h1 -> x"),
    ({"flows": [["h1", "h2", 5.0, 100]]}, "at 5.0 s"),
    ({"flows": [["h1", "h2", float("nan"), 100]]}, "at nan s"),
    ({"flows": [["h1", "h2", 0.0, 0]]}, "of 0 bytes"),
    ({"flows": [["h1", "h2", 0.0, float("nan")]]}, "of nan bytes"),
    ({"links": [["h1", "e0_0", float("inf")]]}, "link h1-e0_0 at inf"),
    ({"links": [["h1", "e0_0", float("nan")]]}, "link h1-e0_0 at nan"),
    ({"end_s": float("nan")}, "end_s nan"),
    ({"end_s": float("inf")}, "end_s inf"),
    ({"mss": True}, "mss True"),
    ({"link_delay_us": -1}, "link_delay_us -1"),
    ({"ecn_k": 300}, "ecn_k 300"),
    ({"marks": [0.5, 0.1]}, "marks"),
    ({"marks": [0.1, float("nan")]}, "marks"),
    ({"marks": [0.1, 3.0]}, "marks"),
    ({"routes": {"e0_0": {"h1": "nowhere"}}}, "route at e0_0 to h1 via nowhere"),
    ({"routes": {"e0_0": {"x": "h1"}}}, "route at e0_0 to x"),
])
def test_the_driver_refuses_a_bad_spec_by_name(k4, bad, word):
    cfg = parse_sets(Ns3Config, ["k=4"])
    doc = spec(cfg, k4, routes(k4), Flows(np.array([0]), np.array([1]), np.array([0.0]), np.array([1000.0])))
    doc["end_s"] = 2.0
    for key, value in bad.items():
        if value is None:
            del doc[key]
        else:
            doc[key] = value
    with pytest.raises(ValueError, match=word):
        ns3_packet.check(doc)


def test_more_connections_into_one_host_than_ports_are_refused(k4):
    cfg = parse_sets(Ns3Config, ["k=4"])
    n = 65535 - ns3_packet.FIRST_PORT + 1
    doc = spec(cfg, k4, routes(k4), Flows(np.zeros(n, dtype=np.int64), np.ones(n, dtype=np.int64), np.zeros(n),
                                           np.full(n, 10.0)))
    with pytest.raises(ValueError, match="than ports"):
        ns3_packet.check(doc)
    doc["flows"] = doc["flows"][1:]
    ns3_packet.check(doc)


@pytest.mark.parametrize("pairs, word", [
    (["k=5"], "k 5"), (["k=18"], "k 18"), (["link_mbps=nan"], "link_mbps"), (["seconds=inf"], "seconds"),
    (["warmup=1", "seconds=1"], "warmup 1"), (["drain=-1"], "drain"), (["loads=0"], "loads"),
    (["loads=0.5,nan"], "loads"), (["loads=1.5"], "loads"), (["workload=nope"], "workload"),
    (["tcp=TcpNope"], "tcp"), (["queue_packets=1"], "queue_packets"), (["ecn_k=200"], "ecn_k"),
    (["ecn_k=-1"], "ecn_k"), (["mss=100"], "mss"), (["init_cwnd=0"], "init_cwnd"), (["buf_bytes=10"], "buf_bytes"),
    (["min_rto_ms=0"], "min_rto_ms"), (["delack_ms=inf"], "delack_ms"), (["link_delay_us=nan"], "link_delay_us"),
    (["nope=1"], "nope"), (["k=four"], "is not a int"), (["k"], "KEY=VALUE"),
])
def test_settings_are_refused_by_name(pairs, word):
    with pytest.raises(SimError, match=word):
        parse_sets(Ns3Config, pairs)


def test_a_missing_ns3_python_is_refused_by_name(tmp_path):
    with pytest.raises(SimError, match="does not exist"):
        run_ns3(str(tmp_path / "no-python"), {}, tmp_path, "x", True)


def test_the_comparison_counts_the_connections_both_finished_in_the_window():
    cfg = parse_sets(Ns3Config, ["seconds=1", "warmup=0.2"])
    flows = Flows(np.arange(6) % 2, (np.arange(6) + 1) % 2, np.array([0.1, 0.2, 0.3, 0.5, 0.9, 1.0]),
                  np.array([1e4, 1e4, 2e6, 2e6, 2e7, 1e4]))
    ns3 = np.array([1.0, 0.010, 0.040, math.nan, 0.400, 9.0])      # #3 unfinished in ns-3
    sim = np.array([2.0, 0.008, 0.030, 0.050, math.nan, 9.0])      # #4 unfinished in the flow-level one
    row = compare(cfg, flows, ns3, sim, 1000e6, 1090e6)
    # in the window: #1..#4 (0.1 is before it, 1.0 after); both finished: #1, #2
    assert row["connections"] == 4 and row["both_finished"] == 2
    assert row["ns3_unfinished"] == 1 and row["flowsim_unfinished"] == 1
    assert row["ns3_fct"]["mean_s"] == pytest.approx(0.025) and row["flowsim_fct"]["mean_s"] == pytest.approx(0.019)
    assert row["mean_fct_ratio"] == pytest.approx(0.76)
    assert row["aggregate_ratio"] == pytest.approx(1.09)
    assert row["within"]                                            # 1.09 and 0.76: inside the bounds
    assert row["by_size"]["< 100 KB"]["ns3"]["n"] == 1 and row["by_size"]["1 - 10 MB"]["flowsim"]["n"] == 1
    assert not compare(cfg, flows, ns3, sim, 1000e6, 1110e6)["within"]
    assert not compare(cfg, flows, ns3, sim, 1000e6, 890e6)["within"]
    assert not compare(cfg, flows, ns3, sim * 0.97, 1000e6, 1000e6)["within"]     # 0.737


def test_sub_second_slots_give_the_aggregate_over_a_sub_second_window(k4):
    # one 1 MB flow alone at 1 Gb/s: 8 ms; in 1 ms slots the window [2 ms, 6 ms) holds 4 Mb
    flows = Flows(np.array([k4.endpoint("h1")]), np.array([k4.endpoint("h3")]), np.array([0.0]), np.array([1 * MB]))
    res = Engine(k4, make_router(k4, "single_path"), "fair", 0.0, slot_s=0.001).run(flows, 0.02)
    assert res.fct_s == pytest.approx([0.008])
    assert res.aggregate_bps((0.002, 0.006)) == pytest.approx(1e9)
    assert res.aggregate_bps((0.004, 0.012)) == pytest.approx(0.5e9)
    # the default 1 s slots see the same bits in the first second
    whole = Engine(k4, make_router(k4, "single_path"), "fair", 0.0).run(flows, 0.02)
    assert whole.aggregate_bps((0.0, 1.0)) == pytest.approx(8e6)
    for bad in (0.0, math.nan, math.inf, 61.0, "1"):
        with pytest.raises(SimError, match="slot_s"):
            Engine(k4, make_router(k4, "single_path"), "fair", 0.0, slot_s=bad)
