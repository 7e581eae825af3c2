"""The distribution, per role (docs/deploy.md): the wheel is built from this
checkout and installed into clean virtual environments (no system site
packages, the versions of requirements.txt as constraints, the rest from the
package index). The agent's environment holds nothing of the controller's or
the emulation's stack and runs a real agent that puts a configuration in
force; the controller's runs ``check-config`` and a controller that speaks
OpenFlow on its port. Each refuses the other role's commands with the extra
to install."""

from __future__ import annotations

import json
import secrets
import shutil
import socket
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from tests.unit.test_controller_process import _free_port

pytestmark = pytest.mark.root

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("os-ken", "numpy", "numba", "llvmlite", "matplotlib", "highspy", "pulp", "networkx", "eventlet")


def _run(cmd, timeout=900, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of this checkout, built from a copy of it (the checkout's
    own build/ untouched)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv", ".git", "build", "results", "__pycache__",
                                                             "*.egg-info", ".hypothesis", ".pytest_cache"))
    out = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp / "dist",
                src])
    assert out.returncode == 0, out.stderr[-3000:]
    (whl,) = (tmp / "dist").glob("bwfabric-*.whl")
    return whl


def _venv(path: Path, wheel: Path, extra: str = "") -> Path:
    assert _run(["/usr/bin/python3", "-m", "venv", path]).returncode == 0
    out = _run([path / "bin" / "pip", "install", "-q", "--disable-pip-version-check", "-c", ROOT / "requirements.txt",
                f"{wheel}{extra}"])
    assert out.returncode == 0, out.stderr[-3000:]
    return path


def _installed(venv: Path) -> set[str]:
    out = _run([venv / "bin" / "pip", "list", "--format", "json", "--disable-pip-version-check"])
    return {p["name"].lower().replace("_", "-") for p in json.loads(out.stdout)}


def test_the_wheel_holds_every_role_and_its_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in ("hostagent/bpf/bwf_wc.bpf.c", "hostagent/bpf/bwf_mark.bpf.c", "hostagent/bpf/bwf_sockops.bpf.c",
              "hostagent/bpf/bwf_coupled.bpf.c", "hostagent/bpf/bwf_buckets.h", "mininet_topos/delayline/delayline.c",
              "mininet_topos/queues/bwf_aqm.bpf.c", "experiments/data/websearch_cdf.txt",
              "experiments/data/fb_hadoop_cdf.txt", "benchmarks/__init__.py", "bwcommon/hostconfig.py",
              "bwtesting/fakenet.py", "controller/config.py", "apps/lessor/settings.py"):
        assert f in names, f
    assert not any(n.startswith(("tests/", "build/")) for n in names)
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(meta).decode()
    base = [ln for ln in text.splitlines() if ln.startswith("Requires-Dist:") and "extra ==" not in ln]
    assert sorted(ln.split()[1].split(">")[0].split("<")[0] for ln in base) == ["PyYAML", "pydantic", "pyroute2"]
    assert "Provides-Extra: controller" in text and "Provides-Extra: emulation" in text


