"""Several VMs behind one agent (issue #32 §4): each VM in a network
namespace of its own, shaped, marked and tuned there by one agent, each put
in force, removed and remembered on its own. Real tc, sysctls, nftables,
MPTCP endpoints and BPF hash maps (a bpffs of the test's own)."""

import secrets
import subprocess
import uuid

import pytest

from benchmarks.agent_faults import drop_bpf_maps, make_bpf_maps
from hostagent import netns
from hostagent.agent import Agent
from hostagent.executor import Executor

pytestmark = pytest.mark.root
VMS = {"t/a": ("10.9.0.1", 10), "u/b": ("10.9.0.2", 20)}


def ns_run(ns: str, *cmd: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True, check=True).stdout


SERVER = {}


@pytest.fixture
def two_vms(tmp_path):
    """Two namespaces, each a VM with ag0 (its address) and ag1 up; a server
    namespace (where the agent works) with its NIC srv0; and a bpffs."""
    tag = uuid.uuid4().hex[:6]
    names = {vm: f"bwft-{tag}-{i}" for i, vm in enumerate(VMS)}
    server = SERVER["ns"] = f"bwft-{tag}-srv"
    bpf = tmp_path / "bpffs"
    make_bpf_maps(bpf)
    try:
        subprocess.run(["ip", "netns", "add", server], check=True)
        subprocess.run(["ip", "-n", server, "link", "add", "srv0", "type", "veth", "peer", "name", "srv1"],
                       check=True)
        for dev in ("srv0", "srv1"):
            subprocess.run(["ip", "-n", server, "link", "set", dev, "up"], check=True)
        for vm, ns in names.items():
            subprocess.run(["ip", "netns", "add", ns], check=True)
            subprocess.run(["ip", "-n", ns, "link", "add", "ag0", "type", "veth", "peer", "name", "ag1"], check=True)
            subprocess.run(["ip", "-n", ns, "addr", "add", f"{VMS[vm][0]}/24", "dev", "ag0"], check=True)
            for dev in ("ag0", "ag1"):
                subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=True)
        yield names, bpf
    finally:
        for ns in [*names.values(), server]:
            subprocess.run(["ip", "netns", "del", ns], check=False)
        drop_bpf_maps(bpf)


def config(names: dict, which=VMS) -> dict:
    return {"vms": {vm: {"host": "srv", "vm_id": vm, "netns": names[vm], "nic": "srv0", "interface": "ag0",
                         "address": VMS[vm][0],
                         "nic_mbps": 100, "guarantee_mbps": VMS[vm][1], "wc_subflows": 1, "demote_bg": False}
                    for vm in which}}


def agent(tmp_path, bpf) -> Agent:
    return Agent("srv", secrets.token_bytes(32), tmp_path / "state",
                 executor=Executor(state_file=tmp_path / "state" / "executor.json", bpf_pin_dir=bpf))


def push(a: Agent, version: int, cfg) -> dict:
    """A config message, handled where the agent runs: the server's namespace."""
    with netns.entered(SERVER["ns"]), a.lock:
        return a._dispatch("config", {"generation": 1, "version": version, "config": cfg})


def on_server(fn):
    with netns.entered(SERVER["ns"]):
        return fn()


