"""The control plane keeps its word (issue #31), in process: racing API
clients lose nothing, conditional requests, an accepted change is one the
agents and meters can apply, a persisted overlay that no longer fits is
set aside by name at start (never deleted), a change that cannot be
persisted changes nothing and leaves nothing behind, and files that are
not files are refused by name instead of hanging or eating memory."""

import json
import os
import subprocess
import sys
import threading

import pytest
import yaml

from controller import config, runtime
from controller.api import Api, read_token
from tests.unit.test_api import ROOT, TOKEN, Controller, ctl  # noqa: F401  (the fixture)


def _put(c, path, body, **headers):
    h = {"Authorization": f"Bearer {TOKEN}", **headers}
    resp = c.client.open(path, method="PUT", headers=h, data=json.dumps(body), content_type="application/json")
    return resp.status_code, json.loads(resp.data), resp.headers.get("ETag")


def _delete(c, path, **headers):
    resp = c.client.open(path, method="DELETE", headers={"Authorization": f"Bearer {TOKEN}", **headers})
    return resp.status_code, json.loads(resp.data)


def _get(c, path):
    resp = c.client.get(path, headers={"Authorization": f"Bearer {TOKEN}"})
    return resp.status_code, json.loads(resp.data), resp.headers.get("ETag")


# ---- racing clients -------------------------------------------------------------------------------
def test_concurrent_vm_puts_to_one_tenant_are_all_in_force(ctl):
    """Each thread puts its own VM of one tenant: every 200 is in force and
    persisted (before #31 the tenant was read outside the lock: 52 of 55
    accepted PUTs were lost)."""
    free = ["h4", "h8", "h12", "h16"]          # the example leaves these hosts free
    _put(ctl, "/v1/tenants/race", {"vms": {}})
    answers = {}
    barrier = threading.Barrier(len(free))

    def worker(i, host):
        barrier.wait()
        answers[i] = _put(ctl, f"/v1/tenants/race/vms/v{i}", {"host": host, "guarantee_mbps": 1 + i})[0]
    threads = [threading.Thread(target=worker, args=(i, h)) for i, h in enumerate(free)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(answers.values()) == {200}
    vms = ctl.rt.loaded.cfg.tenants["race"].vms
    assert {n: v.guarantee_mbps for n, v in vms.items()} == {f"v{i}": 1.0 + i for i in range(len(free))}
    again = config.load(ctl.workdir / "bwfabric.yaml")             # what a restart loads
    assert again.digest == ctl.rt.loaded.digest


def test_a_deleted_tenant_does_not_come_back_with_its_old_vms(ctl):
    """A tenant DELETE racing VM PUTs: in the order of the versions the
    changes were given, the last change of each VM decides it -- a VM PUT
    after the DELETE is 404 (before #31 the tenant came back whole)."""
    for trial in range(5):
        _put(ctl, "/v1/tenants/race", {"vms": {"v0": {"host": "h4", "guarantee_mbps": 1}}})
        log = []
        lock = threading.Lock()
        barrier = threading.Barrier(4)

        def putter(i, host):
            barrier.wait()
            for g in (1.5, 2.0, 2.5):
                code, body, _ = _put(ctl, f"/v1/tenants/race/vms/v{i}", {"host": host, "guarantee_mbps": g})
                with lock:
                    log.append((code, body.get("version"), "put", i))

        def deleter():
            barrier.wait()
            code, body = _delete(ctl, "/v1/tenants/race")
            with lock:
                log.append((code, body.get("version"), "delete", None))
        threads = [threading.Thread(target=putter, args=(i, h)) for i, h in ((1, "h8"), (2, "h12"), (3, "h16"))]
        threads.append(threading.Thread(target=deleter))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        deleted_at = next(v for code, v, op, _ in log if op == "delete" and code == 200)
        assert all(code == 404 for code, v, op, _ in log if op == "put" and v is None), log
        assert all(v <= deleted_at for code, v, op, _ in log if op == "put" and code == 200), log
        assert "race" not in ctl.rt.loaded.cfg.tenants, (trial, log)
        assert "race" not in (config.load(ctl.workdir / "bwfabric.yaml").cfg.tenants)


def test_a_reload_composes_with_an_accepted_change(ctl):
    """An operator's edit reloaded while an API change is under way: both
    stay in force, and what runs is what a restart loads (before #31 the
    API built its change on the file it had read before the reload and put
    the old file back: 19 of 20 trials)."""
    path = ctl.workdir / "bwfabric.yaml"
    data = yaml.safe_load(path.read_text())
    mismatches = []
    for i in range(20):
        operator_value = 3.0 + 0.05 * (i + 1)
        api_value = 1.0 + 0.05 * (i + 1)
        barrier = threading.Barrier(2)

        def edit_and_reload():
            data["tenants"]["analytics"]["vms"]["a1"]["guarantee_mbps"] = operator_value
            path.write_text(yaml.safe_dump(data))
            barrier.wait()
            ctl.rt.reload()
        t = threading.Thread(target=edit_and_reload)
        t.start()
        barrier.wait()
        assert _put(ctl, "/v1/tenants/web/vms/w1", {"host": "h2", "guarantee_mbps": api_value})[0] == 200
        t.join()
        vms = {n: v.guarantee_mbps for t_ in ctl.rt.loaded.cfg.tenants.values() for n, v in t_.vms.items()}
        if (vms["a1"], vms["w1"]) != (operator_value, api_value) or \
                config.load(path).digest != ctl.rt.loaded.digest:
            mismatches.append((i, vms["a1"], vms["w1"]))
    assert not mismatches, mismatches


# ---- conditional requests ---------------------------------------------------------------------------
def test_if_match_refuses_a_stale_write_with_412_and_changes_nothing(ctl):
    code, vm, tag = _get(ctl, "/v1/tenants/web/vms/w1")
    assert code == 200 and tag
    code, _, tag2 = _put(ctl, "/v1/tenants/web/vms/w1", {**vm, "guarantee_mbps": 1.5}, **{"If-Match": tag})
    assert code == 200 and tag2 and tag2 != tag
    before = ctl.snapshot()
    code, reply, _ = _put(ctl, "/v1/tenants/web/vms/w1", {**vm, "guarantee_mbps": 3}, **{"If-Match": tag})
    assert code == 412 and "read it again" in reply["error"]
    assert ctl.snapshot() == before
    assert _delete(ctl, "/v1/tenants/web", **{"If-Match": tag})[0] == 412          # a VM's tag is not the tenant's
    _, _, ttag = _get(ctl, "/v1/tenants/web")
    code, reply, _ = _put(ctl, "/v1/tenants/web", {"vms": {}}, **{"If-None-Match": "*"})
    assert code == 412 and ctl.snapshot() == before
    assert _put(ctl, "/v1/tenants/fresh", {"vms": {}}, **{"If-Match": "*"})[0] == 412    # must exist
    assert _put(ctl, "/v1/tenants/fresh", {"vms": {}}, **{"If-None-Match": "*"})[0] == 200
    assert _delete(ctl, "/v1/tenants/web", **{"If-Match": ttag})[0] == 200
    code, listing, _ = _get(ctl, "/v1/tenants")
    assert set(listing["etags"]) == set(listing["tenants"]) == {"analytics", "batch", "fresh"}


def test_an_etag_changes_when_a_reload_changes_the_tenant(ctl):
    _, _, tag = _get(ctl, "/v1/tenants/web")
    path = ctl.workdir / "bwfabric.yaml"
    data = yaml.safe_load(path.read_text())
    data["tenants"]["web"]["vms"]["w1"]["guarantee_mbps"] = 1.25
    path.write_text(yaml.safe_dump(data))
    ctl.rt.reload()
    assert _get(ctl, "/v1/tenants/web")[2] != tag
    assert _delete(ctl, "/v1/tenants/web", **{"If-Match": tag})[0] == 412


# ---- accepted means deliverable ---------------------------------------------------------------------
@pytest.mark.parametrize("body,phrase", [
    ({"host": "h4", "guarantee_mbps": 9.5}, "guarantees of its VMs 9.5"),   # over its NIC, its peers small
    ({"host": "h4", "guarantee_mbps": 5e-324}, "greater than or equal to 0.001"),
    ({"host": "h4", "guarantee_mbps": 1e-9}, "greater than or equal to 0.001"),
])
def test_a_vm_the_agent_or_meter_could_not_enforce_is_refused(ctl, body, phrase):
    """One validation path: the API refuses what the agents and meters
    could not apply (before #31 2000 Mb/s on a 1000 Mb/s host answered 200
    and the controller then refused to start)."""
    _put(ctl, "/v1/tenants/small", {"vms": {"s1": {"host": "h8", "guarantee_mbps": 0.5}}})
    before = ctl.snapshot()
    code, reply, _ = _put(ctl, "/v1/tenants/small/vms/s2", body)
    assert code in (409, 422) and phrase in json.dumps(reply), reply
    assert ctl.snapshot() == before


def test_duplicate_keys_in_a_json_body_are_refused(ctl):
    before = ctl.snapshot()
    code, reply = ctl.req("PUT", "/v1/tenants/web/vms/w1",
                          raw=b'{"host": "h2", "guarantee_mbps": 1, "guarantee_mbps": 3}')
    assert code == 422 and "duplicate key 'guarantee_mbps'" in json.dumps(reply)
    assert ctl.snapshot() == before


# ---- a change that cannot be persisted ----------------------------------------------------------------
def test_a_change_that_cannot_be_persisted_is_refused_named_and_leaves_no_temporary_file(ctl):
    state = ctl.workdir / "api-state.yaml"
    state.mkdir()                     # the state file is a directory: os.replace onto it fails
    before = (ctl.rt.loaded.digest, ctl.rt.version)
    code, reply, _ = _put(ctl, "/v1/tenants/web/vms/w1", {"host": "h2", "guarantee_mbps": 3})
    assert code == 503 and "could not be persisted" in reply["error"] and "nothing changed" in reply["error"]
    assert (ctl.rt.loaded.digest, ctl.rt.version) == before
    assert not (ctl.workdir / "api-state.yaml.tmp").exists()
    assert ctl.api.persist_errors == 1
    assert ("bwfabric_api_persist_errors", {}, 1) in list(ctl.api.samples())


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs")
def test_a_full_disk_is_507_and_changes_nothing(tmp_path):
    mnt = tmp_path / "full"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "bwfabric-test", str(mnt)], check=True)
    try:
        data = yaml.safe_load((ROOT / "examples" / "fattree4.yaml").read_text())
        data["fabric"]["topology"] = str(ROOT / "examples" / "fattree4.json")
        data["api"] = {"listen": "127.0.0.1:0", "token_file": "api.token", "state_file": str(mnt / "state.yaml")}
        (tmp_path / "bwfabric.yaml").write_text(yaml.safe_dump(data))
        rt = runtime.start(config.load(tmp_path / "bwfabric.yaml"))
        c = Controller.__new__(Controller)
        c.rt, c.api = rt, Api(rt, token=TOKEN)
        from werkzeug.test import Client
        c.client = Client(c.api)
        with open(mnt / "filler", "wb") as f:
            try:
                f.write(b"x" * (1 << 20))
            except OSError:
                pass
        before = (rt.loaded.digest, rt.version)
        code, reply, _ = _put(c, "/v1/tenants/web/vms/w1", {"host": "h2", "guarantee_mbps": 3})
        assert code == 507 and "No space left" in reply["error"], reply
        assert (rt.loaded.digest, rt.version) == before
        assert sorted(p.name for p in mnt.iterdir()) == ["filler"]
    finally:
        runtime.stop()
        subprocess.run(["umount", str(mnt)], check=False)


