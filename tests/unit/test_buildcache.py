"""Where compiled artefacts go: a checkout's build/, else the machine's
cache -- never an installed package's directory."""

from pathlib import Path

import pytest

from bwcommon.buildcache import ENV, SYSTEM, build_dir


def test_a_checkout_builds_in_its_own_build_dir(tmp_path):
    (tmp_path / "pyproject.toml").write_text("")
    assert build_dir("bpf", env={}, tree=tmp_path) == tmp_path / "build" / "bpf"


def test_an_installed_package_builds_in_the_machine_cache(tmp_path):
    assert build_dir("bpf", env={}, tree=tmp_path) == SYSTEM / "bpf" == Path("/var/cache/bwfabric/bpf")


def test_the_environment_overrides_both(tmp_path):
    (tmp_path / "pyproject.toml").write_text("")
    assert build_dir("delayline", env={ENV: "/srv/b"}, tree=tmp_path) == Path("/srv/b/delayline")
    assert build_dir("delayline", env={ENV: ""}, tree=tmp_path) == tmp_path / "build" / "delayline"


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "/x"])
def test_one_path_component_only(bad, tmp_path):
    with pytest.raises(ValueError, match="one path component"):
        build_dir(bad, env={}, tree=tmp_path)
