"""The agent's ESE round: a closer for the VM's address, kept across rounds
(a new closer drops the entries it finds as stale, so one made every round
would drop every marked subflow before it could be destroyed), and only
for a VM whose tenant runs MPTCP-D."""

from hostagent import ese
from hostagent.agent import Agent
from hostagent.plan import HostConfig
from bwtesting.executors import RecordingExecutor

BASE = dict(host="h1", interface="h1-eth0", address="10.0.0.1", nic_mbps=100, guarantee_mbps=10)


class CountingCloser:
    made: list = []

    def __init__(self, addresses):
        self.addresses, self.rounds, self.closed, self.failed = list(addresses), 0, [], 0
        CountingCloser.made.append(self)

    def round(self):
        self.rounds += 1
        return []


def test_one_closer_per_address_kept_across_rounds(tmp_path, monkeypatch):
    monkeypatch.setattr(ese, "EseCloser", CountingCloser)
    CountingCloser.made = []
    a = Agent("h1", b"k" * 32, tmp_path / "state", executor=RecordingExecutor())
    assert a.ese_round() == "idle" and CountingCloser.made == []            # no configuration
    a.put_in_force(HostConfig.from_dict({**BASE, "mptcp_cc": "lia"}), None)
    assert a.ese_round() == "idle" and CountingCloser.made == []            # not MPTCP-D
    a.put_in_force(HostConfig.from_dict({**BASE, "mptcp_cc": "mptcp_d"}), None)
    for _ in range(5):
        a.ese_round()
    assert len(CountingCloser.made) == 1 and CountingCloser.made[0].rounds == 5
    assert CountingCloser.made[0].addresses == ["10.0.0.1"]
    a.put_in_force(HostConfig.from_dict({**BASE, "mptcp_cc": "mptcp_d", "address": "10.0.0.2"}), None)
    a.ese_round()
    assert [c.addresses for c in CountingCloser.made] == [["10.0.0.1"], ["10.0.0.2"]]
    assert a.status()["ese"]["closed"] == 0
