"""Default BG routes on real switches (userspace OVS, the controller process):
the main job's guarantees that do not fit one uplink (two VMs of 4 Mb/s
behind a ToR whose 5 Mb/s uplinks take mu x 5 = 4.5 each) leave the ToR on
different uplinks from their first packet, before LESSOR has seen a flow;
WC of the same VMs still spreads over both; a destination below stays below."""

import json
import re
import subprocess
import time

import pytest
import yaml

from controller.network_view import NetworkView
from experiments import configs
from experiments.controller_proc import ControllerProcess
from experiments.fabric import Fabric
from mininet_topos import builders
from tests.unit.test_controller_process import _free_port

pytestmark = pytest.mark.root
VMS = {"analytics": ("h1", "h9"), "batch": ("h2", "h10")}


def _trace(switch: str, flow: str) -> str:
    out = subprocess.run(["ovs-appctl", "ofproto/trace", switch, flow], capture_output=True, text=True, check=True)
    return out.stdout


def _datapath_actions(trace: str) -> str:
    """The OpenFlow port the traced packet leaves by (ofproto/trace's ``output:N``; a group's chosen bucket
    included)."""
    outs = re.findall(r"\boutput:(\d+)", trace)
    assert len(outs) == 1, trace
    return outs[0]


def _bg_hits(switch: str, ip: str) -> int:
    """Packets through the BG up-path entry of ``ip`` at ``switch`` (-1: no such entry)."""
    dump = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", switch, "table=1"],
                          capture_output=True, text=True).stdout
    hits = re.findall(rf"n_packets=(\d+),.*priority=200,ip,nw_src={re.escape(ip)},nw_tos=0\b", dump)
    return int(hits[0]) if len(hits) == 1 else -1


def test_two_guarantees_leave_a_tor_on_different_uplinks_from_the_first_packet(tmp_path):
    topo = builders.fattree(4, link_mbps=10, fabric_mbps=5)
    topo.save(tmp_path / "topo.json")
    view = NetworkView(topo)
    state_file = tmp_path / "state.json"
    tenants = {t: {"vms": {f"{t[0]}{i}": {"host": h, "guarantee_mbps": 4.0} for i, h in enumerate(hosts)}}
               for t, hosts in VMS.items()}
    port = _free_port()
    conf = configs.write(tmp_path / "bwfabric.yaml", tmp_path / "topo.json", "lessor", port, prio_queues=True,
                         state_file=state_file, tenants=tenants, admission_mu=0.9,
                         lessor={"polling": {"initial_s": 30.0, "min_s": 30.0, "max_s": 60.0}})
    data = yaml.safe_load(conf.read_text())
    data.setdefault("agents", {})["unmanaged"] = sorted(h for hosts in VMS.values() for h in hosts)
    conf.write_text(yaml.safe_dump(data))
    tor, h1, h2, h9 = "e0_0", *(view.ip(h) for h in ("h1", "h2", "h9"))
    with Fabric(topo, of_port=port) as fab, ControllerProcess(conf, tmp_path / "ctl.log"):
        fab.wait_routes(90)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (state_file.exists() and
                                                   json.loads(state_file.read_text()).get("bg_routes", {}).get("up")):
            time.sleep(0.5)
        state = json.loads(state_file.read_text())
        in_port = view.port(tor, "h1")
        bg = {ip: _datapath_actions(_trace(tor, f"in_port={view.port(tor, h)},ip,nw_src={ip},nw_dst={h9},nw_tos=0"))
              for h, ip in (("h1", h1), ("h2", h2))}
        # WC (ToS 0x20) of h1: the destination route's ECMP group (the select group recirculates, where
        # ofproto/trace stops)
        wc = _trace(tor, f"in_port={in_port},tcp,nw_src={h1},nw_dst={h9},nw_tos=32,tp_src=40000,tp_dst=5001")
        below = _datapath_actions(_trace(tor, f"in_port={in_port},ip,nw_src={h1},nw_dst={view.ip('h2')},nw_tos=0"))
        # a real packet: h1's pings (ICMP is IP, ToS 0: BG) go through the BG entry of its ToR and aggregation
        out = fab.host("h1").cmd(f"ping -c 5 -i 0.2 -W 2 {h9}")
        # OVS folds datapath counts into its entries' statistics every second or so: until they show the pings
        deadline = time.monotonic() + 15
        while True:
            entries = {sw: _bg_hits(sw, h1) for sw in state["bg_routes"]["up"][h1][:2]}
            if min(entries.values()) >= 5 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    up = state["bg_routes"]["up"]
    print("up-paths:", up, "\nbound Mb/s:", state["bg_routes"]["load_mbps"], "\nBG actions:", bg, "\nWC:", wc)
    assert state["bg_routes"]["over"] == [] and set(up) == {view.ip(h) for hs in VMS.values() for h in hs}
    assert max(state["bg_routes"]["load_mbps"].values()) <= 0.9 * 5 + 1e-9
    # each VM's BG leaves the ToR by the port of its up-path's next switch, and they differ
    ports = {ip: str(view.port(tor, up[ip][1])) for ip in (h1, h2)}
    assert ports[h1] != ports[h2]
    assert bg == ports, (bg, ports)
    assert re.search(rf"^ 1\. ip,nw_dst={re.escape(h9)}, priority 100\b", wc, re.M) and "group:" in wc, wc
    assert below == str(view.port(tor, "h2")), below
    assert " 0% packet loss" in out, out
    assert min(entries.values()) >= 5, entries
