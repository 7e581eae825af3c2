"""controller.ha's election against a real etcd (Debian's etcd-server, a
process of the test's own on free ports): one leader at a time, a standby
takes over when the leader's lease expires or it resigns, every new
leader's generation is above every earlier one, and a leader cut off from
etcd steps down before etcd lets anyone else lead."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from controller.ha import GENERATION_BASE, LEADER, STANDBY, Election
from experiments.etcdproc import EtcdProcess

KEY = "/bwfabric/test/leader"


@pytest.fixture
def etcd(tmp_path):
    with EtcdProcess(tmp_path / "etcd") as e:
        yield e


class Proxy:
    """A TCP forwarder to etcd that can be cut (every connection closed,
    new ones refused) and healed: a partition of one controller from etcd."""

    def __init__(self, port: int):
        self.target = port
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.port = self.srv.getsockname()[1]
        self.cut = False
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            if self.cut:
                c.close()
                continue
            try:
                u = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                c.close()
                continue
            self.conns += [c, u]
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a, b):
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.close()
                except OSError:
                    pass

    def partition(self):
        self.cut = True
        for s in self.conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.conns = []

    def heal(self):
        self.cut = False

    def close(self):
        self.srv.close()
        self.partition()


def _client(port):
    from etcd3gw.client import Etcd3Client
    return Etcd3Client(host="127.0.0.1", port=port, timeout=1)


def _until(cond, timeout_s, step=0.05):
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout_s, f"not within {timeout_s} s"
        time.sleep(step)
    return time.monotonic() - t0


def test_one_leader_a_standby_takes_over_when_its_lease_expires_with_a_higher_generation(etcd):
    changes = []
    a = Election(etcd.client(), KEY, "ctl-a", ttl_s=2, on_change=lambda r, g: changes.append(("a", r, g)))
    b = Election(etcd.client(), KEY, "ctl-b", ttl_s=2, on_change=lambda r, g: changes.append(("b", r, g)))
    a.step()
    b.step()
    assert (a.role, b.role) == (LEADER, STANDBY) and b.leader == "ctl-a"
    # b, a standby, was told the leader's generation (its SLAVE role requests carry it)
    assert a.generation > GENERATION_BASE and changes == [("a", LEADER, a.generation), ("b", STANDBY, a.generation)]
    assert b.leader_generation == a.generation
    first = a.generation
    for _ in range(10):                  # a renews, b keeps polling: nothing changes
        a.step()
        b.step()
        time.sleep(0.1)
    assert (a.role, b.role) == (LEADER, STANDBY)
    # a dies (it renews no more): its lease expires in etcd, b leads
    died = time.monotonic()

    def b_leads():
        b.step()
        return b.role == LEADER
    took = _until(b_leads, 6)
    print(f"standby led {time.monotonic() - died:.2f} s after the leader's last renewal (ttl 2 s)")
    assert b.generation > first and b.leader == "ctl-b"
    assert took >= 1.0                   # not before the lease could expire
    # a comes back: its lease is gone, it steps down and stays a standby
    a.step()
    assert a.role == STANDBY and a.generation is None and ("a", STANDBY, None) in changes
    a.step()
    assert a.role == STANDBY and a.leader == "ctl-b"


def test_a_leader_that_resigns_hands_over_at_once(etcd):
    a = Election(etcd.client(), KEY, "ctl-a", ttl_s=5)
    b = Election(etcd.client(), KEY, "ctl-b", ttl_s=5)
    a.step()
    b.step()
    assert a.role == LEADER
    a.resign()
    assert a.role == STANDBY and a.stopped
    b.step()
    assert b.role == LEADER and b.generation > GENERATION_BASE


def test_generations_grow_over_many_handovers(etcd):
    gens = []
    for i in range(5):
        e = Election(etcd.client(), KEY, f"ctl-{i}", ttl_s=5)
        e.step()
        assert e.role == LEADER
        gens.append(e.generation)
        etcd.client().put("/bwfabric/test/other", str(i))     # other writes move the revision too
        e.resign()
    assert gens == sorted(gens) and len(set(gens)) == 5


def test_a_leader_cut_off_from_etcd_steps_down_before_anyone_else_can_lead(etcd):
    proxy = Proxy(etcd.client_port)
    try:
        times = {}
        a = Election(_client(proxy.port), KEY, "ctl-a", ttl_s=2,
                     on_change=lambda r, g: times.setdefault(("a", r), time.monotonic()))
        b = Election(etcd.client(), KEY, "ctl-b", ttl_s=2,
                     on_change=lambda r, g: times.setdefault(("b", r), time.monotonic()))
        a.step()
        assert a.role == LEADER
        stop = threading.Event()

        def loop(e):
            while not stop.is_set():
                time.sleep(e.step())
        threads = [threading.Thread(target=loop, args=(e,), daemon=True) for e in (a, b)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        proxy.partition()
        cut = time.monotonic()
        _until(lambda: b.role == LEADER, 8)
        stop.set()
        for t in threads:
            t.join(5)
        print(f"partitioned leader stepped down {times[('a', STANDBY)] - cut:.2f} s after the cut; the standby led "
              f"{times[('b', LEADER)] - cut:.2f} s after it")
        assert a.role == STANDBY and times[("a", STANDBY)] < times[("b", LEADER)]
        assert b.generation > GENERATION_BASE and a.errors > 0
        # healed: a sees b lead and stays a standby
        proxy.heal()
        a.step()
        assert a.role == STANDBY and a.leader == "ctl-b"
    finally:
        proxy.close()


def test_an_unreachable_etcd_leaves_a_standby_a_standby():
    port = socket.create_server(("127.0.0.1", 0))
    dead = port.getsockname()[1]
    port.close()
    e = Election(_client(dead), KEY, "ctl-a", ttl_s=2)
    for _ in range(3):
        assert e.step() == e.poll_s
    assert e.role == STANDBY and e.errors == 3