def test_the_agent_installs_alone_and_runs(wheel, tmp_path, netns):
    """The agent's environment: the base install. It has none of the heavy
    packages, refuses ``controller`` with the extra to install, and its
    ``bwfabric agent`` (in a namespace of the test's own) takes a signed
    configuration and reports it in force, read back from the kernel."""
    from benchmarks.agent_faults import drop_bpf_maps, make_bpf_maps
    from bwcommon.agentclient import AgentClient
    from bwcommon.channel import host_key, write_secret

    venv = _venv(tmp_path / "agent-venv", wheel)
    have = _installed(venv)
    assert {"bwfabric", "pydantic", "pyroute2", "pyyaml"} <= have
    assert not have & set(HEAVY), sorted(have & set(HEAVY))
    bwf = venv / "bin" / "bwfabric"
    refused = _run([bwf, "controller", "--topology", ROOT / "examples" / "fattree4.json", "--apps", "ecmp"],
                   timeout=60)
    assert refused.returncode == 2 and "bwfabric[controller]" in refused.stderr, refused.stderr[-2000:]

    master = secrets.token_bytes(32)
    write_secret(tmp_path / "ns.key", host_key(master, "ns").hex())
    bpf = tmp_path / "bpffs"
    make_bpf_maps(bpf)
    sock = tmp_path / "agent.sock"
    proc = subprocess.Popen(["ip", "netns", "exec", netns, str(bwf), "agent", "--host", "ns", "--key-file",
                             str(tmp_path / "ns.key"), "--listen", f"unix:{sock}", "--state-dir",
                             str(tmp_path / "state"), "--bpf-dir", str(bpf)],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "agent.log", "w"))
    try:
        for _ in range(300):
            if sock.exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert proc.poll() is None, (tmp_path / "agent.log").read_text()[-3000:]
        client = AgentClient(f"unix:{sock}", "ns", host_key(master, "ns"))
        reply = client.request("config", dict(host="ns", interface="ag0", address="10.9.0.1", nic_mbps=100,
                                              guarantee_mbps=10, wc_subflows=1, join_port_base=10100))
        assert reply["ok"], reply
        status = client.request("status", {})
        assert status["in_force"] and status["config"]["vm"]["guarantee_mbps"] == 10, status
        client.close()
        # the agent that ran is the installed one, not this checkout's
        log = (tmp_path / "agent.log").read_text()
        assert "Traceback" not in log, log[-3000:]
        where = _run([venv / "bin" / "python", "-c", "import hostagent; print(hostagent.__file__)"], cwd=tmp_path)
        assert str(venv) in where.stdout, where.stdout
        # its BPF sources came with it, and what it compiles goes to the machine's cache, not site-packages
        paths = _run([venv / "bin" / "python", "-c", "from hostagent import cc; import json; print(json.dumps("
                      "[str(cc.BUILD), sorted(p.name for p in cc.SRC.iterdir())]))"], cwd=tmp_path)
        build, sources = json.loads(paths.stdout)
        assert build == "/var/cache/bwfabric/bpf", build
        assert {"bwf_wc.bpf.c", "bwf_mark.bpf.c", "bwf_sockops.bpf.c", "bwf_coupled.bpf.c", "bwf_buckets.h"} <= set(
            sources)
    finally:
        proc.terminate()
        proc.wait(10)
        drop_bpf_maps(bpf)


def test_the_controller_installs_alone_and_runs(wheel, tmp_path):
    """The controller's environment: the controller extra. No emulation
    packages; ``check-config`` admits the example; ``bwfabric controller``
    greets a switch with an OpenFlow 1.3 HELLO on its port; ``experiment``
    is refused with the extra to install."""
    venv = _venv(tmp_path / "controller-venv", wheel, "[controller]")
    have = _installed(venv)
    assert {"os-ken", "numpy", "numba", "prometheus-client", "waitress"} <= have
    assert not have & {"matplotlib", "pulp", "highspy", "rich", "mininet"}
    bwf = venv / "bin" / "bwfabric"
    checked = _run([bwf, "check-config", ROOT / "examples" / "fattree4.yaml"], timeout=300, cwd=tmp_path)
    assert checked.returncode == 0 and checked.stdout.startswith("ok:"), checked.stdout + checked.stderr[-2000:]
    refused = _run([bwf, "experiment", "main"], timeout=120, cwd=tmp_path)
    assert refused.returncode == 2 and "bwfabric[emulation]" in refused.stderr, refused.stderr[-2000:]

    port = _free_port()
    proc = subprocess.Popen([str(bwf), "controller", "--topology", str(ROOT / "examples" / "fattree4.json"), "--apps",
                             "ecmp", "--of-port", str(port), "--listen", "127.0.0.1"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "controller.log", "w"))
    try:
        deadline = time.monotonic() + 180          # numba compiles its kernels on the first start
        while True:
            assert proc.poll() is None, (tmp_path / "controller.log").read_text()[-3000:]
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                break
            except OSError:
                assert time.monotonic() < deadline, (tmp_path / "controller.log").read_text()[-3000:]
                time.sleep(0.5)
        with s:
            s.settimeout(30)
            head = b""
            while len(head) < 8:
                chunk = s.recv(8 - len(head))
                assert chunk, "the controller closed the connection"
                head += chunk
        version, msg_type, length, _xid = struct.unpack("!BBHI", head)
        assert (version, msg_type) == (0x04, 0), head      # OpenFlow 1.3, OFPT_HELLO
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
