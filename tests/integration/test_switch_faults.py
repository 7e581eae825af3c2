"""Faults under traffic on a real Mininet FatTree k = 4 (userspace OVS,
fail-secure bridges), LESSOR's controller (issue #34 section 4):

1. one ToR's connection lost and back (its controller target pointed
   elsewhere and back): the switch forwards on what it holds meanwhile, is
   read back and reconciled, its tables the same before and after, not one
   entry deleted, no second without traffic;
2. the controller SIGKILLed and started again: traffic goes on through the
   installed entries meanwhile; the new process reads every switch back and
   deletes none of the routes (only LESSOR's exact entries, which no flow of
   the new process owns: those flows fall back to the routes in place);
3. an aggregation switch's controller deleted and set again (``ovs-vsctl
   del-controller`` / ``set-controller``; OVS flushes the bridge's tables at
   both, as a bridge restart does): everything it had is back in < 2 s of
   its reconnection.

Long iperf3 flows run through all of it; none is lost. ``ovs-ofctl monitor
watch:`` on every bridge records each entry the switches delete: the
mechanism the test asserts (a wipe-and-reinstall would show every route
DELETED and ADDED again)."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time

import pytest

from controller.network_view import NetworkView
from experiments import configs
from experiments.controller_proc import ControllerProcess
from experiments.fabric import Fabric
from mininet_topos import builders

pytestmark = pytest.mark.root
PAIRS = [("h1", "h16"), ("h2", "h15"), ("h5", "h12"), ("h6", "h11")]
SECONDS = 44
ROUTING_COOKIE = "0x2"        # pipeline.APP_ROUTING << 48, as ovs-ofctl prints it (0x2000000000000)


def _ofctl(*args) -> str:
    return subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", *args], capture_output=True, text=True, check=True).stdout


def _table(sw: str) -> set[str]:
    """A bridge's entries and groups without their counters and ages, learned
    per-flow counters (table 3, cookie 0x5...) left out: they come and go
    with the traffic."""
    groups = {}
    for g in _ofctl("dump-groups", sw).splitlines()[1:]:
        gid, rest = re.match(r"\s*group_id=(\d+),(.*)", g).groups()
        groups[gid] = rest.strip()         # a group by what it does: its id is the switch's
    entries = set()
    for line in _ofctl("dump-flows", sw).splitlines()[1:]:
        line = re.sub(r"(duration|n_packets|n_bytes|idle_age|hard_age)=[^,]*, ?", "", line.strip())
        line = re.sub(r"group:(\d+)", lambda m: f"group:[{groups.get(m.group(1), 'missing')}]", line)
        if not line.startswith("cookie=0x5"):
            entries.add(line)
    return entries | {"group " + g for g in groups.values()}


class Monitor:
    """``ovs-ofctl monitor SW watch:`` per bridge: the DELETED events, by cookie."""

    def __init__(self, switches):
        self.procs = {sw: subprocess.Popen(["ovs-ofctl", "-O", "OpenFlow13", "monitor", sw, "watch:"],
                                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                      for sw in switches}
        self.deleted: list[tuple[float, str, str]] = []      # (time, switch, the event's line)
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._read, args=(sw, p), daemon=True)
                        for sw, p in self.procs.items()]
        for t in self.threads:
            t.start()

    def _read(self, sw, proc):
        for line in proc.stdout:
            if "event=DELETED" in line:
                with self.lock:
                    self.deleted.append((time.monotonic(), sw, line.strip()))

    def since(self, t0: float, cookie_prefix: str | None = None) -> list[tuple[str, str]]:
        with self.lock:
            return [(sw, line) for t, sw, line in self.deleted if t >= t0 and (
                cookie_prefix is None or re.search(rf"cookie={cookie_prefix}0{{12}}\b", line))]

    def stop(self):
        for p in self.procs.values():
            p.terminate()
        for p in self.procs.values():
            p.wait(5)


def _reconciled(log_file, switch: str | None = None) -> int:
    text = open(log_file).read()
    pattern = rf"switch {switch} reconciled" if switch else r"switch \S+ reconciled"
    return len(re.findall(pattern, text))


def _wait(cond, timeout_s: float, step: float = 0.02) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout_s, f"not within {timeout_s} s"
        time.sleep(step)
    return time.monotonic() - t0


def _iperf(fab, pairs, seconds):
    servers, clients = [], []
    for i, (_, dst) in enumerate(pairs):
        servers.append(fab.endpoint(dst).popen(["iperf3", "-s", "-1", "-p", str(5301 + i)]))
    time.sleep(1.0)
    for i, (src, dst) in enumerate(pairs):
        clients.append(fab.endpoint(src).popen(["timeout", str(seconds + 30), "iperf3", "-c", fab.ip(dst), "-p",
                                                str(5301 + i), "-t", str(seconds), "-i", "1", "-J"],
                                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return servers, clients


def iperf_results(pairs, clients, servers, timeout_s: float) -> dict[str, list[float]]:
    """Each client's per-second Mb/s (iperf3 -J); every flow must have ended without an error."""
    results = {}
    for (src, dst), proc in zip(pairs, clients):
        out, _ = proc.communicate(timeout=timeout_s)
        data = json.loads(out)
        assert "error" not in data, (src, dst, data.get("error"))
        results[f"{src}->{dst}"] = [iv["sum"]["bits_per_second"] / 1e6 for iv in data["intervals"]]
    for s in servers:
        s.wait(10)
    return results


