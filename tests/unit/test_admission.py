"""Admission control against computations that do not share its formula:

- an LP (PuLP + HiGHS) of the worst hose traffic matrix across a cut, on
  random placements over the built-in fabrics (>= 200 instances);
- an exhaustive check over every cut of small random fabrics (every host
  subset, its min cut by max-flow): where the two agree, and that this
  module never admits what the exhaustive check rejects on fabrics whose
  layers have equal uplinks.
"""

import dataclasses
import itertools
import random

import networkx as nx
import pulp
import pytest

from controller import admission
from controller.topology import Host, Link, Switch, TopologyDescription
from mininet_topos import builders


def lp_crossing(guarantees: dict[str, float], side: frozenset[str]) -> float:
    """max sum of T[x][y] over x in side, y not in side, subject to the hose
    (each x sends at most B_x in total, each y receives at most B_y)."""
    hosts = sorted(guarantees)
    prob = pulp.LpProblem("hose", pulp.LpMaximize)
    t = {(x, y): prob.add_variable(f"t_{x}_{y}", lowBound=0) for x in hosts for y in hosts if x != y}
    prob += pulp.lpSum(v for (x, y), v in t.items() if x in side and y not in side)
    for h in hosts:
        prob += pulp.lpSum(v for (x, _), v in t.items() if x == h) <= guarantees[h]
        prob += pulp.lpSum(v for (_, y), v in t.items() if y == h) <= guarantees[h]
    prob.solve(pulp.HiGHS(msg=False))
    assert pulp.LpStatus[prob.status] == "Optimal"
    return pulp.value(prob.objective) or 0.0


def random_guarantees(rng, topo, density):
    hosts = [h.name for h in topo.hosts]
    chosen = [h for h in hosts if rng.random() < density] or [rng.choice(hosts)]
    return {h: round(rng.uniform(0.1, 9.0), 3) for h in chosen}


FABRICS = [builders.fattree(k=4, link_mbps=10), builders.star(n_senders=5, link_mbps=10),
           builders.lessor_testbed(link_mbps=10), builders.bgwc_testbed(link_mbps=10),
           builders.vl2(d0=2, d1=4, d2=4, servers_per_tor=3, server_mbps=10, fabric_mbps=12)]


def test_admission_agrees_with_an_lp_on_200_random_instances():
    rng = random.Random(21)
    decisions = {True: 0, False: 0}
    lps = 0
    for i in range(200):
        topo = FABRICS[i % len(FABRICS)]
        g = random_guarantees(rng, topo, rng.choice((0.3, 0.6, 1.0)))
        mu = rng.choice((0.5, 0.8, 0.9, 1.0))
        verdicts = admission.evaluate(topo, g, mu)
        # every cut's closed form against the LP on one random cut per instance
        # (and on the binding one): the LP is the definition of "can cross"
        picks = {rng.randrange(len(verdicts)), max(range(len(verdicts)),
                                                   key=lambda j: verdicts[j].crossing_mbps / verdicts[j].limit_mbps)}
        for j in picks:
            v = verdicts[j]
            want = lp_crossing(g, v.cut.hosts & frozenset(g)) if len(g) > 1 else 0.0
            lps += 1
            if v.cut.kind == "host":
                # a NIC carries what is enforced on it: its VMs' own guarantees, whatever the LP's worst
                # matrix (which the enforced rate bounds from above)
                own = sum(g.get(h, 0.0) for h in v.cut.hosts)
                assert v.crossing_mbps == pytest.approx(own) and want <= own + 1e-9, (topo.name, v.cut.name)
                want = own
            else:
                assert v.crossing_mbps == pytest.approx(want, rel=1e-6, abs=1e-9), (topo.name, v.cut.name)
            assert (want <= mu * v.cut.capacity_mbps * (1 + 1e-9)) == v.ok
        admitted = not admission.rejections(topo, g, mu)
        assert admitted == all(v.ok for v in verdicts)
        decisions[admitted] += 1
    assert lps >= 200
    assert decisions[True] >= 30 and decisions[False] >= 30, decisions   # both outcomes exercised