def test_each_vm_is_configured_in_its_own_namespace_and_removed_alone(two_vms, tmp_path):
    names, bpf = two_vms
    here = netns.current_inode()
    a = agent(tmp_path, bpf)
    reply = push(a, 1, config(names))
    assert reply["ok"], reply
    st = on_server(a.status)
    assert st["in_force"] and set(st["vms"]) == set(VMS) and all(v["in_force"] for v in st["vms"].values()), st
    assert netns.current_inode() == here                       # the agent's thread came back
    # each VM's kernel objects are in its namespace: its HTB, its MPTCP endpoint, its nftables table
    for vm, ns in names.items():
        qdisc = ns_run(ns, "tc", "qdisc", "show", "dev", "ag0")
        assert "htb" in qdisc, (vm, qdisc)
        assert VMS[vm][0] in ns_run(ns, "ip", "mptcp", "endpoint", "show"), vm
        assert ns_run(ns, "nft", "list", "tables").strip(), vm
    rates = {vm: st["vms"][vm]["config"]["vm"]["guarantee_mbps"] for vm in VMS}
    nic = ns_run(SERVER["ns"], "tc", "class", "show", "dev", "srv0")       # the NIC both share: BG before WC
    assert "1:10" in nic and "1:20" in nic and "prio 1" in nic, nic
    assert rates == {vm: g for vm, (_, g) in VMS.items()}
    # the second VM goes: its namespace is clean, the first's untouched and still in force
    before_a = ns_run(names["t/a"], "tc", "class", "show", "dev", "ag0")
    reply = push(a, 2, config(names, ["t/a"]))
    assert reply["ok"], reply
    assert "htb" not in ns_run(names["u/b"], "tc", "qdisc", "show", "dev", "ag0")
    assert not ns_run(names["u/b"], "ip", "mptcp", "endpoint", "show").strip()
    assert ns_run(names["t/a"], "tc", "class", "show", "dev", "ag0") == before_a
    assert set(a.vms) == {"t/a"} and on_server(a.status)["in_force"]
    assert not (tmp_path / "state" / "vms" / "u~b").exists()
    # a restarted agent remembers the VM an earlier run configured; a configuration without it removes it
    again = agent(tmp_path, bpf)
    assert set(again.vms) == {"t/a"} and again.vm("t/a").config is None
    reply = push(again, 3, None)
    assert reply["ok"], reply
    assert "htb" not in ns_run(names["t/a"], "tc", "qdisc", "show", "dev", "ag0")
    assert not again.vms and on_server(again.status)["in_force"]
    assert "htb" not in ns_run(SERVER["ns"], "tc", "qdisc", "show", "dev", "srv0")     # the NIC's classes too


def test_shutdown_removes_every_vms_state(two_vms, tmp_path):
    names, bpf = two_vms
    a = agent(tmp_path, bpf)
    assert push(a, 1, config(names))["ok"]
    on_server(a.shutdown)
    assert "htb" not in ns_run(SERVER["ns"], "tc", "qdisc", "show", "dev", "srv0")
    for ns in names.values():
        assert "htb" not in ns_run(ns, "tc", "qdisc", "show", "dev", "ag0")
        assert not ns_run(ns, "ip", "mptcp", "endpoint", "show").strip()
        assert not ns_run(ns, "nft", "list", "tables").strip()


def test_a_vm_whose_namespace_is_missing_is_refused_by_name_and_the_other_is_put_in_force(two_vms, tmp_path):
    from hostagent.executor import ExecError
    names, bpf = two_vms
    a = agent(tmp_path, bpf)
    cfg = config(names)
    cfg["vms"]["u/b"]["netns"] = "bwft-nosuchns"
    with pytest.raises(ExecError, match=r"VM u/b: network namespace 'bwft-nosuchns' does not exist"):
        push(a, 1, cfg)
    assert a.vm("t/a").config is not None and on_server(a.status)["vms"]["t/a"]["in_force"]
    assert a.generation is None                  # not all of it is in force: the controller pushes it again
    on_server(a.shutdown)


def test_the_many_vms_benchmark_moves_every_pairs_limit_on_the_fast_path():
    """benchmarks/agent_vms at a small size: every VM in force after the
    full apply and after the rounds (it asserts both), every VM's limits
    moved on the fast path at least once and never through a repair or a
    whole plan, and everything it made is gone afterwards."""
    from benchmarks import agent_vms
    before = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    r = agent_vms.run(3, 4, 2, out=lambda s: None)
    assert r["rounds_did"].get("rates", 0) >= 3 and set(r["rounds_did"]) <= {"rates", "idle"}, r
    assert r["repairs"] == 0
    assert r["per_round"]["buckets"] == 4 and r["lrc_rates_round_ms"]["max"] > 0
    after = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    assert not {n for n in after - before if n.startswith("bwfb")}
