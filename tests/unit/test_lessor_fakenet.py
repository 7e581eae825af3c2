"""LESSOR on the fake network: ToR counters -> long flows -> PMPT -> entries
that the long flows really follow; short flows never wait for the controller."""

from apps.lessor.logic import LessorLogic
from bwtesting.fakenet import FakeNetwork
from controller.network_view import NetworkView
from mininet_topos import builders

PAIRS = [("h1", "h16"), ("h2", "h15"), ("h3", "h14"), ("h5", "h12"), ("h6", "h11"), ("h9", "h4")]


def _setup():
    view = NetworkView(builders.fattree(4, link_mbps=10))
    logic = LessorLogic(view)
    net = FakeNetwork(view)
    for sw in view.switches:
        net.apply(sw, logic.switch_connected(sw))
    assert net.errors() == {}
    return view, logic, net


def _send(net, pairs, packets, sport=1000):
    for src, dst in pairs:
        for _ in range(packets):
            trace = net.trace(src, net.packet(src, dst, sport=sport, length=9000))
            assert trace.delivered_to == dst and not trace.packet_in


def _poll(logic, net, now):
    for sw, reqs in logic.poll(now).items():
        for req in reqs:
            logic.flow_stats(sw, net.flow_stats(sw, req), now)


def _steady_elephants(logic, net):
    """Two polling intervals of steady 1.44 Mb/s elephants for PAIRS."""
    _poll(logic, net, 0.0)
    for t in (1.0, 2.0):
        _send(net, PAIRS, packets=20)
        _poll(logic, net, t)


def _allocate_and_install(logic, net):
    flows = logic.long_flows()
    alloc = logic.allocate(flows)
    for sw, msgs in logic.install(alloc, flows):
        net.apply(sw, msgs)
    assert net.errors() == {}
    return flows, alloc


def test_long_flows_follow_their_allocated_paths_and_short_flows_never_packet_in():
    view, logic, net = _setup()
    _poll(logic, net, 0.0)
    _send(net, PAIRS, packets=20)            # 180 KB each: long
    _poll(logic, net, 1.0)
    _send(net, PAIRS, packets=20)            # elephants keep going: 1.44 Mb/s
    _send(net, [("h7", "h8")], packets=3)    # 27 KB: short
    _poll(logic, net, 2.0)
    flows, alloc = _allocate_and_install(logic, net)
    assert len(flows) == len(PAIRS)                          # the short flow never reached PMPT
    assert alloc.integral_lam == 1.0                         # a permutation: no shared link
    for src, dst in PAIRS:
        key = (view.ip(src), view.ip(dst), 6, 1000, 80)
        want = logic.installed[key].path[1:-1]
        trace = net.trace(src, net.packet(src, dst, sport=1000))
        assert trace.path == want and trace.delivered_to == dst
    # brand-new flows (any size) are forwarded at once by the defaults
    for src, dst in [("h1", "h9"), ("h7", "h8"), ("h16", "h1")]:
        trace = net.trace(src, net.packet(src, dst, sport=2000))
        assert trace.delivered_to == dst and not trace.packet_in
    assert net.packet_ins == []
    # the source ToR keeps counting an installed long flow
    before = dict(((tuple(sorted(m.items())), b) for m, b in net.flow_stats("e0_0", logic.poll(3.0)["e0_0"][0])))
    _send(net, [("h1", "h16")], packets=2)
    after = dict(((tuple(sorted(m.items())), b) for m, b in net.flow_stats("e0_0", logic.poll(3.5)["e0_0"][0])))
    assert sum(after.values()) - sum(before.values()) == 2 * 9000