def test_every_rejection_names_the_cut_and_the_numbers():
    topo = builders.bgwc_testbed(link_mbps=10)       # 4 hosts | sl -- sm -- sr | 4 hosts
    g = {h: 3.5 for h in ("s1", "s2", "s3", "s4", "s5", "s6", "s7")}   # NICs 3.5 <= 9; 14 vs 10.5 across
    msgs = admission.rejections(topo, g, 0.9)
    assert any(m.startswith("ToR sl uplinks (1 link, 10 Mb/s per direction)") and "10.5 beyond" in m
               and "mu 0.9 x 10 = 9 Mb/s" in m for m in msgs), msgs
    assert not any(m.startswith("host") for m in msgs)
    assert admission.rejections(topo, {"s1": 9.0}, 0.9) == []     # alone: nothing can cross to anyone
    # but a VM's own guarantee must fit its NIC, where it is enforced, whatever its peers (issue #31)
    assert [m.split(":")[0] for m in admission.rejections(topo, {"s1": 9.5, "s2": 0.5}, 0.9)] == \
        ["host s1 NIC (1 link, 10 Mb/s per direction)"]
    # a full-bisection fat tree: only NICs can bind
    assert all(m.startswith("host h1 NIC") for m in admission.rejections(
        builders.fattree(k=4, link_mbps=10), {"h1": 9.5, "h2": 9.0, "h5": 9.0}, 0.9))


def test_cuts_of_a_fat_tree():
    topo = builders.fattree(k=4, link_mbps=10)
    cuts = admission.cuts(topo)
    kinds = [c.kind for c in cuts]
    assert kinds.count("host") == 16 and kinds.count("tor") == 8 and kinds.count("pod") == 4
    # a pod's cut is its aggregation switches' links to the core -- 2 x 2 of 10 Mb/s -- and none of the
    # links inside the pod (edge--aggregation): 40 Mb/s, not 120 (issue #33's surviving mutant)
    roles = {sw.name: sw.role for sw in topo.switches}
    for pod in (c for c in cuts if c.kind == "pod"):
        assert len(pod.links) == 4 and pod.capacity_mbps == 40.0, pod
        assert all({roles[u], roles[v]} == {"aggregation", "core"} for u, v in pod.links), pod.links
        assert len(pod.hosts) == 4
    # and admission binds on it once the core is over-subscribed (2.5 Mb/s core links: a pod's cut 10):
    # 4 hosts of a pod owed 3 Mb/s each to as much beyond cross 12 > 0.9 x 10; counted with the pod's
    # inside links (30 Mb/s) they would pass
    thin = TopologyDescription(topo.name, topo.switches, topo.hosts, [
        dataclasses.replace(lk, capacity_mbps=2.5) if {roles.get(lk.a), roles.get(lk.b)} == {"aggregation", "core"}
        else lk for lk in topo.links])
    pod0 = sorted(next(c for c in admission.cuts(thin) if c.kind == "pod").hosts)
    beyond = [h.name for h in topo.hosts if h.name not in pod0][:4]
    msgs = admission.rejections(thin, {h: 3.0 for h in pod0 + beyond}, 0.9)
    assert any(m.startswith("pod ") and "12 Mb/s" in m for m in msgs), msgs


def test_a_tree_is_checked_link_by_link():
    """In a tree every switch link is a bridge: an over-subscribed middle link is named."""
    switches = [Switch("r", 1, "core"), Switch("a1", 2, "aggregation"), Switch("a2", 3, "aggregation")]
    switches += [Switch(f"t{i}", 3 + i, "edge") for i in range(1, 5)]
    hosts = [Host(f"h{i}", f"10.0.0.{i}", f"00:00:00:00:00:{i:02x}") for i in range(1, 9)]
    links = [Link(f"h{i}", 0, f"t{(i + 1) // 2}", 1 + (i + 1) % 2, 10.0) for i in range(1, 9)]
    links += [Link(f"t{i}", 3, f"a{(i + 1) // 2}", 1 + (i + 1) % 2, 10.0) for i in range(1, 5)]
    links += [Link("a1", 3, "r", 1, 5.0), Link("a2", 3, "r", 2, 5.0)]
    topo = TopologyDescription("tree", switches, hosts, links)
    msgs = admission.rejections(topo, {h.name: 2.0 for h in hosts}, 1.0)
    assert [m.split(":")[0] for m in msgs] == ["link a1--r (1 link, 5 Mb/s per direction)",
                                              "link a2--r (1 link, 5 Mb/s per direction)"], msgs


