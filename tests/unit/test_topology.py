import copy
import json
from pathlib import Path

import pytest

from bwfabric.cli import main as cli_main
from controller.topology import TopologyDescription, TopologyError
from mininet_topos import builders

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fattree_dict():
    return builders.fattree(4).to_dict()


def _problems(data):
    with pytest.raises(TopologyError) as exc:
        TopologyDescription.from_dict(data)
    return exc.value.problems


@pytest.mark.parametrize("kind", list(builders.BUILDERS))
def test_builtin_descriptions_round_trip_and_validate(kind, tmp_path):
    topo = builders.build(kind)
    path = tmp_path / "t.json"
    topo.save(path)
    again = TopologyDescription.load(path)
    assert again.to_dict() == topo.to_dict()


def test_sizes_of_the_papers_topologies():
    ft = builders.fattree(4)
    assert (len(ft.hosts), len(ft.switches)) == (16, 20)
    vl2 = builders.vl2(2, 4, 4)
    assert (len(vl2.hosts), len(vl2.switches)) == (80, 10)
    assert all(lk.capacity_mbps == 10 for lk in vl2.links if lk.a.startswith("h"))
    assert all(lk.capacity_mbps == 100 for lk in vl2.links if not lk.a.startswith("h"))
    tb = builders.lessor_testbed()
    assert (len(tb.hosts), len(tb.switches)) == (8, 4)
    bg = builders.bgwc_testbed()
    assert (len(bg.hosts), len(bg.switches)) == (8, 3)
    st = builders.star(5)
    assert (len(st.hosts), len(st.switches)) == (6, 1)
    assert builders.fattree(8).params["k"] == 8 and len(builders.fattree(8).hosts) == 128


def test_unknown_node_in_link_is_named(fattree_dict):
    fattree_dict["links"][3]["b"] = "nosuch"
    problems = _problems(fattree_dict)
    assert any(p.startswith("links[3]") and "unknown node 'nosuch'" in p for p in problems), problems


def test_duplicate_ip_is_named(fattree_dict):
    fattree_dict["hosts"][5]["ip"] = fattree_dict["hosts"][2]["ip"]
    problems = _problems(fattree_dict)
    assert any("hosts[5] (h6)" in p and "duplicate ip 10.0.0.3" in p and "h3" in p for p in problems), problems


def test_duplicate_port_is_named(fattree_dict):
    fattree_dict["links"][1]["b_port"] = fattree_dict["links"][0]["b_port"]  # both on e0_0
    problems = _problems(fattree_dict)
    assert any(p.startswith("links[1]") and "duplicate port e0_0:1" in p for p in problems), problems


@pytest.mark.parametrize("bad", [0, -10])
def test_non_positive_capacity_is_named(fattree_dict, bad):
    fattree_dict["links"][7]["capacity_mbps"] = bad
    problems = _problems(fattree_dict)
    assert any(p.startswith("links[7]") and "capacity_mbps" in p for p in problems), problems


def test_type_and_unknown_key_errors(fattree_dict):
    data = copy.deepcopy(fattree_dict)
    data["switches"][0]["colour"] = "red"
    data["hosts"][0]["ip"] = 12
    problems = _problems(data)
    assert any("switches[0] (c1): unknown key 'colour'" in p for p in problems)
    assert any("hosts[0] (h1): ip has the wrong type" in p for p in problems)


