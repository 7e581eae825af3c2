"""The coupled-* experiments: one module each, and one source of defaults
-- the module's Config -- for both ``bwfabric experiment coupled-KIND`` and
``python -m experiments.coupled KIND`` (they used to disagree: runs 2 vs
10, seconds 10 vs 20)."""

import dataclasses

import pytest

from experiments import coupled, registry
from experiments.options import OptionError, parse_options


@pytest.mark.parametrize("kind", list(coupled.KINDS))
def test_each_kind_is_a_module_of_its_own(kind):
    mod = coupled.module(kind)
    assert mod.KIND == kind and mod.__name__ == f"experiments.coupled.{coupled.KINDS[kind]}"
    assert callable(mod.measure) and callable(mod.run) and mod.HELP
    assert registry.EXPERIMENTS[f"coupled-{kind}"][0] is mod


@pytest.mark.parametrize("kind", list(coupled.KINDS))
def test_both_commands_take_the_configs_defaults(kind):
    mod = coupled.module(kind)
    name, cfg, png = coupled.parse([kind])
    assert (name, cfg, png) == (kind, mod.Config(), None)
    module, overrides, _ = registry.EXPERIMENTS[f"coupled-{kind}"]
    assert overrides == {} and parse_options(module.Config, []) == mod.Config()


@pytest.mark.parametrize("kind", list(coupled.KINDS))
def test_every_option_is_a_flag_and_a_key(kind):
    mod = coupled.module(kind)
    for f in dataclasses.fields(mod.Config):
        value = f.default
        if isinstance(value, bool):
            argv, want = [f"--{f.name.replace('_', '-')}"], True
        elif isinstance(value, tuple):
            argv, want = [f"--{f.name.replace('_', '-')}", "7", "9"], (7, 9)
        elif value is None or isinstance(value, float):
            argv, want = [f"--{f.name.replace('_', '-')}", "7.5"], 7.5
        elif isinstance(value, int):
            argv, want = [f"--{f.name.replace('_', '-')}", "7"], 7
        else:
            argv, want = [f"--{f.name.replace('_', '-')}", "ab"], "ab"
        _, cfg, _ = coupled.parse([kind, *argv])
        assert getattr(cfg, f.name) == want, f.name
        # every other option keeps its default
        assert {g.name: getattr(cfg, g.name) for g in dataclasses.fields(cfg) if g.name != f.name} == \
            {g.name: getattr(mod.Config(), g.name) for g in dataclasses.fields(cfg) if g.name != f.name}


def test_an_option_of_another_kind_is_refused_by_name():
    with pytest.raises(OptionError, match="runs"):
        parse_options(coupled.module("check").Config, ["runs=3"])
    with pytest.raises(SystemExit):
        coupled.parse(["check", "--runs", "3"])


def test_plot_names_only_kinds_with_a_figure():
    assert coupled.parse(["plot", "vm", "r.json", "f.png"]) == ("plot", ["vm", "r.json", "f.png"], None)
    assert coupled.module("check").draw is None
    with pytest.raises(SystemExit):
        coupled.parse(["plot", "check", "r.json", "f.png"])


def test_an_unknown_kind_is_refused_by_name():
    with pytest.raises(ValueError, match="kind 'nope'"):
        coupled.module("nope")
