"""The real controller process and its API listener under racing, slow and
hostile clients (issue #31): many threads changing one tenant while SIGHUP
reloads storm lose or resurrect nothing; partial requests and huge chunked
bodies neither hold threads nor memory; ports that cannot be bound make
the process exit naming them. Integration tests: each starts the real
controller process (the racing-writers storm alone runs 30 s), which is
not what the unit suite's quick loop is for."""

import http.client
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest
import yaml

from bwfabric.client import ApiClient
from controller import config
from mininet_topos import builders
from tests.unit.test_controller_process import ROOT, _free_port, _until

TOKEN = "0123456789abcdef0123456789abcdef"


def _private(path, text):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, text.encode())
    os.close(fd)


def _fabric_config(tmp_path, k=8, **api):
    """A k-ary fat tree with one tenant and no agents (hosts unmanaged), so
    the process under test is the controller and its API alone."""
    topo = builders.fattree(k=k, link_mbps=10)
    topo.save(tmp_path / "fabric.json")
    data = {"fabric": {"topology": "fabric.json"},
            "controller": {"routing": "ecmp", "prio_queues": True,
                           "openflow": {"listen": "127.0.0.1", "port": _free_port()}},
            "agents": {"unmanaged": [h.name for h in topo.hosts]},
            "tenants": {"storm": {"vms": {"base": {"host": topo.hosts[-1].name, "guarantee_mbps": 0.5}}}},
            "api": {"listen": f"127.0.0.1:{_free_port()}", "token_file": "api.token", "state_file": "state.yaml",
                    **api}}
    conf = tmp_path / "bwfabric.yaml"
    conf.write_text(yaml.safe_dump(data))
    _private(tmp_path / "api.token", TOKEN)
    return conf, data, topo