# ---- exhaustive: every cut of small fabrics --------------------------------------------------
def _line(hosts_per_switch, uplink):
    """Switches in a line, each with hosts (a tree)."""
    switches, hosts, links, ports = [], [], [], {}

    def port(n):
        ports[n] = ports.get(n, 0) + 1
        return ports[n] - (0 if n.startswith("s") else 1)
    for i, n in enumerate(hosts_per_switch):
        sw = f"s{i + 1}"
        switches.append(Switch(sw, i + 1, "edge", i))
        for _ in range(n):
            h = f"h{len(hosts) + 1}"
            hosts.append(Host(h, f"10.0.0.{len(hosts) + 1}", f"00:00:00:00:00:{len(hosts) + 1:02x}"))
            links.append(Link(h, port(h), sw, port(sw), 10.0))
    for i, cap in enumerate(uplink):
        a, b = f"s{i + 1}", f"s{i + 2}"
        links.append(Link(a, port(a), b, port(b), cap))
    return TopologyDescription("line", switches, hosts, links)


def _leaf_spine(rng, leaves, hosts_per_leaf, spines, equal):
    switches = [Switch(f"c{j + 1}", j + 1, "core") for j in range(spines)]
    switches += [Switch(f"e{i + 1}", spines + i + 1, "edge", i) for i in range(leaves)]
    hosts, links, ports = [], [], {}

    def port(n):
        ports[n] = ports.get(n, 0) + 1
        return ports[n] - (1 if n.startswith("h") else 0)
    for i in range(leaves):
        for _ in range(hosts_per_leaf):
            k = len(hosts) + 1
            h = f"h{k}"
            hosts.append(Host(h, f"10.0.0.{k}", f"00:00:00:00:00:{k:02x}"))
            links.append(Link(h, port(h), f"e{i + 1}", port(f"e{i + 1}"), 10.0))
    cap = rng.choice((5.0, 10.0, 20.0))
    for i in range(leaves):
        for j in range(spines):
            c = cap if equal else rng.choice((2.0, 5.0, 10.0, 20.0))
            links.append(Link(f"e{i + 1}", port(f"e{i + 1}"), f"c{j + 1}", port(f"c{j + 1}"), c))
    return TopologyDescription("leafspine", switches, hosts, links)


def exhaustive_admits(topo, g, mu) -> bool:
    """Every host's own guarantees fit its NIC (they are enforced there
    whatever the peers), and for every host subset S: min(B_S, B_rest) <=
    mu x (min cut between S and the rest)."""
    graph = nx.Graph()
    for lk in topo.links:
        graph.add_edge(lk.a, lk.b, capacity=lk.capacity_mbps + (graph[lk.a][lk.b]["capacity"]
                                                                if graph.has_edge(lk.a, lk.b) else 0))
    hosts = [h.name for h in topo.hosts]
    for h in hosts:
        nic = sum(d["capacity"] for _, _, d in graph.edges(h, data=True))
        if g.get(h, 0.0) > mu * nic * (1 + 1e-9):
            return False
    total = sum(g.values())
    for r in range(1, len(hosts)):
        for side in itertools.combinations(hosts[1:], r):     # S never holds hosts[0]: each cut once
            inside = sum(g.get(h, 0.0) for h in side)
            need = min(inside, total - inside)
            if need <= 0:
                continue
            net = graph.copy()
            for h in side:
                net.add_edge("SRC", h, capacity=float("inf"))
            for h in hosts:
                if h not in side:
                    net.add_edge(h, "DST", capacity=float("inf"))
            cut, _ = nx.minimum_cut(net, "SRC", "DST")
            if need > mu * cut * (1 + 1e-9):
                return False
    return True


