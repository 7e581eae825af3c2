"""The ECMP path probe (experiments/pathprobe.py) and the simulator's replay
of an emulated run's observed paths (PinnedRouter, fabric-validate): the
probe watches exactly the multipath ports, reads only IPv4 TCP headers, and
walks each flow to the path its packets took; the replay puts each pair on
its recorded path and refuses a path the fabric does not have."""

from __future__ import annotations

import collections
import ipaddress
import json
import socket
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.network_view import NetworkView
from experiments import pathprobe
from experiments.flowsim.engine import Engine, Flows
from experiments.flowsim.net import SimError, SimNet
from experiments.flowsim.routing import PinnedRouter, make_router
from mininet_topos.builders import fattree


@pytest.fixture(scope="module")
def view():
    return NetworkView(fattree(4, link_mbps=10.0))


def _ip_tcp(src, dst, dport, total=1500, proto=socket.IPPROTO_TCP, version=4, ihl=5):
    hdr = struct.pack("!BBHHHBBH4s4s", (version << 4) | ihl, 0, total, 0, 0, 64, proto, 0,
                      ipaddress.IPv4Address(src).packed, ipaddress.IPv4Address(dst).packed)
    hdr += b"\0" * (ihl * 4 - 20)
    return hdr + struct.pack("!HH", 40000, dport) + b"\0" * 16


def test_the_probe_watches_every_multipath_port_and_no_other(view):
    ports = pathprobe.probe_ports(view)
    roles = {n: view.graph.nodes[n]["role"] for n in view.switches}
    # k = 4: 8 ToRs x 2 uplinks and 8 aggregation switches x 2 uplinks; no downlink, no host port
    assert len(ports) == 32
    for name, (sw, port) in ports.items():
        assert name == f"{sw}-eth{port}"
        up = view.peer(sw, port)
        assert (roles[sw], roles.get(up)) in (("edge", "aggregation"), ("aggregation", "core")), (sw, up)


def test_headers_are_read_from_the_ip_layer():
    got = pathprobe.parse_ipv4_tcp(_ip_tcp("10.0.0.1", "10.0.0.16", 5207, total=1448))
    assert got == (("10.0.0.1", "10.0.0.16", 5207), 1448)
    assert pathprobe.parse_ipv4_tcp(_ip_tcp("10.0.0.1", "10.0.0.2", 5201, ihl=6))[0][2] == 5201  # options skipped
    assert pathprobe.parse_ipv4_tcp(_ip_tcp("10.0.0.1", "10.0.0.2", 1, proto=socket.IPPROTO_UDP)) is None
    assert pathprobe.parse_ipv4_tcp(_ip_tcp("10.0.0.1", "10.0.0.2", 1, version=6)) is None
    assert pathprobe.parse_ipv4_tcp(_ip_tcp("10.0.0.1", "10.0.0.2", 1)[:22]) is None     # no ports
    assert pathprobe.parse_ipv4_tcp(_ip_tcp("10.0.0.1", "10.0.0.2", 1, ihl=4)) is None   # a bad header length


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=80))
def test_any_bytes_are_read_or_refused_never_raise(frame):
    got = pathprobe.parse_ipv4_tcp(frame)
    assert got is None or (len(got[0]) == 3 and 0 <= got[0][2] < 65536)


def _seen_along(view, paths_keys, extra=None):
    """Counters as the probe would have them, for flows on the given paths."""
    seen = collections.defaultdict(collections.Counter)
    for path, key in paths_keys:
        for u, v in zip(path[1:-1], path[2:]):
            seen[(u, view.port(u, v))][key] += 10
    for (sw, port), key, n in extra or ():
        seen[(sw, port)][key] += n
    return seen


