"""The layers of the source tree (docs/architecture.md), checked on every
import statement of every module, at any depth (an import inside a function
is still a dependency):

    bwcommon                      shared lower layer: imports nothing of ours
    hostagent                     the agent: bwcommon only
    apps.<app>.settings           an app's configuration model: bwcommon only
    controller                    bwcommon and the apps' settings (apps load by name)
    apps                          bwcommon, controller, apps
    bwfabric.client               the API's client: bwcommon only
    bwtesting                     fakes and references: the product layers
    mininet_topos                 emulation: the product layers
    experiments                   + bwtesting, mininet_topos, bwfabric.client
    benchmarks                    + experiments
    bwfabric.cli                  the command: anything

The product (bwcommon, hostagent, controller, apps, bwfabric.client) never
imports a fake, a reference, the emulation, an experiment or a benchmark.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = ("bwcommon", "hostagent", "controller", "apps", "bwfabric", "bwtesting", "mininet_topos", "experiments",
        "benchmarks")
PRODUCT = ("bwcommon", "hostagent", "apps", "controller", "bwfabric.client")
# the layer of a module: the longest rule name that is a prefix of it
ALLOWED = {
    "bwcommon": ("bwcommon",),
    "hostagent": ("bwcommon", "hostagent"),
    "apps.*.settings": ("bwcommon",),
    "controller": ("bwcommon", "controller", "apps.*.settings"),
    "apps": ("bwcommon", "controller", "apps"),
    "bwfabric.client": ("bwcommon",),
    "bwtesting": PRODUCT + ("bwtesting",),
    "mininet_topos": PRODUCT + ("mininet_topos",),
    "experiments": PRODUCT + ("bwtesting", "mininet_topos", "experiments"),
    "benchmarks": PRODUCT + ("bwtesting", "mininet_topos", "experiments", "benchmarks"),
    "bwfabric": OURS,                       # bwfabric.cli: the command dispatches to every role, lazily
    "tests": OURS,
}


def _matches(module: str, rule: str) -> bool:
    """``module`` is ``rule`` or inside it; ``*`` stands for one name."""
    parts, want = module.split("."), rule.split(".")
    return len(parts) >= len(want) and all(w in ("*", p) for w, p in zip(want, parts))


def layer_of(module: str) -> str | None:
    rules = [r for r in ALLOWED if _matches(module, r)]
    return max(rules, key=lambda r: len(r.split("."))) if rules else None


def allowed(importer: str, imported: str) -> bool:
    if imported.split(".")[0] not in OURS:
        return True                          # the standard library and third-party packages
    layer = layer_of(importer)
    assert layer is not None, importer
    return any(_matches(imported, rule) or rule.startswith(imported + ".") for rule in ALLOWED[layer])


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports (absolute, or relative made absolute),
    with its line: ``from a.b import c`` names ``a.b.c`` (c may be a module)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    me = module_name(path).split(".")
    package = me if path.name == "__init__.py" else me[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            out += [(node.lineno, f"{base}.{a.name}" if a.name != "*" else base) for a in node.names]
    return out


def sources(packages=OURS) -> list[Path]:
    return sorted(p for pkg in packages for p in (ROOT / pkg).rglob("*.py") if "__pycache__" not in p.parts)


def violations(paths) -> list[str]:
    out = []
    for path in paths:
        importer = module_name(path)
        for line, imported in imports(path):
            if not allowed(importer, imported):
                out.append(f"{path.relative_to(ROOT)}:{line}: {importer} ({layer_of(importer)}) imports {imported}")
    return out


def test_every_import_keeps_to_its_layer():
    assert violations(sources()) == []


def test_every_package_has_a_layer():
    for path in sources():
        assert layer_of(module_name(path)) is not None, path


@pytest.mark.parametrize("importer, imported, ok", [
    ("bwcommon.channel", "bwcommon.validate", True),
    ("bwcommon.channel", "controller.config", False),
    ("bwcommon.hostconfig", "hostagent.plan", False),
    ("hostagent.plan", "bwcommon.hostconfig", True),
    ("hostagent.plan", "controller.contract", False),
    ("hostagent.lrc", "apps.lrc.logic", False),
    ("controller.config", "apps.lessor.settings.Lessor", True),
    ("controller.config", "apps.lessor.pmpt", False),
    ("controller.agent_sessions", "hostagent.plan", False),
    ("controller.api", "bwtesting.fakenet", False),
    ("apps.lessor.settings", "controller.validate", False),
    ("apps.lessor.settings", "bwcommon.validate.StrictModel", True),
    ("apps.lessor.logic", "controller.ofmsg", True),
    ("apps.lessor.logic", "hostagent.plan", False),
    ("apps.lessor.logic", "experiments.maxmin", False),
    ("bwfabric.client", "controller.config", False),
    ("bwtesting.fakenet", "controller.ofmsg", True),
    ("mininet_topos.topos", "controller.topology", True),
    ("mininet_topos.topos", "experiments.fabric", False),
    ("experiments.product", "benchmarks.delayline", False),
    ("experiments.product", "bwfabric.client", True),
    ("experiments.product", "bwfabric.cli", False),
    ("benchmarks.delayline", "experiments.fabric", True),
    ("bwfabric.cli", "experiments", True),
    ("controller", "os_ken.base", True),
])
def test_the_rules(importer, imported, ok):
    assert allowed(importer, imported) is ok


def test_a_violation_is_found_with_its_line(tmp_path, monkeypatch):
    """The checker itself: a module of the agent that imports the controller
    (even inside a function, even relatively) is reported at its line."""
    pkg = tmp_path / "hostagent"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "bad.py").write_text("import os\n\ndef f():\n    from controller import config\n    from . import plan\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    found = violations([pkg / "bad.py"])
    assert found == ["hostagent/bad.py:4: hostagent.bad (hostagent) imports controller.config"]


# what the agent's installation holds (pyproject.toml's dependencies; docs/deploy.md): its layers import
# no third-party package but these -- nothing of os-ken, numpy, numba, matplotlib, HiGHS
AGENT_LAYERS = ("bwcommon", "hostagent", "bwfabric.client")
AGENT_THIRD_PARTY = {"pydantic", "pyroute2", "yaml"}
OS_KEN = {"os_ken", "ryu", "eventlet"}
OS_KEN_ADAPTERS = {"controller.sdn", "controller.launcher"}   # every app reaches os-ken through controller.sdn


def third_party(path: Path) -> set[str]:
    return {m.split(".")[0] for _, m in imports(path)} - set(sys.stdlib_module_names) - set(OURS)


def test_the_agent_needs_only_its_own_dependencies():
    found = {module_name(p): third_party(p) - AGENT_THIRD_PARTY for p in sources(("bwcommon", "hostagent"))}
    found["bwfabric.client"] = third_party(ROOT / "bwfabric" / "client.py") - AGENT_THIRD_PARTY
    assert {m: sorted(t) for m, t in found.items() if t} == {}


def test_only_the_adapters_import_os_ken():
    found = [module_name(p) for p in sources(("bwcommon", "hostagent", "controller", "apps", "bwfabric"))
             if third_party(p) & OS_KEN]
    assert sorted(found) == sorted(OS_KEN_ADAPTERS)
    assert all(layer_of(m) in ("controller",) for m in found)


def test_the_install_declares_what_the_agent_imports():
    """pyproject.toml's base requirements are the agent's: every one of them
    is a package the agent layers import (by its import name), and no more;
    the heavy stacks are extras."""
    import re
    import tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    import_names = {"pydantic": "pydantic", "pyroute2": "pyroute2", "PyYAML": "yaml"}
    base = {re.split(r"[<>=!~\[ ]", r, maxsplit=1)[0] for r in project["dependencies"]}
    assert {import_names.get(name, name) for name in base} == AGENT_THIRD_PARTY
    extras = project["optional-dependencies"]
    assert any(r.startswith("os-ken") for r in extras["controller"])
    assert not any(r.startswith(("matplotlib", "PuLP", "highspy")) for r in extras["controller"])