def test_reroute_is_make_before_break():
    view, logic, net = _setup()
    _steady_elephants(logic, net)
    _allocate_and_install(logic, net)
    key = (view.ip("h1"), view.ip("h16"), 6, 1000, 80)
    old = logic.installed[key].path
    core = old[3]
    agg = old[2]
    # fail the flow's core link; the next allocation must move it
    view.set_link_state(agg, core, False)
    flows = logic.long_flows()
    alloc = logic.allocate(flows)
    plan = logic.install(alloc, flows)
    new = logic.installed[key].path
    assert core not in new
    order = [(sw, m) for sw, msgs in plan for m in msgs]
    adds = [sw for sw, m in order if m.command == "add" and dict(m.match.fields).get("tcp_src") == 1000
            and m.match.as_dict()["ipv4_src"] == view.ip("h1")]
    assert adds == list(reversed(new[1:-1]))                 # destination first, the ToR last
    first_delete = next(i for i, (_, m) in enumerate(order) if m.command.startswith("delete"))
    assert all(not m.command.startswith("delete") for _, m in order[:first_delete])
    for sw, msgs in plan:
        net.apply(sw, msgs)
    trace = net.trace("h1", net.packet("h1", "h16", sport=1000))
    assert trace.delivered_to == "h16" and trace.path == new[1:-1]
    for sw in old[1:-1]:
        if sw not in new:   # entries only the old path used are gone
            assert not [e for e in net.switches[sw].flows(1) if e.priority == 1000
                        and e.match.as_dict().get("ipv4_src") == view.ip("h1")]


def test_reconnecting_switch_gets_its_long_flow_entries_back():
    view, logic, net = _setup()
    _steady_elephants(logic, net)
    _allocate_and_install(logic, net)
    key = (view.ip("h1"), view.ip("h16"), 6, 1000, 80)
    path = logic.installed[key].path
    agg = path[2]
    net.restart(agg)                                   # back with empty tables
    net.apply(agg, logic.switch_connected(agg))
    assert net.errors() == {}
    assert net.trace("h1", net.packet("h1", "h16", sport=1000)).path == path[1:-1]
    # every long flow through it has its exact entry there again, not only the traced one
    through = [k for k, v in logic.installed.items() if agg in v.path]
    exact = [e for e in net.switches[agg].flows(1) if e.priority == 1000]
    assert len(through) >= 1 and len(exact) == len(through)
    state = logic.state()
    assert state["polling_period_s"] > 0 and len(state["installed"]) == len(PAIRS)


def test_slow_long_flows_get_their_rate_as_demand_and_paths_are_sticky():
    view, logic, net = _setup()
    _poll(logic, net, 0.0)
    _send(net, PAIRS, packets=20)
    _send(net, [("h16", "h1")], packets=12, sport=3000)      # 108 KB in 1 s: long but slow
    _poll(logic, net, 1.0)
    _send(net, PAIRS, packets=20)
    _send(net, [("h16", "h1")], packets=1, sport=3000)       # 72 kb/s: an ACK-like stream
    _poll(logic, net, 2.0)
    flows = {f.key: f for f in logic.long_flows()}
    slow = flows[(view.ip("h16"), view.ip("h1"), 6, 3000, 80)]
    assert slow.demand == 9000 * 8                          # its measured rate, not a NIC share
    fast = flows[(view.ip("h1"), view.ip("h16"), 6, 1000, 80)]
    assert fast.demand == 10e6                              # Hedera: alone at both NICs
    _allocate_and_install(logic, net)
    before = {k: v.path for k, v in logic.installed.items()}
    # one more elephant appears: nobody already placed is moved for it
    _send(net, PAIRS, packets=20)
    _send(net, [("h4", "h13")], packets=40, sport=4000)
    _poll(logic, net, 3.0)
    _send(net, PAIRS, packets=20)
    _send(net, [("h4", "h13")], packets=20, sport=4000)
    _poll(logic, net, 4.0)
    _allocate_and_install(logic, net)
    assert all(logic.installed[k].path == p for k, p in before.items())
    assert logic.reroutes == 0 and (view.ip("h4"), view.ip("h13"), 6, 4000, 80) in logic.installed


def test_failed_link_on_a_long_flow_path_falls_back_then_reroutes():
    view, logic, net = _setup()
    _steady_elephants(logic, net)
    _allocate_and_install(logic, net)
    key = (view.ip("h1"), view.ip("h16"), 6, 1000, 80)
    path = logic.installed[key].path
    agg, core = path[2], path[3]
    for sw, msgs in logic.link_changed(agg, view.port(agg, core), False).items():
        net.apply(sw, msgs)
    assert key not in logic.installed
    trace = net.trace("h1", net.packet("h1", "h16", sport=1000))
    assert trace.delivered_to == "h16" and core not in trace.path       # at once, on the defaults
    _send(net, PAIRS, packets=20)
    _poll(logic, net, 3.0)
    _allocate_and_install(logic, net)
    new = logic.installed[key].path
    assert core not in new
    assert net.trace("h1", net.packet("h1", "h16", sport=1000)).path == new[1:-1]


