"""A command whose role is not installed says which extra to install
(the agent's installation has no os-ken; the controller's no matplotlib)."""

import pytest

from bwfabric import cli


@pytest.mark.parametrize("command, extra", [("controller", "controller"), ("check-config", "controller"),
                                            ("topology", "controller"), ("experiment", "emulation"),
                                            ("simulate", "emulation")])
def test_a_missing_third_party_module_names_the_extra(command, extra):
    hint = cli.missing_extra(command, ModuleNotFoundError("No module named 'os_ken'", name="os_ken.base"))
    assert f"pip install 'bwfabric[{extra}]'" in hint and "'os_ken'" in hint and f"bwfabric {command}:" in hint


def test_the_agent_commands_name_the_base_install():
    hint = cli.missing_extra("agent", ModuleNotFoundError("No module named 'pyroute2'", name="pyroute2"))
    assert "pip install bwfabric " in hint and "agent role" in hint


@pytest.mark.parametrize("name", ["controller.config", "bwcommon", "hostagent.plan", "", None])
def test_our_own_missing_module_is_a_bug_not_a_role(name):
    assert cli.missing_extra("controller", ModuleNotFoundError("x", name=name)) is None


def test_main_prints_the_hint_and_exits_2(monkeypatch, capsys):
    def needs_os_ken(args):
        raise ModuleNotFoundError("No module named 'os_ken'", name="os_ken")
    monkeypatch.setattr(cli, "cmd_controller", needs_os_ken)
    assert cli.main(["controller", "--topology", "x.json", "--apps", "ecmp"]) == 2
    assert "bwfabric[controller]" in capsys.readouterr().err


def test_main_reraises_what_is_not_a_missing_role(monkeypatch):
    def broken(args):
        raise ModuleNotFoundError("No module named 'controller.nothing'", name="controller.nothing")
    monkeypatch.setattr(cli, "cmd_controller", broken)
    with pytest.raises(ModuleNotFoundError):
        cli.main(["controller", "--topology", "x.json", "--apps", "ecmp"])
