"""BG/WC queues on a real switch (userspace OVS, tc back-end): two senders
saturate one 10 Mb/s egress port toward r1, one marked BG (ToS 0x00), one
WC (ToS 0x20) -- then WC disguised as EF (ToS 0xb8), which table 0 rewrites
to WC. BG must keep almost the whole port; the figures show how strict
HTB's approximation of priority is."""

import json
import subprocess

import pytest

from experiments import configs
from experiments.controller_proc import ControllerProcess
from experiments.fabric import Fabric
from mininet_topos import builders

pytestmark = pytest.mark.root
OF_PORT = 6697


def _pair_goodput(fab, tos_wc: int, secs: int = 8) -> dict:
    rip = fab.topo.host("r1").ip
    servers = [fab.host("r1").popen(["iperf3", "-s", "-1", "-p", str(p)]) for p in (5301, 5302)]
    import time
    time.sleep(1)
    clients = [fab.host("h1").popen(["iperf3", "-c", rip, "-p", "5301", "-t", str(secs), "-O", "2", "-S", "0",
                                     "-J"], stdout=subprocess.PIPE),
               fab.host("h2").popen(["iperf3", "-c", rip, "-p", "5302", "-t", str(secs), "-O", "2", "-S",
                                     str(tos_wc), "-J"], stdout=subprocess.PIPE)]
    out = [json.loads(c.communicate(timeout=secs + 30)[0]) for c in clients]
    for s in servers:
        s.wait(10)
    return {"bg": out[0]["end"]["sum_received"]["bits_per_second"] / 1e6,
            "wc": out[1]["end"]["sum_received"]["bits_per_second"] / 1e6}


def test_bg_keeps_the_port_and_wc_gets_the_rest(tmp_path):
    topo = builders.star(2, link_mbps=10)
    topo.save(tmp_path / "topo.json")
    with Fabric(topo, of_port=OF_PORT, queues="tc") as fab, \
            ControllerProcess(configs.write(tmp_path / "bwfabric.yaml", tmp_path / "topo.json", "ecmp", OF_PORT,
                                            prio_queues=True), tmp_path / "ctl.log"):
        fab.wait_routes(60)
        marked = _pair_goodput(fab, 0x20)
        disguised = _pair_goodput(fab, 0xB8)
        port = next(i for i in fab.net.get("s1").intfList() if fab.net.get("s1").ports[i] == 3)
        classes = subprocess.run(["tc", "-s", "class", "show", "dev", port.name], capture_output=True,
                                 text=True).stdout
    print(f"BG {marked['bg']:.2f} / WC {marked['wc']:.2f} Mb/s; WC as EF: BG {disguised['bg']:.2f} / "
          f"WC {disguised['wc']:.2f} Mb/s\n{classes}")
    for r in (marked, disguised):
        assert r["bg"] + r["wc"] > 9.0                       # the port stays busy
        assert r["bg"] > 0.85 * 10                           # BG keeps (almost) the whole port
        assert r["wc"] > 0.0                                 # WC not starved to zero either
    assert "class htb 1:20" in classes