# ---- a persisted overlay that no longer fits ------------------------------------------------------------
def _workdir(tmp_path, overlay_text: str | None):
    data = yaml.safe_load((ROOT / "examples" / "fattree4.yaml").read_text())
    data["fabric"]["topology"] = str(ROOT / "examples" / "fattree4.json")
    data["api"] = {"listen": "127.0.0.1:0", "token_file": "api.token", "state_file": "state.yaml"}
    conf = tmp_path / "bwfabric.yaml"
    conf.write_text(yaml.safe_dump(data))
    if overlay_text is not None:
        (tmp_path / "state.yaml").write_text(overlay_text)
    return conf, data


def test_an_overlay_that_no_longer_fits_is_set_aside_at_start_and_the_rest_kept(tmp_path):
    good = {"vms": {"n1": {"host": "h4", "guarantee_mbps": 2}}}
    # 9.5 on h8's 10 Mb/s NIC: accepted by the old admission check, refused now
    bad = {"vms": {"n2": {"host": "h8", "guarantee_mbps": 9.5}}}
    conf, _ = _workdir(tmp_path, yaml.safe_dump({"tenants": {"good": good, "bad": bad}}))
    with pytest.raises(config.ConfigError) as exc:           # a reload (or check-config) refuses it by name
        config.load(conf)
    assert any(p.startswith(f"{tmp_path / 'state.yaml'} (API state): admission: host h8 NIC")
               for p in exc.value.problems), exc.value.problems
    loaded = config.load(conf, salvage=True)                 # a start sets it aside
    assert "good" in loaded.cfg.tenants and "bad" not in loaded.cfg.tenants
    assert loaded.set_aside.tenants == {"bad": bad} and "host h8 NIC" in loaded.set_aside.describe()
    side = config.set_aside(loaded, now=0)
    assert side.name == "state.yaml.rejected-19700101T000000Z" and side.stat().st_mode & 0o777 == 0o600
    assert yaml.safe_load(side.read_text()) == {"tenants": {"bad": bad}} and "host h8 NIC" in side.read_text()
    assert yaml.safe_load((tmp_path / "state.yaml").read_text()) == {"tenants": {"good": good}}
    # what the operator reads: the side file's header (one line per reason), the state file's, the log line
    (why,) = loaded.set_aside.problems
    assert side.read_text().startswith(f"# set aside by the controller at start; why:\n#   {why}\ntenants:\n")
    assert (tmp_path / "state.yaml").read_text().startswith(
        "# written by the bwfabric controller's API; do not edit while it runs\ntenants:\n")
    assert loaded.set_aside.describe() == f"{tmp_path / 'state.yaml'}: tenant(s) bad set aside: {why}"
    two = config.SetAside(tmp_path / "s.yaml", {"b": {}, "a": {}}, ["one", "two"])
    assert two.describe() == f"{tmp_path / 's.yaml'}: tenant(s) a, b set aside: one; two"
    assert config.load(conf).digest == loaded.digest          # the next start needs nothing set aside


