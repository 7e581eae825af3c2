from controller.network_view import NetworkView
from mininet_topos import builders


def test_fattree_equal_cost_path_counts():
    v = NetworkView(builders.fattree(4))
    assert len(v.equal_cost_paths("h1", "h2")) == 1      # same edge switch
    assert len(v.equal_cost_paths("h1", "h3")) == 2      # same pod
    paths = v.equal_cost_paths("h1", "h16")               # inter-pod
    assert len(paths) == 4
    assert {p[3] for p in paths} == {"c1", "c2", "c3", "c4"}
    assert all(len(p) == 7 for p in paths)
    assert len(NetworkView(builders.fattree(8)).equal_cost_paths("h1", "h128")) == 16


def test_paths_never_transit_hosts_and_ports_are_consistent():
    v = NetworkView(builders.fattree(4))
    for p in v.equal_cost_paths("h1", "h9"):
        assert all(not v.is_host(n) for n in p[1:-1])
        for a, b in v.path_links(p):
            assert v.peer(a, v.port(a, b)) == b


def test_link_failure_leaves_the_view_at_once():
    v = NetworkView(builders.fattree(4))
    before = v.version
    a, port = "a0_0", v.port("a0_0", "c1")
    assert v.set_port_state(a, port, False) == ("a0_0", "c1")
    assert v.version == before + 1
    paths = v.equal_cost_paths("h1", "h16")
    assert len(paths) == 3 and all("c1" not in p for p in paths)
    assert v.set_port_state(a, port, False) is None       # no change, no bump
    v.set_port_state(a, port, True)
    assert len(v.equal_cost_paths("h1", "h16")) == 4


def test_vl2_and_testbed_paths():
    v = NetworkView(builders.vl2(2, 4, 4))
    assert len(v.equal_cost_paths("h1", "h80")) == 8   # 2 aggs up x 2 ints x 2 aggs down
    t = NetworkView(builders.lessor_testbed())
    assert len(t.equal_cost_paths("h1", "h5")) == 2
    assert len(t.equal_cost_paths("h1", "h2")) == 1
    b = NetworkView(builders.bgwc_testbed())
    assert b.equal_cost_paths("s1", "s5") == [("s1", "sl", "sm", "sr", "s5")]