def test_hedera_places_elephants_first_fit_and_leaves_the_rest_on_ecmp():
    from apps.lessor.hedera_logic import HederaLogic
    view = NetworkView(builders.fattree(4, link_mbps=10))
    logic = HederaLogic(view)
    assert logic.polling.period_s == 5.0 and logic.polling.decide(cpu=0.0) == 5.0   # fixed period
    net = FakeNetwork(view)
    for sw in view.switches:
        net.apply(sw, logic.switch_connected(sw))
    _poll(logic, net, 0.0)
    for t in (1.0, 2.0):
        _send(net, PAIRS, packets=20)                                   # 1.44 Mb/s: elephants (>= 1 Mb/s)
        _send(net, [("h7", "h8")], packets=15, sport=7000)              # h7, h8 share ToR e1_1: no fabric choice
        _send(net, [("h10", "h3")], packets=5, sport=7001)              # 0.36 Mb/s: a mouse for Hedera
        _poll(logic, net, t)
    flows = logic.long_flows()
    keys = {f.key for f in flows}
    assert (view.ip("h10"), view.ip("h3"), 6, 7001, 80) not in keys         # below 10 % of the NIC
    alloc = logic.allocate(flows)
    assert alloc.placement == "global first fit"
    for sw, msgs in logic.install(alloc, flows):
        net.apply(sw, msgs)
    assert net.errors() == {}
    for src, dst in PAIRS:
        key = (view.ip(src), view.ip(dst), 6, 1000, 80)
        if key in logic.installed:
            assert net.trace(src, net.packet(src, dst, sport=1000)).path == logic.installed[key].path[1:-1]
    # GFF reserved the NIC-rate demand on every link it used
    assert alloc.integral_lam >= 1.0


def test_ended_flows_are_forgotten_once_their_counters_are_gone():
    view, logic, net = _setup()
    _steady_elephants(logic, net)
    _allocate_and_install(logic, net)
    key = (view.ip("h1"), view.ip("h16"), 6, 1000, 80)
    assert key in logic.installed and key in logic.table.flows
    # h1's counter idles out on the switch: the ToR stops reporting it
    e00 = net.switches["e0_0"]
    for k, entry in list(e00.entries.items()):
        if entry.flow.table_id == 3 and entry.flow.match.as_dict().get("ipv4_src") == view.ip("h1"):
            del e00.entries[k]
    period = logic.polling.period_s
    for t in (3.0, 3.0 + period, 3.0 + 2 * period, 3.0 + 3 * period + 1.5):
        _send(net, [p for p in PAIRS if p[0] != "h1"], packets=20)
        _poll(logic, net, t)
        logic.decide(t, cpu=0.6, rtt_s=None)
    assert key not in logic.installed and key not in logic.table.flows
    assert all(f.key != key for f in logic.long_flows())
    assert (view.ip("h2"), view.ip("h15"), 6, 1000, 80) in logic.table.flows   # still reported: kept


def test_pmpt_is_skipped_while_its_input_is_unchanged():
    view, logic, net = _setup()
    _steady_elephants(logic, net)
    flows = logic.long_flows()
    assert logic.allocation_needed(flows)                    # nothing allocated yet
    _allocate_and_install(logic, net)
    _send(net, PAIRS, packets=20)                            # same elephants, same rates
    _poll(logic, net, 3.0)
    assert not logic.allocation_needed(logic.long_flows())
    _send(net, PAIRS + [("h4", "h13")], packets=20)          # a new long flow appears
    _poll(logic, net, 4.0)
    assert logic.allocation_needed(logic.long_flows())
    _allocate_and_install(logic, net)
    _send(net, PAIRS + [("h4", "h13")], packets=20)
    _poll(logic, net, 5.0)
    assert not logic.allocation_needed(logic.long_flows())
    core_link = next((a, b) for a, b in zip(logic.installed[next(iter(logic.installed))].path[2:],
                                             logic.installed[next(iter(logic.installed))].path[3:]))
    logic.link_changed(core_link[0], view.port(*core_link), False)   # the view changed
    assert logic.allocation_needed(logic.long_flows())
    assert not logic.allocation_needed([])                   # no long flows: nothing to do