def _lessor_fabric(tmp_path):
    """A FatTree k = 4 at 10 Mb/s and a LESSOR controller's configuration on a free port."""
    topo = builders.fattree(4, link_mbps=10)
    topo.save(tmp_path / "topo.json")
    of_port = configs.free_port()
    conf = configs.write(tmp_path / "bwfabric.yaml", tmp_path / "topo.json", "lessor", of_port,
                         state_file=tmp_path / "state.json", lessor={"polling": {"min_s": 0.5}})
    return topo, NetworkView(topo), of_port, conf


def test_switch_reconnect_controller_kill_and_bridge_restart_lose_no_long_flow(tmp_path):
    topo, view, of_port, conf = _lessor_fabric(tmp_path)
    log1, log2 = tmp_path / "ctl1.log", tmp_path / "ctl2.log"
    switches = sorted(view.switches)
    figures = {}
    with Fabric(topo, of_port=of_port) as fab:
        ctl = ControllerProcess(conf, log1).start()
        ctl2 = None
        try:
            fab.wait_routes(90)
            _wait(lambda: _reconciled(log1) >= len(switches), 30)
            for sw in switches:       # reconnect at once when the controller comes back (OVS backs off to 8 s)
                subprocess.run(["ovs-vsctl", "set", "controller", sw, "max_backoff=1000"], check=True)
            monitor = Monitor(switches)
            time.sleep(1.0)
            servers, clients = _iperf(fab, PAIRS, SECONDS)
            t_start = time.monotonic()
            time.sleep(8)            # LESSOR has found and placed the long flows

            # 1. a ToR's connection lost and back: its controller target pointed at a port nobody
            # listens on and back (a controller stays configured, so OVS keeps its tables)
            tor = view.host_switch("h1")[0]
            before = _table(tor)
            n = _reconciled(log1, tor)
            t1 = time.monotonic()
            subprocess.run(["ovs-vsctl", "set-controller", tor, f"tcp:127.0.0.1:{configs.free_port()}"], check=True)
            time.sleep(1.5)
            assert _table(tor) == before                      # fail-secure: it forwards on what it holds
            t1b = time.monotonic()
            subprocess.run(["ovs-vsctl", "set-controller", tor, f"tcp:127.0.0.1:{of_port}"], check=True)
            _wait(lambda: _reconciled(log1, tor) > n, 10)
            figures["reconnect_reconciled_s"] = time.monotonic() - t1b
            time.sleep(0.5)
            figures["reconnect_deleted"] = monitor.since(t1)
            assert figures["reconnect_deleted"] == []
            assert _table(tor) == before

            # 2. the controller SIGKILLed under traffic, started again 4 s later
            time.sleep(3)
            before_kill = {sw: _table(sw) for sw in switches}
            t2 = time.monotonic()
            ctl.kill()
            time.sleep(4.0)
            assert {sw: _table(sw) for sw in switches} == before_kill        # fail-secure: nothing changed
            ctl2 = ControllerProcess(conf, log2).start()
            t2b = time.monotonic()
            figures["restart_all_reconciled_s"] = _wait(lambda: _reconciled(log2) >= len(switches), 20)
            time.sleep(1.0)
            gone = monitor.since(t2)
            figures["restart_deleted_routes"] = [d for d in gone if re.search(r"cookie=0x2000000000000\b", d[1])]
            figures["restart_deleted_lessor"] = len([d for d in gone if "cookie=0x4000000000000" in d[1]])
            assert figures["restart_deleted_routes"] == []
            assert all(re.search(r"cookie=0x[45]000000000000\b", line) for _, line in gone), gone[:5]
            del t2b

            # 3. an aggregation switch's controller deleted and set again (ovs-vsctl del-controller /
            # set-controller): OVS flushes a bridge's tables when its last controller goes and when
            # one comes back (a bridge restart does the same)
            time.sleep(3)
            agg = "a0_0"
            want = {line for line in _table(agg) if "cookie=0x4" not in line}
            t3 = time.monotonic()
            subprocess.run(["ovs-vsctl", "del-controller", agg], check=True)
            time.sleep(0.5)
            figures["del_controller_left_entries"] = len(_table(agg))
            t3b = time.monotonic()
            subprocess.run(["ovs-vsctl", "set-controller", agg, f"tcp:127.0.0.1:{of_port}"], check=True)
            subprocess.run(["ovs-vsctl", "set", "controller", agg, "max_backoff=1000"], check=True)
            _wait(lambda: {line for line in _table(agg) if "cookie=0x4" not in line} == want, 10, step=0.05)
            figures["bridge_restart_restored_s"] = time.monotonic() - t3b
            assert figures["bridge_restart_restored_s"] < 2.0
            t_end = time.monotonic()

            results = iperf_results(PAIRS, clients, servers, SECONDS + 40)
        finally:
            if "monitor" in locals():
                monitor.stop()
            ctl.stop()
            if ctl2 is not None:
                ctl2.stop()
    faults = {"reconnect": t1 - t_start, "kill": t2 - t_start, "bridge restart": t3 - t_start}
    print("faults at (s into the flows):", {k: round(v, 1) for k, v in faults.items()}, "end", round(t_end - t_start))
    print("figures:", {k: (round(v, 3) if isinstance(v, float) else v) for k, v in figures.items()})
    for flow, mbps in results.items():
        print(f"{flow}: per-second Mb/s {[round(x, 1) for x in mbps]}")
    # no long flow lost: every one ran to its end and carried data in every second but those
    # right after the aggregation switch lost its tables (TCP's back-off after the outage)
    for flow, mbps in results.items():
        assert len(mbps) >= SECONDS - 1, flow
        outside = [x for i, x in enumerate(mbps) if not (faults["bridge restart"] - 1 <= i <= faults["bridge restart"] + 4)]
        assert min(outside) > 0.5, (flow, mbps)
        assert sum(mbps[-5:]) > 0, (flow, mbps)


