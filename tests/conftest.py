"""Hypothesis: developers' runs explore new examples every time; CI (CI=true)
runs a fixed, derandomized set, so that a landing is judged on reproducible
examples (a failure found while developing is fixed, then stays covered)."""

import os

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture
def app_config(tmp_path, monkeypatch):
    """Write a bwfabric configuration for apps started in the test (they
    read BWFABRIC_CONFIG): ``app_config(topo, routing="lessor", lessor={...})``."""
    import yaml

    from controller import runtime

    runtime.stop()       # no launcher's configuration from an earlier test

    def write(topo, **sections):
        topo.save(tmp_path / "topology.json")
        data = {"fabric": {"topology": str(tmp_path / "topology.json")}}
        controller = sections.pop("controller", {})
        if "routing" in sections:
            controller["routing"] = sections.pop("routing")
        data["controller"] = controller
        data.update(sections)
        path = tmp_path / "bwfabric.yaml"
        path.write_text(yaml.safe_dump(data))
        monkeypatch.setenv("BWFABRIC_CONFIG", str(path))
        return path
    yield write
    runtime.stop()
