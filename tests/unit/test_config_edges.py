"""The configuration loader's edges that the broad tests left open
(mutation testing, issue #33): a relative topology found beside the file it
is named in, whatever the working directory; the operator's own mapping kept
as ``raw``; the digest; the exact words of the agents' problems and of YAML
errors; the size bound's edge."""

import copy
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from controller import config

ROOT = Path(__file__).resolve().parents[2]
BASE = yaml.safe_load((ROOT / "examples" / "fattree4.yaml").read_text())


def _beside(tmp_path, data=None, name="bwfabric.yaml") -> Path:
    """A config file naming its topology relative to itself, in a directory of its own."""
    d = tmp_path / "etc"
    d.mkdir(exist_ok=True)
    shutil.copy(ROOT / "examples" / "fattree4.json", d / "topo.json")
    data = copy.deepcopy(BASE if data is None else data)
    data["fabric"]["topology"] = "topo.json"
    data["api"]["state_file"] = str(d / "state.yaml")
    (d / name).write_text(yaml.safe_dump(data))
    return d / name


def test_a_relative_topology_is_read_beside_its_file_from_any_directory(tmp_path, monkeypatch):
    path = _beside(tmp_path)
    monkeypatch.chdir(tmp_path)                     # not the file's directory
    for loaded in (config.load(path), config.load(path, overlay=False)):
        assert len(loaded.topology.hosts) == 16 and loaded.path == path
    operator = yaml.safe_load(path.read_text())
    assert config.from_data(operator, path=path).topology.hosts == config.load(path).topology.hosts
    assert len(config.from_data(operator, base=path.parent).topology.hosts) == 16
    other = tmp_path / "elsewhere"
    other.mkdir()
    with pytest.raises(config.ConfigError, match="fabric.topology"):
        config.from_data(operator, base=other, path=path)        # base, when given, wins over path's directory
    with pytest.raises(config.ConfigError, match="fabric.topology"):
        config.from_data(operator)                               # nothing to resolve it against: the cwd


def test_an_overlay_in_force_is_loaded_with_the_operators_mapping_kept(tmp_path):
    path = _beside(tmp_path)
    operator = yaml.safe_load(path.read_text())
    assert config.load(path).raw == operator
    extra = {"tenants": {"extra": {"vms": {"x1": {"host": "h4", "guarantee_mbps": 1}}}}}
    config.write_private(path.parent / "state.yaml", "# API state\n", extra)
    loaded = config.load(path)
    assert loaded.raw == operator and loaded.overlay == extra and "extra" in loaded.cfg.tenants
    assert loaded.path == path and len(loaded.topology.hosts) == 16
    assert config.from_data(operator, overlay=extra, path=path).raw == operator
    # a mapping without the operator's: its raw is the effective configuration
    direct = config.Loaded(loaded.cfg, loaded.topology, None)
    assert direct.raw == loaded.cfg.model_dump(mode="json")


def test_an_overlay_that_no_longer_fits_is_set_aside_on_the_operators_file(tmp_path):
    path = _beside(tmp_path)
    (path.parent / "state.yaml").write_text("tenants: [")      # damaged
    with pytest.raises(config.ConfigError, match=r"state.yaml \(API state\)"):
        config.load(path)
    loaded = config.load(path, salvage=True)
    assert loaded.set_aside is not None and loaded.path == path and len(loaded.topology.hosts) == 16
    assert loaded.raw == yaml.safe_load(path.read_text())
    bad = {"tenants": {"extra": {"vms": {"x1": {"host": "nowhere", "guarantee_mbps": 1}}},
                       "fine": {"vms": {"f1": {"host": "h4", "guarantee_mbps": 1}}}}}
    config.write_private(path.parent / "state.yaml", "# API state\n", bad)
    loaded = config.load(path, salvage=True)
    assert "fine" in loaded.cfg.tenants and "extra" not in loaded.cfg.tenants
    assert loaded.set_aside.tenants == {"extra": bad["tenants"]["extra"]}
    assert any("nowhere" in p for p in loaded.set_aside.problems)
    assert loaded.path == path and len(loaded.topology.hosts) == 16


