"""Structure rules from the design: algorithms never import the OpenFlow
framework; os-ken event handlers stay thin."""

import ast
import inspect
from pathlib import Path

import apps.lessor.app as lessor_app
import apps.prio_queues.app as prio_app
import apps.routing.app as routing_app
import controller.app_base as app_base

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["controller", "apps", "mininet_topos", "experiments", "hostagent", "bwfabric"]
# Adapters: the only modules allowed to touch os-ken/Ryu.
ADAPTERS = {"controller/sdn.py", "controller/launcher.py", "controller/app_base.py",
            "apps/routing/app.py", "apps/routing/single_path.py", "apps/routing/ecmp.py",
            "apps/lessor/app.py", "apps/lessor/hedera_app.py", "apps/prio_queues/app.py"}
FRAMEWORK = ("os_ken", "ryu", "controller.sdn", "controller.app_base")


def _imports(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def test_no_algorithm_module_imports_the_framework():
    offenders = []
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            if rel in ADAPTERS:
                continue
            bad = [m for m in _imports(path) if m.split(".")[0] in ("os_ken", "ryu") or m in FRAMEWORK]
            if bad:
                offenders.append(f"{rel}: {bad}")
    assert offenders == []


def test_event_handlers_are_thin():
    checked = 0
    for module in (routing_app, app_base, lessor_app, prio_app):
        for _, cls in inspect.getmembers(module, inspect.isclass):
            for name, fn in inspect.getmembers(cls, inspect.isfunction):
                if hasattr(fn, "callers"):  # decorated with set_ev_cls
                    body = [ln for ln in inspect.getsource(fn).splitlines()[2:] if ln.strip()]
                    assert len(body) <= 6, f"{cls.__name__}.{name} has {len(body)} lines"
                    checked += 1
    assert checked >= 7  # ForwardingApp: 4 handlers; lessor: 3 of its own


def test_production_code_never_imports_the_emulation_packages():
    """The controller, the apps and the host agent run on real controller
    nodes and hosts: nothing of theirs may import the emulation side
    (mininet_topos, experiments) -- PMPT's warm-up used to build a Mininet
    fat-tree."""
    offenders = []
    for pkg in ("controller", "apps", "hostagent"):
        for path in (ROOT / pkg).rglob("*.py"):
            bad = [m for m in _imports(path) if m.split(".")[0] in ("mininet_topos", "experiments", "mininet")]
            if bad:
                offenders.append(f"{path.relative_to(ROOT).as_posix()}: {bad}")
    assert offenders == []