def _start(conf):
    """The controller with its log in a file: a pipe nobody drains until the
    end fills (64 KiB) and then blocks every thread that logs."""
    log = open(conf.parent / "controller.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "bwfabric.cli", "controller", "--config", str(conf)],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)
    proc.log_path = conf.parent / "controller.log"
    log.close()
    return proc


def _stop(proc):
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return proc.log_path.read_text()


def test_racing_writers_and_a_reload_storm_lose_and_resurrect_nothing(tmp_path):
    """52 threads, each owning one VM of one tenant, PUT and DELETE it at
    random for 30 s while the process is sent SIGHUP every 100 ms. Each VM
    must end as its owner's last accepted change left it -- in the API, in
    the state file, and in the configuration a fresh controller loads."""
    conf, _, topo = _fabric_config(tmp_path)
    proc = _start(conf)
    api = ApiClient.from_config(conf)
    threads_n, seconds = 52, 30.0
    try:
        _until(lambda: api.get("/v1/status"))
        hosts = [h.name for h in topo.hosts[:threads_n]]
        last: dict[str, object] = {}         # vm -> its last accepted state (None: deleted)
        counts = {"accepted": 0, "refused": 0}
        errors: list[str] = []
        lock = threading.Lock()
        stop = time.monotonic() + seconds

        def writer(i):
            rng = random.Random(i)
            vm, client = f"v{i}", ApiClient(api.base_url, TOKEN, timeout_s=120)
            while time.monotonic() < stop:
                if rng.random() < 0.3:
                    code, reply = client.request("DELETE", f"/v1/tenants/storm/vms/{vm}")
                    state = None
                else:
                    g = rng.choice((0.25, 0.5, 0.75, 1.0))
                    code, reply = client.request("PUT", f"/v1/tenants/storm/vms/{vm}",
                                                 {"host": hosts[i], "guarantee_mbps": g})
                    state = g
                with lock:
                    if code == 200:
                        last[vm] = state
                        counts["accepted"] += 1
                    elif code == 404 and state is None:
                        last[vm] = None                    # deleting what is not there: it is absent
                    else:
                        counts["refused"] += 1
                        errors.append(f"{vm}: {code} {reply}")

        def reloader():
            n = 0
            while time.monotonic() < stop:
                proc.send_signal(signal.SIGHUP)
                n += 1
                time.sleep(0.1)
            counts["reloads"] = n
        threads = [threading.Thread(target=writer, args=(i,)) for i in range(threads_n)]
        threads.append(threading.Thread(target=reloader))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        time.sleep(0.5)                                    # the last SIGHUP's reload
        assert not errors, errors[:5]
        assert counts["accepted"] >= threads_n and counts["reloads"] >= 100, counts   # it ran (not a figure)
        want = {vm: g for vm, g in last.items() if g is not None}
        via_api = {n: v["guarantee_mbps"] for n, v in api.get("/v1/tenants/storm")["vms"].items() if n != "base"}
        state = yaml.safe_load((tmp_path / "state.yaml").read_text())["tenants"]["storm"]["vms"]
        in_file = {n: v["guarantee_mbps"] for n, v in state.items() if n != "base"}
        fresh = config.load(conf)
        restarted = {n: v.guarantee_mbps for n, v in fresh.cfg.tenants["storm"].vms.items() if n != "base"}
        assert via_api == want, sorted(set(via_api.items()) ^ set(want.items()))
        assert in_file == want and restarted == want
        assert fresh.digest == api.get("/v1/status")["digest"]
        print(f"\n{threads_n} writers, {seconds:g} s: {counts['accepted']} changes accepted, "
              f"{counts['reloads']} SIGHUPs, {len(want)} VMs in force; API = state file = fresh start")
    finally:
        out = _stop(proc)
    assert "Traceback" not in out, out[-3000:]


def _rss_mb(pid):
    return psutil.Process(pid).memory_info().rss / 1e6


def test_slow_and_partial_requests_neither_hold_the_api_nor_its_memory(tmp_path):
    """3000 connections that send half a request and wait: a legitimate
    client is still served within 1 s; a 150 MB chunked body is cut off
    at the 64 KiB limit as it arrives (413); the process's memory stays
    bounded (before #31: +140 MB for the body, and the API unavailable for
    30 s once partial requests held every thread)."""
    conf, data, _ = _fabric_config(tmp_path, k=4)
    host, port = data["api"]["listen"].rsplit(":", 1)
    port = int(port)
    proc = _start(conf)
    api = ApiClient.from_config(conf)
    held = []
    try:
        _until(lambda: api.get("/v1/status"))
        base = _rss_mb(proc.pid)
        for i in range(3000):
            s = socket.create_connection((host, port), timeout=5)
            s.sendall(b"PUT /v1/tenants/storm HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n")
            held.append(s)
        # the server has taken them all in (each is a connection of its own, none a thread)
        _until(lambda: len(psutil.Process(proc.pid).net_connections("tcp")) >= 3000, timeout=60)
        t0 = time.monotonic()
        assert api.get("/v1/status")["version"] == 1
        served_s = time.monotonic() - t0
        assert served_s < 1.0, served_s
        # a chunked body far over the limit: refused while it is still being sent
        conn = http.client.HTTPConnection(host, port, timeout=10)
        conn.putrequest("PUT", "/v1/tenants/storm")
        conn.putheader("Authorization", f"Bearer {TOKEN}")
        conn.putheader("Transfer-Encoding", "chunked")
        conn.endheaders()
        chunk = b"x" * 65536
        sent = 0
        try:
            while sent < 150_000_000:
                conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
        except OSError:
            pass                                           # the server stopped reading: what we want
        assert sent < 150_000_000
        grown = _rss_mb(proc.pid) - base
        assert grown < 100, f"RSS grew {grown:.0f} MB"
        code = None
        try:
            code = conn.getresponse().status
        except (OSError, http.client.HTTPException):
            pass
        assert code in (413, None)
        assert api.get("/v1/status")["version"] == 1       # nothing changed
        print(f"\n3000 partial requests held: status served in {served_s * 1000:.0f} ms; chunked body cut after "
              f"{sent / 1e6:.1f} MB (reply {code}); RSS +{grown:.0f} MB")
    finally:
        for s in held:
            s.close()
        out = _stop(proc)
    assert "Traceback" not in out, out[-3000:]


@pytest.mark.parametrize("which", ["openflow", "api"])
def test_a_port_already_taken_makes_the_controller_exit_naming_it(tmp_path, which):
    conf, data, _ = _fabric_config(tmp_path, k=4)
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen(1)
    taken = blocker.getsockname()[1]
    if which == "openflow":
        data["controller"]["openflow"]["port"] = taken
    else:
        data["api"]["listen"] = f"127.0.0.1:{taken}"
    conf.write_text(yaml.safe_dump(data))
    try:
        run = subprocess.run([sys.executable, "-m", "bwfabric.cli", "controller", "--config", str(conf)],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
    finally:
        blocker.close()
    what = "OpenFlow listener" if which == "openflow" else "API listener"
    assert run.returncode == 2, run.stderr[-2000:]
    assert f"{what} 127.0.0.1:{taken}: Address already in use" in run.stderr, run.stderr[-2000:]
    assert "Traceback" not in run.stderr


def test_a_listen_address_that_is_not_local_makes_the_controller_exit_naming_it(tmp_path):
    conf, data, _ = _fabric_config(tmp_path, k=4)
    data["controller"]["openflow"]["listen"] = "192.0.2.1"          # TEST-NET-1: never this machine's
    conf.write_text(yaml.safe_dump(data))
    run = subprocess.run([sys.executable, "-m", "bwfabric.cli", "controller", "--config", str(conf)],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "OpenFlow listener 192.0.2.1:" in run.stderr, run.stderr[-2000:]
    assert "Cannot assign requested address" in run.stderr


def test_a_missing_api_token_file_is_named_not_a_traceback(tmp_path):
    conf, _, _ = _fabric_config(tmp_path, k=4)
    os.unlink(tmp_path / "api.token")
    run = subprocess.run([sys.executable, "-m", "bwfabric.cli", "controller", "--config", str(conf)],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "API token file" in run.stderr and "No such file" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