@pytest.mark.parametrize("which", range(4))
def test_a_flow_is_walked_along_the_ports_it_left_by(view, which):
    src, dst = view.hosts[0], view.hosts[-1]           # inter-pod: 4 equal-cost paths
    paths = view.equal_cost_paths(src, dst)
    assert len(paths) == 4
    key = (view.ip(src), view.ip(dst), 5201)
    other = (view.ip(src), view.ip(dst), 5202)        # another flow of the same pair, elsewhere
    seen = _seen_along(view, [(paths[which], key), (paths[(which + 1) % 4], other)])
    assert pathprobe.walk(view, src, dst, key, seen) == paths[which]
    assert pathprobe.walk(view, src, dst, other, seen) == paths[(which + 1) % 4]


def test_the_port_with_most_of_a_flows_packets_wins_and_an_unseen_flow_has_no_path(view):
    src, dst = view.hosts[0], view.hosts[-1]
    paths = view.equal_cost_paths(src, dst)
    key = (view.ip(src), view.ip(dst), 5201)
    tor, agg = paths[1][1], paths[1][2]
    wrong = [p for p in paths if p[2] != agg][0][2]
    seen = _seen_along(view, [(paths[1], key)], extra=[((tor, view.port(tor, wrong)), key, 3)])
    assert pathprobe.walk(view, src, dst, key, seen) == paths[1]
    assert pathprobe.walk(view, src, dst, (view.ip(src), view.ip(dst), 9), seen) is None
    # intra-ToR: no multipath switch on the way, nothing to observe
    same_tor = [h for h in view.hosts if view.host_switch(h)[0] == view.host_switch(src)[0] and h != src][0]
    assert pathprobe.walk(view, src, same_tor, key, {}) == (src, view.host_switch(src)[0], same_tor)


def test_observed_paths_use_the_interfaces_names(view):
    src, dst = view.hosts[0], view.hosts[-1]
    path = view.equal_cost_paths(src, dst)[2]
    key = (view.ip(src), view.ip(dst), 5201)
    counts = {f"{u}-eth{view.port(u, v)}": collections.Counter({key: 5}) for u, v in zip(path[1:3], path[2:4])}
    counts["lo"] = collections.Counter({key: 99})       # not a probed port: ignored
    assert pathprobe.observed_paths(view, [(src, dst, key)], counts) == [path]


def test_capture_refuses_a_bad_duration():
    for bad in (0, -1, 61, float("nan"), float("inf")):
        with pytest.raises(pathprobe.ProbeError, match="seconds"):
            pathprobe.capture([], bad)


# ---- the replay ---------------------------------------------------------------------------------------

def test_pinned_pairs_take_their_paths_and_the_rest_ecmp():
    net = SimNet(fattree(4, link_mbps=10.0))
    hosts = net.view.hosts
    a, b, c = hosts[0], hosts[1], hosts[-1]           # a and b under one ToR, c in the last pod
    paths = net.view.equal_cost_paths(a, c)
    same_core = [p for p in net.view.equal_cost_paths(b, c) if p[3] == paths[0][3]][0]
    flows = Flows(np.array([net.endpoint(a), net.endpoint(b)]), np.array([net.endpoint(c), net.endpoint(c)]),
                  np.zeros(2), np.full(2, 1e12))
    # both pinned through one core switch: they share the core's link down to c's pod, 5 + 5 Mb/s
    pinned = PinnedRouter(net, {(a, c): paths[0], (b, c): same_core})
    assert pinned.path(None, 0, a, c) == paths[0] and pinned.path(None, 12345, b, c) == same_core
    res = Engine(net, pinned, "fair", 0.0).run(flows, 4)
    assert res.aggregate_bps((1, 4)) == pytest.approx(10e6, rel=1e-6)
    # not pinned: the ECMP groups' path, as make_router's ECMP gives it
    ecmp = make_router(net, "ecmp")
    assert pinned.path(None, 7, c, a) == ecmp.path(None, 7, c, a)