def test_the_digest_names_the_effective_configuration():
    data = copy.deepcopy(BASE)
    data["fabric"]["topology"] = str(ROOT / "examples" / "fattree4.json")
    a, b = config.from_data(data), config.from_data(copy.deepcopy(data))
    assert len(a.digest) == 16 and int(a.digest, 16) >= 0 and a.digest == b.digest
    expect = __import__("hashlib").sha256(json.dumps({"cfg": a.cfg.model_dump(mode="json"),
                                                      "topology": a.topology.to_dict()},
                                                     sort_keys=True).encode()).hexdigest()[:16]
    assert a.digest == expect
    data["admission"]["mu"] = 0.8
    assert config.from_data(data).digest != a.digest


def _problems(change) -> list[str]:
    data = copy.deepcopy(BASE)
    data["fabric"]["topology"] = str(ROOT / "examples" / "fattree4.json")
    change(data)
    with pytest.raises(config.ConfigError) as exc:
        config.from_data(data)
    assert None not in exc.value.problems
    return exc.value.problems


def test_the_agents_problems_in_their_own_words():
    def hosts(data):
        data["agents"]["hosts"] = {"nowhere": {"key_file": "k", "address": "unix:/a"}, "h1": {"address": "unix:/b"}}
        del data["agents"]["master_key_file"]
        data["agents"]["unmanaged"] = ["elsewhere", "h1"]
    got = _problems(hosts)
    for want in ("agents.hosts.nowhere: 'nowhere' is not a host of the topology",
                 "agents.hosts.h1.key_file: required when agents.master_key_file is absent",
                 "agents.master_key_file: required with agents.address_template (keys are derived)",
                 "agents.unmanaged: 'elsewhere' is not a host of the topology",
                 "agents.unmanaged: h1 has an agent in agents.hosts"):
        assert want in got, got


def test_yaml_errors_say_where_and_what():
    with pytest.raises(config.ConfigError) as exc:
        config.parse_yaml("a: 1\nb: [1, 2\n", "f.yaml")
    (p,) = exc.value.problems
    assert p.startswith("f.yaml: line 3 column 1: ") and "expected ',' or ']'" in p
    with pytest.raises(config.ConfigError) as exc:
        config.parse_yaml("a: 1\na: 2\n", "f.yaml")
    assert exc.value.problems == ["f.yaml: line 2 column 1: duplicate key 'a'"]
    with pytest.raises(config.ConfigError) as exc:
        config.parse_yaml("a: &x 1\nb: *x\n", "f.yaml")
    assert exc.value.problems == ["f.yaml: line 2 column 4: anchors and aliases are not accepted"]
    with pytest.raises(config.ConfigError) as exc:
        config.parse_yaml("[" * 100_000, "deep.yaml")
    assert exc.value.problems == ["deep.yaml: nested too deeply"]
    assert config.parse_yaml("a: é\n", "f") == {"a": "é"} == config.parse_yaml("a: é\n".encode(), "f")


