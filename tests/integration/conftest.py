import os
import shutil
import subprocess

import pytest


def pytest_collection_modifyitems(config, items):
    missing = []
    if os.geteuid() != 0:
        missing.append("root")
    for tool in ("ovs-vsctl", "mnexec", "iperf3"):
        if shutil.which(tool) is None:
            missing.append(tool)
    if missing and not os.environ.get("BWFABRIC_REQUIRE_INTEGRATION"):
        skip = pytest.mark.skip(reason=f"integration tests need {', '.join(missing)}")
        for item in items:
            if "root" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def netns():
    """A namespace of the test's own with ag0 (10.9.0.1/24) and ag1 up."""
    from benchmarks.agent_faults import make_netns
    name = make_netns()
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=True)
