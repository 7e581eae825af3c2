"""Hypothesis: developers' runs explore new examples every time; CI (CI=true)
runs a fixed, derandomized set, so that a landing is judged on reproducible
examples (a failure found while developing is fixed, then stays covered).
Neither has a deadline: Hypothesis's default (200 ms per example, wall
clock) is a race the machine's load decides -- test_params_refuse_by_name
took 719 ms beside two simulations and a mutation pass and failed,
asserting nothing about the code."""

import os

import pytest
from hypothesis import settings

settings.register_profile("dev", deadline=None)
settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


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
