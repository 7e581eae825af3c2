"""The flow-size workload generator on a real emulated star, over TCP and
MPTCP: every flow is logged with its size and completion time, and the
receivers count exactly the bytes sent."""

import random
import time

import pytest

from experiments import configs
from experiments.controller_proc import ControllerProcess
from experiments.fabric import Fabric
from experiments.flowgen import SLOT_S
from experiments.traffic import run_workload
from experiments.workloads import FlowSpec
from mininet_topos import builders

pytestmark = pytest.mark.root
OF_PORT = 6694


@pytest.fixture(scope="module")
def star(tmp_path_factory):
    work = tmp_path_factory.mktemp("star")
    topo = builders.star(3, link_mbps=20)
    topo.save(work / "topo.json")
    fab = Fabric(topo, of_port=OF_PORT).start()
    ctl = ControllerProcess(configs.write(work / "bwfabric.yaml", work / "topo.json", "single_path", OF_PORT),
                            work / "ctl.log").start()
    try:
        fab.wait_routes(60)
        yield fab, work
    finally:
        ctl.stop()
        fab.stop()


@pytest.mark.parametrize("mptcp", [False, True], ids=["tcp", "mptcp"])
def test_workload_flows_complete_and_bytes_add_up(star, mptcp):
    fab, work = star
    rng = random.Random(7)
    flows = [FlowSpec(f"h{1 + i % 3}", "r1", 0.2 * i, rng.choice([2_000, 50_000, 400_000]))
             for i in range(15)]
    res = run_workload(fab, flows, duration_s=6, workdir=work / ("mptcp" if mptcp else "tcp"),
                       drain_s=4, warmup_s=0, mptcp=mptcp)
    assert len(res.flows) == 15
    assert all(r["complete"] and r["fct"] > 0 for r in res.flows), res.flows
    assert sorted(r["size"] for r in res.flows) == sorted(f.size for f in flows)
    assert sum(res.rx_bytes_total_by_host.values()) == sum(f.size for f in flows)
    # arrivals end at 2.8 s on 20 Mb/s links: all payload lands in the window,
    # measured to the receiver's resolution (one slot at the link rate per edge)
    rx_bytes = res.aggregate_mbps * 1e6 / 8 * (res.window_s[1] - res.window_s[0])
    resolution = 2 * 20e6 / 8 * SLOT_S
    assert abs(rx_bytes - sum(f.size for f in flows)) <= resolution
    # a 400 KB flow alone at 20 Mb/s needs 0.16 s of line time: completion
    # times are real. The bound keeps a 10 % margin because the shaper's token
    # bucket lets a flow's first burst out faster than the rate, and the two
    # ends' clocks are read at different moments (measured 0.15998 once)
    assert max(r["fct"] for r in res.flows if r["size"] == 400_000) >= 0.9 * 0.16


def test_mptcp_sockets_are_mptcp(star):
    fab, _ = star
    server = fab.host("r1").popen(["python3", "-c",
        "import socket,time\ns=socket.socket(socket.AF_INET,socket.SOCK_STREAM,262)\n"
        "s.settimeout(10);s.bind(('0.0.0.0',7100));s.listen(1);c,_=s.accept();time.sleep(3)"])
    time.sleep(0.5)  # listening before the client connects
    client = fab.host("h1").popen(["python3", "-c",
        "import socket,time\ns=socket.socket(socket.AF_INET,socket.SOCK_STREAM,262)\n"
        "s.connect(('10.0.0.4',7100));time.sleep(3)"])
    time.sleep(1.0)
    out = fab.host("h1").cmd("ss -tniM state established")
    client.wait(10)
    server.wait(10)
    assert "10.0.0.4:7100" in out and "mptcp" in out.lower(), out
