import os
import shutil

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