def test_on_equal_uplinks_admission_is_exactly_the_all_cuts_check():
    rng = random.Random(7)
    agree = 0
    outcomes = set()
    for i in range(24):
        if i % 3 == 0:
            topo = _line([rng.randint(1, 3) for _ in range(3)], uplink=[rng.choice((4.0, 10.0, 30.0))] * 2)
        else:
            topo = _leaf_spine(rng, leaves=rng.randint(2, 3), hosts_per_leaf=rng.randint(1, 3),
                               spines=rng.randint(1, 2), equal=True)
        g = random_guarantees(rng, topo, 0.8)
        mu = rng.choice((0.6, 0.9, 1.0))
        ours = not admission.rejections(topo, g, mu)
        assert ours == exhaustive_admits(topo, g, mu), (topo.to_dict(), g, mu)
        agree += 1
        outcomes.add(ours)
    assert agree == 24 and outcomes == {True, False}


def test_on_unequal_uplinks_a_rejection_is_always_right():
    """Every cut this module checks is a real cut, so whatever it rejects
    the exhaustive check rejects too; the converse can fail when a cut
    mixing several ToRs' uplinks is the smallest (documented)."""
    rng = random.Random(11)
    missed = 0
    for _ in range(100):
        topo = _leaf_spine(rng, leaves=3, hosts_per_leaf=rng.randint(1, 2), spines=2, equal=False)
        g = random_guarantees(rng, topo, 1.0)
        mu = rng.choice((0.6, 0.9))
        ours = not admission.rejections(topo, g, mu)
        exact = exhaustive_admits(topo, g, mu)
        assert ours or not exact
        missed += ours and not exact
    print(f"unequal uplinks: {missed} of 100 admitted here but over-subscribed on a mixed cut")


@pytest.mark.parametrize("bad", [-5.0, float("nan"), float("inf"), "3", None, True])
def test_a_guarantee_that_is_not_a_number_is_refused_by_name(bad):
    """Before #31 a negative guarantee let an over-commit through (it
    lowered a cut's sum) and a string raised TypeError."""
    topo = builders.bgwc_testbed(link_mbps=10)
    g = {"s1": 9.0, "s2": 9.0, "s5": 9.0, "s6": bad}
    with pytest.raises(ValueError, match="s6"):
        admission.rejections(topo, g, 0.9)
    with pytest.raises(ValueError, match="mu"):
        admission.rejections(topo, {"s1": 1.0}, float("nan"))


def test_a_cut_describes_itself_and_headroom_lists_every_cut():
    """What an operator reads (a refusal, the API's cuts, the metrics'
    labels): the cut's name, its links (one link, several links) and its
    capacity per direction; headroom's rows carry each cut's kind."""
    topo = builders.fattree(4, link_mbps=10)
    rows = admission.headroom(topo, {"h1": 4.0}, 0.9)
    cuts = {c.name: c for c in admission.cuts(topo)}
    assert {r["cut"] for r in rows} == set(cuts)
    assert all(set(r) == {"kind", "cut", "capacity_mbps", "limit_mbps", "crossing_mbps"} for r in rows)
    nic = next(r for r in rows if r["cut"] == "host h1 NIC")
    assert nic == {"kind": "host", "cut": "host h1 NIC", "capacity_mbps": 10.0, "limit_mbps": 9.0,
                   "crossing_mbps": 4.0}
    assert {r["kind"] for r in rows} == {c.kind for c in cuts.values()} and len({r["kind"] for r in rows}) > 1
    one = cuts["host h1 NIC"]
    assert one.describe() == "host h1 NIC (1 link, 10 Mb/s per direction)"
    many = next(c for c in cuts.values() if len(c.links) > 1)
    assert many.describe() == f"{many.name} ({len(many.links)} links, {many.capacity_mbps:g} Mb/s per direction)"


def test_parallel_links_add_their_capacities_to_a_cut():
    """Two links between the same switches (a LAG-like pair, 10 + 5 Mb/s):
    the ToR's uplink cut counts both, and only the ToRs' own groups."""
    topo = builders.fattree(4)
    e, a = "e0_0", next(lk.b if lk.a == "e0_0" else lk.a for lk in topo.links
                        if "e0_0" in (lk.a, lk.b) and "a0_" in lk.a + lk.b)
    spare_e = max(lk.a_port if lk.a == e else lk.b_port for lk in topo.links if e in (lk.a, lk.b)) + 1
    spare_a = max(lk.a_port if lk.a == a else lk.b_port for lk in topo.links if a in (lk.a, lk.b)) + 1
    doubled = dataclasses.replace(topo, links=[*topo.links, Link(e, spare_e, a, spare_a, 5.0)])
    before = {c.name: c.capacity_mbps for c in admission.cuts(topo)}
    after = {c.name: c.capacity_mbps for c in admission.cuts(doubled)}
    assert after[f"ToR {e} uplinks"] == before[f"ToR {e} uplinks"] + 5.0
    assert {n: v for n, v in after.items() if n != f"ToR {e} uplinks"} == \
        {n: v for n, v in before.items() if n != f"ToR {e} uplinks"}


