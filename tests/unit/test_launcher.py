import json
import subprocess
import sys

import pytest

from controller import launcher
from mininet_topos import builders


def test_resolve_apps():
    assert launcher.resolve_apps(["ecmp"]) == ["apps.routing.ecmp"]
    assert launcher.resolve_apps(["single_path", "my.module"]) == ["apps.routing.single_path", "my.module"]
    with pytest.raises(ValueError, match="unknown app 'ospf'"):
        launcher.resolve_apps(["ospf"])
    with pytest.raises(ValueError, match="both route"):
        launcher.resolve_apps(["ecmp", "single_path"])
    with pytest.raises(ValueError, match="no app"):
        launcher.resolve_apps([""])


@pytest.mark.parametrize("apps,topo_fix,message", [
    ("ecmp", lambda d: d["links"][0].update(b="ghost"), "unknown node 'ghost'"),
    ("ospf", lambda d: None, "unknown app 'ospf'"),
])
def test_controller_refuses_bad_input_before_starting(tmp_path, apps, topo_fix, message):
    data = builders.star(2).to_dict()
    topo_fix(data)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    res = subprocess.run([sys.executable, "-m", "bwfabric.cli", "controller", "--topology", str(path),
                          "--apps", apps, "--of-port", "6699"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert message in res.stderr
    assert "starting" not in res.stderr  # nothing was launched


def _certs(d):
    def ossl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True)
    ossl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{d}/ca.key", "-out", f"{d}/ca.pem",
         "-days", "2", "-subj", "/CN=bwfabric-test-ca")
    for name in ("ctl", "sw"):
        ossl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{d}/{name}.key", "-out", f"{d}/{name}.csr",
             "-subj", f"/CN={name}")
        ossl("x509", "-req", "-in", f"{d}/{name}.csr", "-CA", f"{d}/ca.pem", "-CAkey", f"{d}/ca.key",
             "-CAcreateserial", "-out", f"{d}/{name}.pem", "-days", "2")
    import os
    os.chmod(f"{d}/ctl.key", 0o600)


def test_openflow_over_tls_needs_a_switch_certificate_signed_by_the_ca(tmp_path):
    import socket
    import ssl
    import time
    _certs(tmp_path)
    topo = tmp_path / "t.json"
    builders.star(2).save(topo)
    port = 16000 + (hash(str(tmp_path)) % 1000)
    proc = subprocess.Popen([sys.executable, "-m", "bwfabric.cli", "controller", "--topology", str(topo),
                             "--apps", "ecmp", "--of-port", str(port), "--of-tls-key", f"{tmp_path}/ctl.key",
                             "--of-tls-cert", f"{tmp_path}/ctl.pem", "--of-tls-ca", f"{tmp_path}/ca.pem"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        def hello(with_cert: bool) -> bytes:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.load_verify_locations(f"{tmp_path}/ca.pem")
            ctx.check_hostname = False
            if with_cert:
                ctx.load_cert_chain(f"{tmp_path}/sw.pem", f"{tmp_path}/sw.key")
            with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
                with ctx.wrap_socket(raw) as s:
                    return s.recv(8)

        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        assert hello(True)[:2] == b"\x04\x00"          # an OpenFlow 1.3 HELLO, over TLS
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            got = hello(False)                        # no switch certificate: refused
            if not got:
                raise ConnectionError("closed")
        with socket.create_connection(("127.0.0.1", port), timeout=5) as plain:
            plain.sendall(b"\x04\x00\x00\x08\x00\x00\x00\x01")   # plain-TCP HELLO: no OpenFlow answer
            plain.settimeout(2)
            try:
                assert plain.recv(8)[:2] != b"\x04\x00"
            except (socket.timeout, ConnectionError):
                pass
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize("tls,message", [({"key": "k"}, "missing: cert, ca"),
                                         ({"key": "/nope", "cert": "/nope", "ca": "/nope"}, "no such file")])
def test_tls_options_are_checked_before_starting(tls, message):
    with pytest.raises(ValueError, match=message):
        launcher.check_tls(tls)


def test_an_experiment_whose_controller_dies_fails_loudly(tmp_path, monkeypatch, capsys):
    """The registry's verdict when a controller is SIGKILLed mid-run: FAILED
    printed, exit 1, while what the experiment measured is still returned
    (the landed code printed a normal result and exited 0)."""
    import os
    import signal
    import time
    import types

    from experiments import registry
    from experiments.controller_proc import ControllerProcess

    topo = tmp_path / "t.json"
    builders.star(2).save(topo)
    measured = {}

    def run(cfg, out_dir):
        from experiments import configs
        conf = configs.write(tmp_path / "bwfabric.yaml", topo, "ecmp", 16999)
        with ControllerProcess(conf, tmp_path / "ctl.log") as ctl:
            time.sleep(1.0)
            os.kill(ctl.proc.pid, signal.SIGKILL)
            time.sleep(0.5)
            measured["alive"] = ctl.alive()
        measured["died"] = ctl.died

    from dataclasses import dataclass

    @dataclass
    class Config:
        def check(self):
            pass

    fake = types.SimpleNamespace(Config=Config, run=run)
    monkeypatch.setitem(registry.EXPERIMENTS, "probe", (fake, {}, "a controller that dies"))
    monkeypatch.setattr(os, "geteuid", lambda: 0)      # the registry's root check, not what is tested
    assert registry.run("probe", [], tmp_path) == 1
    err = capsys.readouterr().err
    assert "FAILED" in err and "exited with -9" in err
    assert measured["alive"] is False and "exited with -9" in measured["died"]
