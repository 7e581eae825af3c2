"""bwfabric.sh sets up per command (issue #33): the agent's commands get
the agent's Debian packages and no extra, the controller's the controller
extra, the emulation (experiment, simulate, test) everything. Read from the
script itself: its role table and package lists, evaluated by bash."""

import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bwfabric.sh"


def _bash(snippet: str) -> str:
    text = SCRIPT.read_text()
    start = text.index("APT_AGENT=(")
    end = text.index("setup() {")
    return subprocess.run(["bash", "-c", text[start:end] + snippet], capture_output=True, text=True,
                          check=True).stdout.split()


@pytest.mark.parametrize("command, role", [
    ("agent", "agent"), ("agent-key", "agent"), ("status", "agent"), ("tenants", "agent"), ("reload", "agent"),
    ("controller", "controller"), ("check-config", "controller"), ("topology", "controller"),
    ("config-reference", "controller"),
    ("experiment", "emulation"), ("simulate", "emulation"), ("test", "emulation")])
def test_each_command_has_its_role(command, role):
    assert _bash(f"role_of {command}") == [role]


def test_the_agent_and_controller_get_no_emulator():
    agent, controller, emulation = (set(_bash(f'echo "${{{n}[@]}}"')) for n in ("APT_AGENT", "APT_CONTROLLER",
                                                                                 "APT_EMULATION"))
    emulator = {"openvswitch-switch", "mininet", "iperf3", "tcpdump", "qemu-system-x86"}
    assert not agent & emulator and not controller & emulator
    assert {"nftables", "clang", "bpftool", "iproute2"} <= agent          # what the agent runs and compiles with
    assert controller == {"python3-venv", "python3-pip"}
    assert agent | {"openvswitch-switch", "mininet", "iperf3"} <= emulation


def test_each_role_installs_its_extra():
    text = SCRIPT.read_text()
    assert 'agent) apt=("${APT_AGENT[@]}"); extra="" ;;' in text
    assert 'controller) apt=("${APT_CONTROLLER[@]}"); extra="[controller]" ;;' in text
    assert 'pip install -q --disable-pip-version-check -c requirements.txt -e ".$extra"' in text
    assert 'setup "$(role_of "$cmd")"' in text