@pytest.mark.parametrize("text", ["tenants: [1, 2]\n", "tenants: {a: \n  - [\n", "\xff\xfe"])
def test_an_unreadable_overlay_is_moved_aside_whole(tmp_path, text):
    conf, _ = _workdir(tmp_path, text)
    with pytest.raises(config.ConfigError):
        config.load(conf)
    loaded = config.load(conf, salvage=True)
    assert loaded.set_aside.tenants is None and loaded.overlay == {}
    assert loaded.set_aside.describe().startswith(f"{tmp_path / 'state.yaml'}: the whole file set aside: ")
    side = config.set_aside(loaded, now=0)
    assert side.read_bytes() == text.encode() and not (tmp_path / "state.yaml").exists()


def test_the_controller_starts_on_the_operators_file_with_a_bad_overlay_set_aside(tmp_path):
    """Before #31 the controller refused to start (exit 2) with an overlay
    the API itself had accepted, while check-config said the file was fine."""
    from tests.unit.test_controller_process import _free_port, _until
    from bwfabric.client import ApiClient
    bad = {"vms": {"n2": {"host": "h8", "guarantee_mbps": 9.5}}}
    conf, data = _workdir(tmp_path, yaml.safe_dump({"tenants": {"bad": bad}}))
    data["controller"] = {"routing": "ecmp", "prio_queues": True,
                          "openflow": {"listen": "127.0.0.1", "port": _free_port()}}
    data["agents"] = {"master_key_file": str(tmp_path / "master.key"),
                      "address_template": f"unix:{tmp_path}/{{host}}.sock"}
    data["api"]["listen"] = f"127.0.0.1:{_free_port()}"
    conf.write_text(yaml.safe_dump(data))
    for name, text in (("api.token", TOKEN), ("master.key", "00" * 32)):
        fd = os.open(tmp_path / name, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, text.encode())
        os.close(fd)
    check = subprocess.run([sys.executable, "-m", "bwfabric.cli", "check-config", str(conf)], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 1 and "host h8 NIC" in check.stderr         # check-config says what start does
    proc = subprocess.Popen([sys.executable, "-m", "bwfabric.cli", "controller", "--config", str(conf)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        api = ApiClient.from_config(conf)
        status = _until(lambda: api.get("/v1/status"))
        assert "host h8 NIC" in status["overlay_set_aside"] and status["tenants"] == 3
        assert "bwfabric_config_overlay_set_aside 1.0" in api.metrics()
    finally:
        proc.terminate()
        out = proc.communicate(timeout=20)[0]
    assert "set aside" in out
    assert [p.name.split("-")[0] for p in tmp_path.glob("state.yaml.rejected-*")] == ["state.yaml.rejected"]


# ---- files that are not files -----------------------------------------------------------------------
def test_special_files_are_refused_by_name_without_hanging(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in ("/dev/zero", str(fifo), str(tmp_path)):
        with pytest.raises(config.ConfigError) as exc:
            config.load(path)
        assert any("not a regular file" in p or "a directory" in p for p in exc.value.problems), exc.value.problems
    conf, data = _workdir(tmp_path, None)
    for topo in ("/dev/zero", str(fifo)):
        data["fabric"]["topology"] = topo
        conf.write_text(yaml.safe_dump(data))
        with pytest.raises(config.ConfigError) as exc:
            config.load(conf)
        assert any(p.startswith("fabric.topology: topology") and "not a regular file" in p
                   for p in exc.value.problems), exc.value.problems
    data["fabric"]["topology"] = str(ROOT / "examples" / "fattree4.json")
    conf.write_text(yaml.safe_dump(data))
    (tmp_path / "state.yaml").mkdir()
    with pytest.raises(config.ConfigError) as exc:
        config.load(conf)
    assert any("API state file" in p and "a directory" in p for p in exc.value.problems)
    os.rmdir(tmp_path / "state.yaml")
    os.symlink("/dev/zero", tmp_path / "state.yaml")
    assert config.load(conf, salvage=True).set_aside is not None


def test_a_yaml_integer_too_long_to_convert_is_refused_by_name(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("version: " + "9" * 5000 + "\n")
    with pytest.raises(config.ConfigError) as exc:
        config.load(path)
    assert any("digits" in p for p in exc.value.problems), exc.value.problems


@pytest.mark.parametrize("make,phrase", [
    (lambda p: None, "No such file"),
    (lambda p: p.mkdir(), "a directory"),
    (lambda p: os.symlink("/dev/zero", p), "not a regular file"),
])
def test_the_api_token_file_is_refused_by_name(tmp_path, make, phrase):
    path = tmp_path / "api.token"
    make(path)
    with pytest.raises(ValueError) as exc:
        read_token(path)
    assert "API token file" in str(exc.value) and phrase in str(exc.value)
