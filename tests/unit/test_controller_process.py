"""The controller process itself (`bwfabric controller --config`), without
switches: it starts from its file, serves its API, and on SIGHUP reads the
file again -- a bad file changes nothing, a good one bumps the version."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from bwfabric.client import ApiClient, ApiClientError
from controller.api import read_token

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _until(fn, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = fn()
            if got:
                return got
        except ApiClientError:
            pass
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_sighup_reloads_and_a_bad_file_changes_nothing(tmp_path):
    data = yaml.safe_load((ROOT / "examples" / "fattree4.yaml").read_text())
    data["fabric"]["topology"] = str(ROOT / "examples" / "fattree4.json")
    data["controller"] = {"routing": "ecmp", "prio_queues": True,
                          "openflow": {"listen": "127.0.0.1", "port": _free_port()}}
    data["agents"] = {"master_key_file": str(tmp_path / "master.key"),
                      "address_template": f"unix:{tmp_path}/{{host}}.sock"}
    data["api"] = {"listen": f"127.0.0.1:{_free_port()}", "token_file": "api.token", "state_file": "state.yaml"}
    conf = tmp_path / "bwfabric.yaml"
    conf.write_text(yaml.safe_dump(data))
    fd = os.open(tmp_path / "api.token", os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"0123456789abcdef0123456789abcdef")
    os.close(fd)
    fd = os.open(tmp_path / "master.key", os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"00" * 32)
    os.close(fd)
    proc = subprocess.Popen([sys.executable, "-m", "bwfabric.cli", "controller", "--config", str(conf)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        api = ApiClient.from_config(conf)
        first = _until(lambda: api.get("/v1/status"))
        assert first["version"] == 1 and first["agents"]["declared"] == 12
        conf.write_text(conf.read_text().replace("guarantee_mbps: 4", "guarantee_mbps: -4", 1))
        proc.send_signal(signal.SIGHUP)
        refused = _until(lambda: (s := api.get("/v1/status"))["load_errors"] == 1 and s)
        assert refused["version"] == 1 and refused["digest"] == first["digest"]
        assert "must be greater than or equal to 0.001" in refused["last_error"]
        data["tenants"]["web"]["vms"]["w1"]["guarantee_mbps"] = 3
        conf.write_text(yaml.safe_dump(data))
        proc.send_signal(signal.SIGHUP)
        changed = _until(lambda: (s := api.get("/v1/status"))["version"] == 2 and s)
        assert changed["digest"] != first["digest"] and api.get("/v1/tenants/web/vms/w1")["guarantee_mbps"] == 3
        assert "bwfabric_config_load_errors_total 1.0" in api.metrics()
    finally:
        proc.terminate()
        out = proc.communicate(timeout=20)[0]
    assert "refused, nothing changed" in out and "SIGHUP: configuration" in out


def test_the_api_token_file_must_be_private_and_long(tmp_path):
    path = tmp_path / "t"
    path.write_text("0123456789abcdef0123")
    os.chmod(path, 0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        read_token(path)
    os.chmod(path, 0o600)
    assert read_token(path) == "0123456789abcdef0123"
    path.write_text("short")
    with pytest.raises(ValueError, match="shorter than 16"):
        read_token(path)


def test_the_token_files_edges(tmp_path):
    """16 characters are enough, 15 are not (spaces around do not count);
    a file of 4096 bytes is read, one byte more is refused; bytes that are
    not UTF-8 are refused by name."""
    path = tmp_path / "t"

    def write(data: bytes):
        path.write_bytes(data)
        os.chmod(path, 0o600)
    write(b"  0123456789abcdef\n")
    assert read_token(path) == "0123456789abcdef"
    write(b"0123456789abcde\n")
    with pytest.raises(ValueError, match=f"API token {path}: shorter than 16 characters"):
        read_token(path)
    write(b"a" * 4096)
    assert read_token(path) == "a" * 4096
    write(b"a" * 4097)
    with pytest.raises(ValueError, match="API token file"):
        read_token(path)
    write(b"0123456789abcdef\xff\xfe")
    with pytest.raises(ValueError, match=f"API token {path}: not UTF-8 text"):
        read_token(path)


def test_the_open_file_limit_plan():
    """Room for the connections plus a margin, never past the hard limit;
    an unlimited soft limit is left alone; at least 16 connections."""
    import resource

    from controller.api import FD_MARGIN, file_limit_plan
    inf = resource.RLIM_INFINITY
    assert FD_MARGIN == 256
    assert file_limit_plan(2048, 1024, 4096) == (2304, 2048)        # raised to what is wanted
    assert file_limit_plan(2048, 1024, 2000) == (2000, 1744)        # ...up to the hard limit
    assert file_limit_plan(2048, 1024, inf) == (2304, 2048)
    assert file_limit_plan(2048, 2304, 4096) == (None, 2048)        # already enough: untouched
    assert file_limit_plan(2048, 2303, 4096) == (2304, 2048)
    assert file_limit_plan(2048, inf, inf) == (None, 2048)
    assert file_limit_plan(2048, 100, 200) == (200, 16)             # hardly any files: still 16
    assert file_limit_plan(2048, 100, 100) == (100, 16)


def test_the_api_server_is_configured_as_documented():
    """waitress's settings: a bounded pool, poll, the connection and size
    limits, idle connections closed, no tracebacks or proxy headers."""
    from controller.api import MAX_BODY, Api, Server
    srv = Server(Api.__new__(Api), "127.0.0.1", 0).start()
    try:
        adj = srv.httpd.adj
        assert srv.app is not None and (adj.threads, adj.asyncore_use_poll, adj.backlog) == (4, True, 1024)
        assert (adj.channel_timeout, adj.cleanup_interval) == (10, 1)
        assert (adj.max_request_body_size, adj.max_request_header_size) == (MAX_BODY, 16 * 1024)
        assert adj.connection_limit >= 16 and adj.ident == "bwfabric"
        assert adj.expose_tracebacks is False and adj.clear_untrusted_proxy_headers is True
        assert srv.httpd.effective_host == "127.0.0.1" and int(srv.port) > 0 and srv.thread.is_alive()
    finally:
        srv.stop()
    assert not srv.thread.is_alive()                # stopped: its loop thread ended
