import pytest

from apps.routing import logic
from apps.routing.logic import DestinationRouting, app_logic
from controller import ofmsg
from bwtesting.fakenet import FakeNetwork
from experiments.maxmin import max_min_fair
from controller.network_view import NetworkView
from experiments.workloads import stride
from mininet_topos import builders


def _install(topo, app):
    view = NetworkView(topo)
    routing = app_logic(view, app)
    net = FakeNetwork(view)
    for sw in view.switches:
        net.apply(sw, routing.switch_connected(sw))
    assert net.errors() == {}
    return view, routing, net


@pytest.mark.parametrize("app", ["single_path", "ecmp"])
@pytest.mark.parametrize("kind", list(builders.BUILDERS))
def test_every_host_pair_reachable(kind, app):
    view, _, net = _install(builders.build(kind), app)
    for a in view.hosts:
        for b in view.hosts:
            if a == b:
                continue
            for proto in ("tcp", "udp", "arp"):
                trace = net.trace(a, net.packet(a, b, proto=proto))
                assert trace.delivered_to == b, (kind, app, a, b, proto, trace.path)
                assert not trace.packet_in
    assert net.packet_ins == []


def _cores_used(net, src, dst, n=400):
    cores = {}
    for sport in range(20000, 20000 + n):
        path = net.trace(src, net.packet(src, dst, sport=sport)).path
        core = [s for s in path if s.startswith("c")]
        cores[core[0]] = cores.get(core[0], 0) + 1
    return cores


def test_ecmp_spreads_inter_pod_flows_over_all_four_cores():
    view, _, net = _install(builders.fattree(4), "ecmp")
    for src, dst in [("h1", "h16"), ("h3", "h7"), ("h12", "h2")]:
        cores = _cores_used(net, src, dst)
        assert set(cores) == {"c1", "c2", "c3", "c4"}, cores
        assert min(cores.values()) > 400 / 4 * 0.6, cores  # roughly even
    paths = {net.trace("h1", net.packet("h1", "h16", sport=s)).path for s in range(20000, 20400)}
    assert len(paths) == 4


def test_one_bucket_per_next_hop_polarises_and_the_fake_network_shows_it(monkeypatch):
    """Same hash at every switch: without the layered bucket layout, the
    edge and the aggregation choose with the same hash digit and only two of
    the four cores carry h1 -> h16 (what OVS 3.1 did when measured)."""
    monkeypatch.setattr(DestinationRouting, "bucket_layout", lambda self, sw, ports: tuple(ports))
    _, _, net = _install(builders.fattree(4), "ecmp")
    assert len(_cores_used(net, "h1", "h16")) == 2


def test_select_groups_are_layered_by_layer():
    view, routing, net = _install(builders.fattree(4), "ecmp")
    edge_groups = net.switches["e0_0"].groups.values()
    agg_groups = net.switches["a0_0"].groups.values()
    assert {len(g.buckets) for g in edge_groups} == {2}
    assert {len(g.buckets) for g in agg_groups} == {4}
    (agg,) = agg_groups
    ports = [b.actions[0].port for b in agg.buckets]
    assert ports[0] == ports[1] != ports[2] == ports[3]
    assert all(b.watch_port == b.actions[0].port for b in agg.buckets)


def test_single_path_spreads_destinations_over_cores():
    view, routing, _ = _install(builders.fattree(4), "single_path")
    cores = {routing.single_path("h1", d)[3] for d in ["h13", "h14", "h15", "h16"]}
    assert cores == {"c1", "c2", "c3", "c4"}


@pytest.mark.parametrize("step", [4, 8])
def test_single_path_stride_patterns_are_non_blocking(step):
    view, routing, net = _install(builders.fattree(4), "single_path")
    pairs = stride(view.hosts, step)
    paths = [routing.single_path(s, d) for s, d in pairs]
    for (s, d), p in zip(pairs, paths):
        assert net.trace(s, net.packet(s, d)).path == p[1:-1]   # the fake agrees with the logic
    cap = {(u, v): view.capacity(u, v) / 1e6 for u, v in view.graph.edges}
    rates = max_min_fair([view.path_links(p) for p in paths], cap)
    assert rates == pytest.approx([10.0] * 16)


