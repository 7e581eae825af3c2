"""Active/standby controllers on etcd under traffic (issue #34 section 5):
a real etcd, two controller processes (LESSOR) each bridge of a Mininet
FatTree k = 4 connects to, four long iperf3 flows.

1. A leads (MASTER on every bridge), B is a standby (SLAVE);
2. A is cut off from etcd (not from the switches): it steps down, B is
   MASTER everywhere within 3 s; healed, A stays a standby;
3. B is SIGKILLed: A is MASTER everywhere within 3 s;
4. a MASTER request with a generation older than the switches have seen
   (a stale leader's) is refused by the switch (OFPRRFC_STALE);
no long flow loses a second of traffic, and no route is deleted by a new
leader (``ovs-ofctl monitor watch:``)."""

from __future__ import annotations

import json
import re
import socket
import struct
import subprocess
import time

import pytest

from controller.ha import GENERATION_BASE
from controller.network_view import NetworkView
from experiments import configs
from experiments.controller_proc import ControllerProcess
from experiments.etcdproc import EtcdProcess
from experiments.fabric import Fabric
from mininet_topos import builders
from tests.integration.test_ha_election import Proxy
from tests.integration.test_switch_faults import PAIRS, Monitor, _iperf, _wait, iperf_results

pytestmark = pytest.mark.root
SECONDS = 40


def _roles(ports: dict[int, str]) -> dict[str, dict[str, str]]:
    """Per bridge: controller name (by its port) -> the role OVS gives it."""
    out = subprocess.run(["ovs-vsctl", "--format=json", "--", "--columns=_uuid,target,role,is_connected", "list",
                          "controller"], capture_output=True, text=True, check=True).stdout
    rows = json.loads(out)["data"]
    by_uuid = {}
    for uuid, target, role, connected in rows:
        port = int(target.rsplit(":", 1)[1])
        by_uuid[uuid[1]] = (ports.get(port, target), role if connected else "disconnected")
    bridges = json.loads(subprocess.run(["ovs-vsctl", "--format=json", "--", "--columns=name,controller", "list",
                                         "bridge"], capture_output=True, text=True, check=True).stdout)["data"]
    roles = {}
    for name, ctl in bridges:
        uuids = [u[1] for u in ctl[1]] if ctl[0] == "set" else [ctl[1]]
        roles[name] = dict(by_uuid[u] for u in uuids if u in by_uuid)
    return roles


def _all_master_at(log_file, after_wall: float) -> float | None:
    """The wall time a controller logged "MASTER on all N switches" after ``after_wall``."""
    import datetime
    for line in open(log_file).read().splitlines():
        if "MASTER on all" in line:
            t = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if t >= after_wall:
                return t
    return None


def _all(roles, switches, name, role):
    return all(roles.get(sw, {}).get(name) == role for sw in switches)