@pytest.mark.parametrize("bad, word", [
    (lambda p, h: {(h[0], h[-1]): p[:-1]}, "does not run"),               # stops short
    (lambda p, h: {(h[0], h[-1]): (h[1],) + p[1:]}, "does not run"),      # starts elsewhere
    (lambda p, h: {(h[0], h[-1]): (h[0],)}, "does not run"),
    (lambda p, h: {(h[0], h[-1]): (p[0], p[1], p[3], p[4], p[5], p[6])}, "no link"),   # skips a hop
])
def test_a_pinned_path_the_fabric_lacks_is_refused_by_name(bad, word):
    net = SimNet(fattree(4, link_mbps=10.0))
    h = net.view.hosts
    with pytest.raises(SimError, match=word):
        PinnedRouter(net, bad(net.view.equal_cost_paths(h[0], h[-1])[0], h))


def _routing_results(tmp_path, paths, observed=True, emu_mbps=10.0):
    from dataclasses import asdict
    from experiments.routing_comparison import Config
    cfg = asdict(Config(patterns=("permutation",), apps=("ecmp",)))
    flows = [{"src": p[0], "dst": p[-1], "mbps": emu_mbps / len(paths), "path": list(p)} for p in paths]
    report = {"config": cfg, "apps": {"ecmp": {"long": {"permutation": {
        "aggregate_mbps": emu_mbps, "paths_observed": observed, "flows": flows}}}}}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(report))
    return path


def test_validation_replays_the_observed_draw(tmp_path, monkeypatch):
    from experiments import routing_comparison
    from experiments.flowsim.validate import rows_for
    net = SimNet(fattree(4, link_mbps=10.0))
    hosts = net.view.hosts
    # a two-flow "permutation" whose recorded draw put both flows through one core switch
    pairs = [(hosts[0], hosts[-1]), (hosts[1], hosts[-2])]
    monkeypatch.setattr(routing_comparison, "_pairs", lambda name, h, seed: pairs)
    first = net.view.equal_cost_paths(*pairs[0])[0]
    second = [p for p in net.view.equal_cost_paths(*pairs[1]) if p[3] == first[3]][0]
    [row] = rows_for(_routing_results(tmp_path, [first, second]))
    assert row["same_paths"] is True
    assert row["sim_aggregate_mbps"] == pytest.approx(10.0, rel=1e-6)   # one core link down: 5 + 5
    assert row["aggregate_ratio"] == pytest.approx(1.0, rel=1e-6) and row["within"] is True
    assert row["draws"] == 20 and "sim_draws_mean_mbps" in row
    # the same file without observed paths: the draws' mean, as before
    [unobserved] = rows_for(_routing_results(tmp_path, [first, second], observed=False))
    assert "same_paths" not in unobserved
    assert unobserved["sim_aggregate_mbps"] == pytest.approx(row["sim_draws_mean_mbps"])


def test_capture_stops_once_it_has_seen_enough_and_observe_once_every_flow_is_walked(view, monkeypatch):
    import time
    t0 = time.monotonic()
    asked = []
    pathprobe.capture([], 30.0, done=lambda counts: asked.append(1) or len(asked) >= 3)
    assert time.monotonic() - t0 < 10 and len(asked) == 3        # stopped at the third check, not after 30 s
    # observe() asks whether every flow has a path: here the first check already has them all
    src, dst = view.hosts[0], view.hosts[-1]
    path = view.equal_cost_paths(src, dst)[1]
    key = (view.ip(src), view.ip(dst), 5201)
    seen = {f"{u}-eth{view.port(u, v)}": collections.Counter({key: 3}) for u, v in zip(path[1:3], path[2:4])}

    def fake_capture(ifaces, seconds, done=None):
        assert set(seen) <= set(ifaces) and seconds == 7.0 and done(seen) and not done({})
        return seen
    monkeypatch.setattr(pathprobe, "capture", fake_capture)
    assert pathprobe.observe(view, [(src, dst, key)], 7.0) == [path]