@pytest.mark.parametrize("app", ["single_path", "ecmp"])
def test_link_failure_reroutes_make_before_break(app):
    view, routing, net = _install(builders.fattree(4), app)
    port = view.port("a0_0", "c1")
    updates = routing.link_changed("a0_0", port, False)
    assert updates, "a failed core link must change some switch"
    for sw, msgs in updates.items():
        kinds = [type(m).__name__ + ":" + m.command for m in msgs]
        first_delete = next((i for i, k in enumerate(kinds) if "delete" in k), len(kinds))
        assert all("delete" in k for k in kinds[first_delete:]), kinds  # adds before removals
        net.apply(sw, msgs)
    assert net.errors() == {}
    for a in view.hosts:
        for b in view.hosts:
            if a != b:
                for sport in (1000, 1001, 1002, 1003):
                    trace = net.trace(a, net.packet(a, b, sport=sport))
                    assert trace.delivered_to == b
                    assert ("a0_0", "c1") not in view.path_links(trace.path)
    # and back up: paths through c1 are used again
    for sw, msgs in routing.link_changed("a0_0", port, True).items():
        net.apply(sw, msgs)
    if app == "ecmp":
        assert "c1" in _cores_used(net, "h1", "h16")


def test_reconnect_reinstalls_cleanly():
    view, routing, net = _install(builders.fattree(4), "ecmp")
    net.apply("e0_0", routing.switch_connected("e0_0"))   # the switch reconnects
    assert net.errors() == {}
    assert net.trace("h1", net.packet("h1", "h16")).delivered_to == "h16"
    n_flows = len(net.switches["e0_0"].flows(1))
    assert n_flows == 2 * len(view.hosts)


def test_unknown_app_rejected():
    with pytest.raises(ValueError, match="unknown routing app"):
        app_logic(NetworkView(builders.star()), "ospf")


def test_messages_are_ordered_groups_before_flows():
    view = NetworkView(builders.fattree(4))
    msgs = app_logic(view, "ecmp").switch_connected("e0_0")
    kinds = [(type(m).__name__, m.command) for m in msgs]
    last_group = max(i for i, k in enumerate(kinds) if k[0] == "GroupMod")
    first_add = min(i for i, k in enumerate(kinds) if k == ("FlowMod", "add"))
    assert kinds[0] == ("FlowMod", "delete") and last_group < first_add
    assert logic.MAX_SELECT_BUCKETS == 64
    assert ofmsg.ordered(msgs + msgs) == msgs  # dedupe keeps order


@pytest.mark.parametrize("app", ["single_path", "ecmp"])
def test_a_hosts_vm_block_is_routed_to_it_and_only_it(app):
    """VMs behind a host's NIC (issue #32 §4): their addresses, in the host's
    vm_prefix, reach that host -- IP and ARP -- from every other host, and
    an address beside the block reaches nobody."""
    from dataclasses import replace

    from controller.topology import TopologyDescription
    base = builders.fattree(4)
    hosts = [replace(h, vm_prefix="10.1.9.0/28") if h.name == "h9" else h for h in base.hosts]
    topo = TopologyDescription.from_dict({**base.to_dict(), "hosts": [
        {k: v for k, v in vars(h).items() if v is not None} for h in hosts]})
    view, _, net = _install(topo, app)
    for src in view.hosts:
        if src == "h9":
            continue
        for vm_ip, proto in (("10.1.9.2", "tcp"), ("10.1.9.14", "udp"), ("10.1.9.2", "arp")):
            pkt = net.packet(src, "h9", proto=proto)
            pkt.update(arp_tpa=vm_ip) if proto == "arp" else pkt.update(ipv4_dst=vm_ip)
            assert net.trace(src, pkt).delivered_to == "h9", (src, vm_ip, proto)
        stray = net.packet(src, "h9")
        stray.update(ipv4_dst="10.1.9.16")                           # just past the /28
        assert net.trace(src, stray).delivered_to is None
    assert view.host_by_ip("10.1.9.3") == "h9" and view.host_by_ip("10.1.9.16") is None


def test_a_forwarding_loop_is_reported_with_the_entries_that_made_it():
    """The fake network names the entries of a loop's first two switches
    (what the fuzz test prints when one appears)."""
    view = NetworkView(builders.build("fattree"))
    net = FakeNetwork(view)
    src, dst = view.hosts[0], view.hosts[-1]
    tor, _ = view.host_switch(src)
    agg = [n for n in view.next_hops(tor, dst)][0]
    for sw, peer, cookie in ((tor, agg, 0xAB), (agg, tor, 0xCD)):
        net.apply(sw, [ofmsg.FlowMod(0, 7, ofmsg.Match.of(eth_type=ofmsg.ETH_TYPE_IP, ipv4_dst=view.ip(dst)),
                                     (ofmsg.ApplyActions((ofmsg.Output(view.port(sw, peer)),)),), cookie=cookie)])
    with pytest.raises(RuntimeError, match="forwarding loop") as err:
        net.trace(src, net.packet(src, dst))
    text = str(err.value)
    assert f"{tor}: t0 prio 7 cookie 0xab" in text and f"{agg}: t0 prio 7 cookie 0xcd" in text, text