def test_duplicate_dpid_bad_role_bad_mac_and_unreachable_host(fattree_dict):
    data = copy.deepcopy(fattree_dict)
    data["switches"][1]["dpid"] = data["switches"][0]["dpid"]
    data["switches"][2]["role"] = "spine"
    data["hosts"][0]["mac"] = "zz"
    problems = _problems(data)
    assert any("duplicate dpid" in p for p in problems)
    assert any("role 'spine'" in p for p in problems)
    assert any("mac 'zz'" in p for p in problems)
    # a host whose only link goes to an island switch
    data = copy.deepcopy(fattree_dict)
    data["switches"].append({"name": "island", "dpid": 999, "role": "edge", "pod": None})
    data["hosts"].append({"name": "h99", "ip": "10.9.9.9", "mac": "02:00:00:00:99:99"})
    data["links"].append({"a": "h99", "a_port": 0, "b": "island", "b_port": 1, "capacity_mbps": 10.0,
                          "queue_bytes": None})
    assert any("h99" in p and "not reachable" in p for p in _problems(data))


def test_check_config_cli(tmp_path, fattree_dict, capsys):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(fattree_dict))
    assert cli_main(["check-config", str(good)]) == 0
    bad = copy.deepcopy(fattree_dict)
    bad["links"][0]["capacity_mbps"] = -1
    bad_path = tmp_path / "bad.json"
    bad_path.write_text(json.dumps(bad))
    assert cli_main(["check-config", str(bad_path)]) == 1
    err = capsys.readouterr().err
    assert "links[0] (h1:0 -- e0_0:1): capacity_mbps -1 must be a finite number" in err
    assert cli_main(["check-config", "--builtin"]) == 0
    assert capsys.readouterr().out.count("ok: built-in") == 5
    (tmp_path / "junk.json").write_text("{not json")
    assert cli_main(["check-config", str(tmp_path / "junk.json")]) == 1
    assert "not valid JSON" in capsys.readouterr().err


def test_builder_parameter_errors():
    with pytest.raises(ValueError, match="k=3"):
        builders.fattree(3)
    with pytest.raises(ValueError, match="vl2"):
        builders.vl2(3, 4, 4)
    with pytest.raises(ValueError, match="unknown topology"):
        builders.build("torus")


def test_a_live_emulations_switch_interfaces_block_a_second_start(tmp_path):
    from experiments.fabric import in_use
    for name in ("lo", "eth0", "sl-eth1", "sl-eth5", "sm-eth2", "s1-eth0", "sla-eth1"):
        (tmp_path / name).mkdir()
    assert in_use(["sl", "sm"], tmp_path) == ["sl-eth1", "sl-eth5", "sm-eth2"]
    assert in_use(["sr"], tmp_path) == []
    assert in_use(["sl"], tmp_path / "absent") == []


def test_vm_blocks_are_disjoint_outside_every_host_address_and_on_link():
    """Issue #32 §4: every host of the largest evaluation fabric gets a /28
    of its own, inside the hosts' 10.0.0.0/16 (on-link for every host),
    holding no host's address; the description validates and round-trips."""
    import ipaddress

    from controller.topology import TopologyDescription
    from mininet_topos import builders
    topo = builders.with_vm_blocks(builders.vl2(servers_per_tor=20))
    nets = [ipaddress.IPv4Network(h.vm_prefix) for h in topo.hosts]
    assert all(n.prefixlen == 28 and n.subnet_of(ipaddress.IPv4Network("10.0.0.0/16")) for n in nets)
    assert len({n for n in nets}) == len(nets)
    assert not any(ipaddress.IPv4Address(h.ip) in n for h in topo.hosts for n in nets)
    assert TopologyDescription.from_dict(topo.to_dict()) == topo
    assert builders.vm_address(topo, topo.hosts[3].name, 1) == str(nets[3].network_address + 1)
    with pytest.raises(ValueError):
        builders.vm_address(topo, topo.hosts[3].name, 16)


def test_the_topology_command_gives_every_host_a_vm_block_when_asked(tmp_path):
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "bwfabric.cli", "topology", "fattree", "--param", "k=4", "--param",
                          "vm_blocks=true", "--output", "-"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    hosts = json.loads(out.stdout)["hosts"]
    assert [h["vm_prefix"] for h in hosts[:2]] == ["10.0.100.0/28", "10.0.100.16/28"] and len(hosts) == 16
