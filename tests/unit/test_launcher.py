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