def _stale_master_request(bridge: str, port: int, generation: int) -> tuple[int, int] | None:
    """Connect to the bridge's passive OpenFlow listener, ask for MASTER with
    ``generation``; returns the error's (type, code), or None if granted."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        s.sendall(struct.pack("!BBHI", 4, 0, 8, 1))                                   # HELLO
        s.sendall(struct.pack("!BBHIIIQ", 4, 24, 24, 2, 2, 0, generation & (2**64 - 1)))  # ROLE_REQUEST MASTER
        deadline = time.monotonic() + 5
        buf = b""
        while time.monotonic() < deadline:
            buf += s.recv(65536)
            while len(buf) >= 8:
                version, mtype, length, xid = struct.unpack("!BBHI", buf[:8])
                msg, buf = buf[:length], buf[length:]
                if mtype == 1 and xid == 2:                                           # ERROR
                    return struct.unpack("!HH", msg[8:12])
                if mtype == 25 and xid == 2:                                          # ROLE_REPLY
                    return None
        raise AssertionError("no answer to the role request")
    finally:
        s.close()


def test_a_standby_takes_over_within_3_s_and_a_stale_leader_is_refused(tmp_path):
    topo = builders.fattree(4, link_mbps=10)
    topo.save(tmp_path / "topo.json")
    view = NetworkView(topo)
    switches = sorted(view.switches)
    port_a, port_b, passive = configs.free_port(), configs.free_port(), configs.free_port()
    names = {port_a: "a", port_b: "b"}
    with EtcdProcess(tmp_path / "etcd") as etcd:
        proxy = Proxy(etcd.client_port)               # a's way to etcd: cut to partition it
        conf = {}
        for name, port, url in (("a", port_a, f"http://127.0.0.1:{proxy.port}"), ("b", port_b, etcd.url)):
            conf[name] = configs.write(tmp_path / f"{name}.yaml", tmp_path / "topo.json", "lessor", port,
                                       lessor={"polling": {"min_s": 0.5}},
                                       ha={"etcd": url, "node": f"ctl-{name}", "ttl_s": 2, "poll_s": 0.1})
        ctl = {}
        figures = {}
        with Fabric(topo, of_port=port_a) as fab:
            try:
                for sw in switches:
                    subprocess.run(["ovs-vsctl", "set-controller", sw, f"tcp:127.0.0.1:{port_a}",
                                    f"tcp:127.0.0.1:{port_b}"], check=True)
                for uuid in subprocess.run(["ovs-vsctl", "--bare", "--columns=_uuid", "list", "controller"],
                                           capture_output=True, text=True, check=True).stdout.split():
                    subprocess.run(["ovs-vsctl", "set", "controller", uuid, "max_backoff=1000"], check=True)
                ctl["a"] = ControllerProcess(conf["a"], tmp_path / "a.log").start()
                _wait(lambda: "ctl-a is now the leader" in (tmp_path / "a.log").read_text(), 20)
                ctl["b"] = ControllerProcess(conf["b"], tmp_path / "b.log").start()
                fab.wait_routes(90)
                _wait(lambda: _all(_roles(names), switches, "a", "master") and
                      _all(_roles(names), switches, "b", "slave"), 30, step=0.2)
                first_generation = int(re.search(r"ctl-a is now the leader \(generation (\d+)\)",
                                                 (tmp_path / "a.log").read_text()).group(1))
                monitor = Monitor(switches)
                servers, clients = _iperf(fab, PAIRS, SECONDS)
                t_start = time.monotonic()
                time.sleep(6)

                # 2. a cut off from etcd (the switches still reach it)
                t_cut = time.time()
                proxy.partition()
                _wait(lambda: _all_master_at(tmp_path / "b.log", t_cut) is not None, 10, step=0.1)
                figures["partition_b_master_s"] = _all_master_at(tmp_path / "b.log", t_cut) - t_cut
                # OVS writes the roles to its database every few seconds: the final state, not the time
                _wait(lambda: _all(_roles(names), switches, "b", "master") and
                      _all(_roles(names), switches, "a", "slave"), 15, step=0.2)
                assert figures["partition_b_master_s"] < 3.0
                proxy.heal()
                time.sleep(3)
                roles = _roles(names)
                assert _all(roles, switches, "b", "master") and _all(roles, switches, "a", "slave"), roles
                assert "ctl-a is now the leader" not in (tmp_path / "a.log").read_text().split(
                    "ctl-a is now the standby")[-1]

                # 3. b, the leader now, SIGKILLed
                time.sleep(3)
                t_kill = time.time()
                ctl["b"].kill()
                _wait(lambda: _all_master_at(tmp_path / "a.log", t_kill) is not None, 10, step=0.1)
                figures["kill_a_master_s"] = _all_master_at(tmp_path / "a.log", t_kill) - t_kill
                _wait(lambda: _all(_roles(names), switches, "a", "master"), 15, step=0.2)
                time.sleep(2)
                figures["routes_deleted"] = [d for d in monitor.since(t_start)
                                             if re.search(r"cookie=0x2000000000000\b", d[1])]

                # 4. a stale leader's MASTER request: refused by the switch
                subprocess.run(["ovs-vsctl", "set-controller", "e0_0", f"tcp:127.0.0.1:{port_a}",
                                f"tcp:127.0.0.1:{port_b}", f"ptcp:{passive}:127.0.0.1"], check=True)
                time.sleep(0.5)
                figures["stale_reply"] = _stale_master_request("e0_0", passive, first_generation)

                results = iperf_results(PAIRS, clients, servers, SECONDS + 40)
                monitor.stop()
            finally:
                proxy.close()
                for c in ctl.values():
                    c.stop()
    print("figures:", figures)
    for flow, mbps in results.items():
        print(f"{flow}: per-second Mb/s {[round(x, 1) for x in mbps]}")
    assert figures["kill_a_master_s"] < 3.0
    assert figures["routes_deleted"] == []
    assert figures["stale_reply"] == (11, 0)            # OFPET_ROLE_REQUEST_FAILED, OFPRRFC_STALE
    assert first_generation > GENERATION_BASE
    for flow, mbps in results.items():
        assert len(mbps) >= SECONDS - 1 and min(mbps) > 0.5, (flow, mbps)