def test_the_size_bound_is_inclusive():
    at = b"#" * (config.MAX_CONFIG_BYTES - 3) + b"\na:"
    assert len(at) == config.MAX_CONFIG_BYTES and config.parse_yaml(at, "f") == {"a": None}
    with pytest.raises(config.ConfigError) as exc:
        config.parse_yaml(at + b" ", "f")
    assert exc.value.problems == [f"f: {config.MAX_CONFIG_BYTES + 1} bytes, more than {config.MAX_CONFIG_BYTES}"]
    with pytest.raises(config.ConfigError) as exc:
        config.parse_yaml("é" * (config.MAX_CONFIG_BYTES // 2 + 1), "f")      # str: counted in UTF-8 bytes
    assert "bytes, more than" in exc.value.problems[0]


# ---- the API's overlay file, read back (controller.config.read_overlay) ------------------------
def test_an_overlay_that_cannot_be_read_is_refused_naming_it_as_the_api_state_file(tmp_path):
    from controller.config import ConfigError, read_overlay
    d = tmp_path / "dir"
    d.mkdir()
    with pytest.raises(ConfigError) as exc:
        read_overlay(d)
    assert exc.value.problems == [f"API state file {d}: a directory"]


def test_an_overlay_with_bad_yaml_is_refused_naming_its_path(tmp_path):
    from controller.config import ConfigError, read_overlay
    p = tmp_path / "api-state.yaml"
    p.write_text("tenants: [unclosed\n")
    with pytest.raises(ConfigError) as exc:
        read_overlay(p)
    assert str(p) in str(exc.value) and "None" not in str(exc.value)


@pytest.mark.parametrize("text", ["- tenants\n", "tenants: 3\n", "tenants: {}\nother: 1\n", "7\n"])
def test_an_overlay_that_is_not_a_tenants_mapping_is_refused_by_name(tmp_path, text):
    from controller.config import ConfigError, read_overlay
    p = tmp_path / "api-state.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match="a mapping 'tenants' only"):
        read_overlay(p)


def test_a_relative_api_state_file_of_a_config_from_no_file_stays_relative(tmp_path):
    from controller.config import parse, state_path
    cfg = parse({"fabric": {"topology": "t.json"},
                 "api": {"listen": "127.0.0.1:8080", "token_file": "tok", "state_file": "api-state.yaml"}})
    assert state_path(cfg, None) == Path("api-state.yaml")
    assert state_path(cfg, tmp_path / "bwfabric.yaml") == tmp_path / "api-state.yaml"


def test_a_configuration_file_that_cannot_be_read_is_refused_naming_it_the_configuration(tmp_path):
    from controller.config import ConfigError, load
    with pytest.raises(ConfigError) as exc:
        load(tmp_path)
    assert exc.value.problems == [f"configuration {tmp_path}: a directory"]


@pytest.mark.parametrize("data", [[1, 2], "fabric", 7, None])
def test_a_proposed_configuration_that_is_no_mapping_is_refused_by_name_even_with_an_overlay(data):
    from controller.config import ConfigError, from_data
    with pytest.raises(ConfigError):
        from_data(data, overlay={"tenants": {}})


def test_the_launchers_configuration_is_the_active_one(tmp_path, monkeypatch):
    from controller.config import for_topology
    from mininet_topos import builders
    monkeypatch.delenv(config.CONFIG_ENV, raising=False)
    monkeypatch.delenv(config.TOPOLOGY_ENV, raising=False)
    builders.fattree(4).save(tmp_path / "t.json")
    loaded = for_topology(tmp_path / "t.json")
    try:
        config.set_active(loaded)
        assert config.active() is loaded
    finally:
        config.set_active(None)
    with pytest.raises(RuntimeError):
        config.active()


def test_an_overlay_deleting_a_tenant_the_file_lacks_changes_nothing():
    from controller.config import apply_overlay
    data = {"fabric": {"topology": "t.json"}, "tenants": {"a": {"vms": {}}}}
    assert apply_overlay(data, {"tenants": {"ghost": None}}) == data
    assert apply_overlay(data, {"tenants": {"a": None}})["tenants"] == {}


def test_paths_of_a_configuration_from_no_file_stay_as_given(tmp_path):
    from controller.config import from_data
    from mininet_topos import builders
    builders.fattree(4).save(tmp_path / "t.json")
    loaded = from_data({"fabric": {"topology": str(tmp_path / "t.json")}}, base=tmp_path)
    assert loaded.path is None
    assert loaded.resolve("rel/x.key") == Path("rel/x.key") and loaded.resolve("/abs/x") == Path("/abs/x")
    assert loaded.resolve(None) is None


def test_a_configuration_without_an_api_keeps_the_operators_mapping_as_raw(tmp_path):
    data = copy.deepcopy(BASE)
    data.pop("api")
    d = tmp_path / "etc"
    d.mkdir()
    shutil.copy(ROOT / "examples" / "fattree4.json", d / "topo.json")
    data["fabric"]["topology"] = "topo.json"
    (d / "c.yaml").write_text(yaml.safe_dump(data))
    loaded = config.load(d / "c.yaml")
    assert loaded.raw == data and loaded.raw != loaded.cfg.model_dump(mode="json")


def test_without_the_overlay_the_api_state_is_not_read(tmp_path):
    path = _beside(tmp_path)
    extra = {"tenants": {"extra": {"vms": {"x1": {"host": "h4", "guarantee_mbps": 1}}}}}
    config.write_private(path.parent / "state.yaml", "# API state\n", extra)
    assert "extra" in config.load(path).cfg.tenants
    plain = config.load(path, overlay=False)
    assert "extra" not in plain.cfg.tenants and not plain.overlay


def test_a_start_keeps_every_api_tenant_that_fits_and_sets_aside_the_rest(tmp_path):
    path = _beside(tmp_path)
    fits = lambda h: {"vms": {f"{h}v": {"host": h, "guarantee_mbps": 1}}}      # noqa: E731
    state = {"tenants": {"a1": fits("h4"), "b1": fits("h8"), "c1": {"vms": {"x": {"host": "nowhere",
                                                                                   "guarantee_mbps": 1}}}}}
    config.write_private(path.parent / "state.yaml", "# API state\n", state)
    loaded = config.load(path, salvage=True)
    assert {"a1", "b1"} <= set(loaded.cfg.tenants) and "c1" not in loaded.cfg.tenants
    assert loaded.set_aside.tenants == {"c1": state["tenants"]["c1"]}
    assert loaded.set_aside.problems and all(p.startswith("tenants.c1: ") for p in loaded.set_aside.problems)
    only_bad = {"tenants": {"c1": state["tenants"]["c1"]}}
    config.write_private(path.parent / "state.yaml", "# API state\n", only_bad)
    loaded = config.load(path, salvage=True)
    assert loaded.path == path and "c1" not in loaded.cfg.tenants
    assert loaded.set_aside.tenants == only_bad["tenants"] and loaded.set_aside.problems


def test_a_configuration_file_with_bad_yaml_is_refused_naming_its_path(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("fabric: [unclosed\n")
    with pytest.raises(config.ConfigError) as exc:
        config.load(p)
    assert str(p) in str(exc.value) and "None" not in str(exc.value)


def test_every_vm_on_an_unknown_host_is_named_not_only_the_first():
    data = copy.deepcopy(BASE)
    data["fabric"]["topology"] = str(ROOT / "examples" / "fattree4.json")
    data["tenants"]["zz"] = {"vms": {"v1": {"host": "nowhere", "guarantee_mbps": 1},
                                     "v2": {"host": "elsewhere", "guarantee_mbps": 1}}}
    with pytest.raises(config.ConfigError) as exc:
        config.from_data(data)
    text = str(exc.value)
    assert "tenants.zz.vms.v1.host: 'nowhere'" in text and "tenants.zz.vms.v2.host: 'elsewhere'" in text


def test_a_vm_on_a_host_without_an_agent_is_named_by_its_place():
    data = copy.deepcopy(BASE)
    data["fabric"]["topology"] = str(ROOT / "examples" / "fattree4.json")
    data["agents"] = {"hosts": {}, "master_key_file": "/etc/bwfabric/master.key"}
    data["tenants"] = {"t": {"vms": {"v": {"host": "h4", "guarantee_mbps": 1}}}}
    with pytest.raises(config.ConfigError) as exc:
        config.from_data(data)
    assert exc.value.problems == ["tenants.t.vms.v.host: host h4 has no agent (add agents.hosts.h4 or "
                                  "agents.address_template)"]