def test_no_cut_is_all_the_hosts():
    """A ToR under which every host sits (one-ToR fabric) is no cut: nothing leaves it."""
    topo = TopologyDescription(
        name="one-tor", switches=[Switch("e0", 1, "edge", 0), Switch("a0", 2, "aggregation", 0)],
        hosts=[Host("h1", "10.0.0.1", "00:00:00:00:00:01"), Host("h2", "10.0.0.2", "00:00:00:00:00:02")],
        links=[Link("h1", 0, "e0", 1, 10.0), Link("h2", 0, "e0", 2, 10.0), Link("e0", 3, "a0", 1, 10.0)])
    assert [c.kind for c in admission.cuts(topo)] == ["host", "host"]


def test_a_pod_of_two_switches_is_a_cut_and_a_pod_of_one_is_its_tors():
    sw = [Switch("e0", 1, "edge", 0), Switch("a0", 2, "aggregation", 0), Switch("e1", 3, "edge", 1),
          Switch("c0", 4, "core")]
    hosts = [Host(f"h{i}", f"10.0.0.{i}", f"00:00:00:00:00:0{i}") for i in (1, 2, 3)]
    links = [Link("h1", 0, "e0", 1, 10.0), Link("h2", 0, "e0", 2, 10.0), Link("h3", 0, "e1", 1, 10.0),
             Link("e0", 3, "a0", 1, 10.0), Link("a0", 2, "c0", 1, 4.0), Link("e1", 2, "c0", 2, 10.0)]
    got = [(c.kind, c.name, c.capacity_mbps) for c in admission.cuts(TopologyDescription("pods", sw, hosts, links))
           if c.kind != "host"]
    # every link of this fabric is a bridge, and each is a ToR's or the pod's cut already: no bridge cut twice
    assert got == [("tor", "ToR e0 uplinks", 10.0), ("tor", "ToR e1 uplinks", 10.0), ("pod", "pod 0 uplinks", 4.0)]


def test_a_bridge_between_core_switches_is_a_cut_of_its_own():
    sw = [Switch("e0", 1, "edge", 0), Switch("e1", 2, "edge", 1), Switch("c0", 3, "core"), Switch("c1", 4, "core")]
    hosts = [Host(f"h{i}", f"10.0.0.{i}", f"00:00:00:00:00:0{i}") for i in (1, 2, 3)]
    links = [Link("h1", 0, "e0", 1, 10.0), Link("h2", 0, "e1", 1, 10.0), Link("h3", 0, "e1", 2, 10.0),
             Link("e0", 2, "c0", 1, 10.0), Link("c0", 2, "c1", 1, 3.0), Link("c1", 2, "e1", 3, 10.0)]
    got = [(c.kind, c.name, sorted(c.hosts), c.capacity_mbps)
           for c in admission.cuts(TopologyDescription("chain", sw, hosts, links)) if c.kind != "host"]
    assert got == [("tor", "ToR e0 uplinks", ["h1"], 10.0), ("tor", "ToR e1 uplinks", ["h2", "h3"], 10.0),
                   ("bridge", "link c0--c1", ["h1"], 3.0)]


@pytest.mark.parametrize("mu", [0, 0.0, -0.5, 1.0000001, 2, float("nan"), float("inf"), "0.9", None])
def test_mu_outside_0_1_is_refused_by_name(mu):
    with pytest.raises(ValueError) as err:
        admission.rejections(builders.fattree(4), {}, mu)
    assert str(err.value) == f"mu {mu!r} must be in (0, 1]"


def test_mu_of_one_and_just_above_zero_are_taken():
    assert admission.rejections(builders.fattree(4), {}, 1.0) == []
    assert admission.rejections(builders.fattree(4), {}, 1e-9) == []