def _set_link(ipr, indices, up: bool) -> None:
    for idx in indices:
        ipr.link("set", index=idx, state="up" if up else "down")


def test_a_link_flap_storm_leaves_routes_converged_and_no_blackhole(tmp_path):
    """10 flaps a second for 10 s on one aggregation-core link, long flows
    across the fabric: the flapping port is held down (the aggregation
    switch stops routing into it mid-storm), the controller keeps up (its
    CPU and recomputations printed), and after the last flap every switch
    holds the routes it held before the storm again (how long that took is
    printed -- 2.3-2.4 s on an idle machine, the 2 s hold included; the
    bound is 15 s: under a loaded machine the controller lags, which is no
    failure of the mechanism); every host reaches every other; the flows ran to their end."""
    from pyroute2 import IPRoute

    topo, view, of_port, conf = _lessor_fabric(tmp_path)
    switches = sorted(view.switches)
    a, b = "a0_0", "c1"
    intfs = [f"{a}-eth{view.port(a, b)}", f"{b}-eth{view.port(b, a)}"]
    with Fabric(topo, of_port=of_port) as fab, ControllerProcess(conf, tmp_path / "ctl.log", cpu_interval=0.5) as ctl:
        fab.wait_routes(90)
        _wait(lambda: _reconciled(tmp_path / "ctl.log") >= len(switches), 30)
        time.sleep(2)
        routes = {sw: {line for line in _table(sw) if "cookie=0x4" not in line} for sw in switches}
        servers, clients = _iperf(fab, PAIRS, 24)
        time.sleep(5)
        with IPRoute() as ipr:
            indices = [ipr.link_lookup(ifname=name)[0] for name in intfs]
            t0 = ctl.elapsed()
            flaps = 0
            start = time.monotonic()
            mid = []              # a0_0's routes mid-storm: do they still send into the flapping port?
            for k in range(100):           # on a fixed schedule: 10 flaps a second for 10 s
                time.sleep(max(0.0, start + 0.1 * k - time.monotonic()))
                _set_link(ipr, indices, False)
                time.sleep(max(0.0, start + 0.1 * k + 0.05 - time.monotonic()))
                _set_link(ipr, indices, True)
                flaps += 1
                if flaps % 10 == 5:
                    mid.append(sum(f"output:{view.port(a, b)}" in line for line in _table(a)))
            storm_s = time.monotonic() - start
            t1 = ctl.elapsed()
        try:
            settle = _wait(lambda: all({line for line in _table(sw) if "cookie=0x4" not in line} == routes[sw]
                                       for sw in switches), 15.0, step=0.1)
        except AssertionError:
            for sw in switches:
                now = {line for line in _table(sw) if "cookie=0x4" not in line}
                if now != routes[sw]:
                    print(sw, "lost", sorted(routes[sw] - now)[:4], "gained", sorted(now - routes[sw])[:4])
            print(subprocess.run(["ip", "-br", "link", "show", "dev", intfs[0]], capture_output=True, text=True).stdout)
            raise
        cpu = ctl.cpu_between(t0, t1)
        results = iperf_results(PAIRS, clients, servers, 60)
        unreachable = fab.ping_all()
        alive = ctl.alive()
        log = (tmp_path / "ctl.log").read_text()
        updates = sum(int(n) for n in re.findall(r": updating (\d+) switches", log))
        acted_up = len(re.findall(rf"ports [^\n]*\b{a}:{view.port(a, b)} up\b", log))    # one line per recomputation
    print(f"{flaps} flaps in {storm_s:.1f} s on {a}-{b}; controller CPU over the storm {cpu:.0f} % of a core; "
          f"{a}'s entries and groups using the port mid-storm {mid}; every switch's routes as before "
          f"{settle:.2f} s after the last flap; switch updates sent {updates}; recomputations acting on "
          f"{a}'s port up {acted_up}")
    for flow, mbps in results.items():
        print(f"{flow}: per-second Mb/s {[round(x, 1) for x in mbps]}")
    assert flaps == 100 and storm_s < 11 and alive
    # the flapping port was held down (controller.linkdamp): of its ~95 "up" reports, only those
    # before the damping's threshold and the release after the storm were acted on
    assert acted_up <= 4, acted_up
    assert unreachable == []
    for flow, mbps in results.items():
        assert len(mbps) >= 23 and sum(mbps[-4:]) > 0, (flow, mbps)
