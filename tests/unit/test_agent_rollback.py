"""The agent daemon's promise after a failed apply: the previous
configuration back in force (verified), or nothing for a first one, or
``degraded`` -- never a silent mix. The executor is injected; here it
records what it is asked and fails where the test says."""

from pathlib import Path

import pytest

from hostagent.agent import Agent
from hostagent.executor import ExecError
from hostagent.plan import HostConfig
from bwtesting.executors import RecordingExecutor

BASE = dict(host="h1", interface="h1-eth0", address="10.0.0.1", nic_mbps=100, guarantee_mbps=10)


class FailingExecutor(RecordingExecutor):
    def __init__(self):
        super().__init__()
        self.fail_next = 0          # how many of the next applies fail
        self.left: list[str] = []   # what differences() reports after them

    def apply(self, plan) -> int:
        if self.fail_next:
            self.fail_next -= 1
            raise ExecError("tc: RTNETLINK answers: No buffer space available")
        return super().apply(plan)

    def differences(self, plan) -> list[str]:
        return list(self.left)


def agent(tmp_path: Path) -> tuple[Agent, FailingExecutor]:
    ex = FailingExecutor()
    return Agent("h1", b"k" * 32, tmp_path / "state", executor=ex), ex


def test_a_failed_apply_puts_the_previous_configuration_back(tmp_path):
    a, ex = agent(tmp_path)
    first = HostConfig.from_dict(BASE)
    a.put_in_force(first, None)
    ex.fail_next = 1
    with pytest.raises(ExecError, match="the previous one is in force \\(verified\\)"):
        a.put_in_force(HostConfig.from_dict({**BASE, "guarantee_mbps": 20}), None)
    assert a.vm().config == first and a.vm().degraded is None
    # the rollback applied the first configuration's plan again: same steps as its first apply
    assert len(ex.applied) == 2 and ex.applied[1] == ex.applied[0]


def test_a_failed_first_configuration_leaves_nothing(tmp_path):
    a, ex = agent(tmp_path)
    ex.fail_next = 1
    with pytest.raises(ExecError, match="nothing is in force \\(verified\\)"):
        a.put_in_force(HostConfig.from_dict(BASE), None)
    assert a.vm().config is None and ex.torn_down == 1


def test_a_failed_rollback_is_reported_as_degraded(tmp_path):
    a, ex = agent(tmp_path)
    a.put_in_force(HostConfig.from_dict(BASE), None)
    ex.fail_next = 2            # the new one and the way back both fail
    with pytest.raises(ExecError, match="degraded"):
        a.put_in_force(HostConfig.from_dict({**BASE, "guarantee_mbps": 20}), None)
    assert a.vm().config is None and a.vm().degraded and not a.status()["in_force"]


def test_a_rollback_the_kernel_does_not_confirm_is_degraded(tmp_path):
    a, ex = agent(tmp_path)
    a.put_in_force(HostConfig.from_dict(BASE), None)
    ex.fail_next, ex.left = 1, ["class 1:10: rate 20000000 (want 10000000)"]
    with pytest.raises(ExecError, match="kernel differs after the rollback"):
        a.put_in_force(HostConfig.from_dict({**BASE, "guarantee_mbps": 20}), None)
    assert a.vm().degraded
