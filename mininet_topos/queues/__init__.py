"""Queue back-ends for the BG/WC classes on switch ports, behind one
interface: ``plan(port, rate_bps)`` says what to put in force on one port,
``apply``/``remove`` do it on the machine that runs the switch.

- ``ovsdb``: an OVSDB QoS row of type linux-htb with queue 0 (BG: priority
  0, min-rate = the port rate minus WC's floor) and queue 1 (WC: priority 1,
  min-rate = the floor, max-rate = the port rate); table 0's ``set_queue``
  picks the queue. For kernel-datapath OVS and for Pica8 (PicOS runs the same
  OVSDB schema).
- ``tc``: userspace OVS ignores ``set_queue`` (docs/platform.md), so the classes
  are built with tc on each port's egress and keyed on the ToS byte that
  table 0 has already normalised (0x00 BG, 0x20 WC; non-IP goes BG). HTB
  cannot be strictly prioritised: BG is guaranteed the port rate minus WC's
  floor and WC may borrow whatever BG leaves (HTB serves the lower prio
  first when both borrow); the smaller the floor, the stricter. With
  ``wc_aqm`` (default) WC packets also meet random early drop
  (:mod:`mininet_topos.queues.aqm`, a BPF classifier: this kernel has no red
  qdisc), so that losses fall on WC flows at random, the regime in which the
  fair-WC congestion control's shares follow A_l.

Both keep queue numbers from :mod:`apps.prio_queues.logic`.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from bwcommon.contract import QUEUE_BG, QUEUE_WC
from bwcommon.validate import finite_number
from hostagent import plan as P

WC_FLOOR_FRACTION = 0.01   # WC's guaranteed share of a port (HTB needs some rate)
BACKENDS = ("tc", "ovsdb")


class BackendError(RuntimeError):
    pass


@dataclass(frozen=True)
class PortQueues:
    port: str            # interface name of the switch port
    rate_bps: int
    queue_bytes: int     # per-class FIFO (tc back-end)
    wc_floor_bps: int

    @classmethod
    def of(cls, port: str, rate_bps: float, queue_bytes: int, wc_floor_fraction: float = WC_FLOOR_FRACTION):
        if rate_bps <= 0 or queue_bytes <= 0 or not 0 < wc_floor_fraction < 0.5:
            raise BackendError(f"port {port}: need rate > 0, queue_bytes > 0, 0 < WC floor fraction < 0.5")
        return cls(port, int(rate_bps), int(queue_bytes), max(8000, int(rate_bps * wc_floor_fraction)))


def tc_plan(q: PortQueues) -> list:
    """HTB tree on one switch port (steps of :mod:`hostagent.plan`, applied by
    its executor): 1:10 BG (prio 0), 1:20 WC (prio 1), ToS 0x20 -> WC --
    the agent's own NIC plan (:func:`hostagent.plan.nic_plan`)."""
    return P.nic_plan(q.port, q.rate_bps, q.queue_bytes, q.wc_floor_bps / q.rate_bps)


def ovsdb_plan(q: PortQueues) -> list[str]:
    """``ovs-vsctl`` arguments (one transaction) giving the port a linux-htb
    QoS with the BG and WC queues."""
    bg_min = q.rate_bps - q.wc_floor_bps
    return ["--", "set", "port", q.port, "qos=@qos",
            "--", "--id=@qos", "create", "qos", "type=linux-htb", f"other-config:max-rate={q.rate_bps}",
            f"queues:{QUEUE_BG}=@bg", f"queues:{QUEUE_WC}=@wc",
            "--", "--id=@bg", "create", "queue", f"other-config:min-rate={bg_min}",
            f"other-config:max-rate={q.rate_bps}", "other-config:priority=0",
            "--", "--id=@wc", "create", "queue", f"other-config:min-rate={q.wc_floor_bps}",
            f"other-config:max-rate={q.rate_bps}", "other-config:priority=1"]


# ACKs first on a plain port (no BG/WC classes): TCP packets shorter than
# this (IPv4 total length) -- pure ACKs, SYNs, FINs with options -- take a
# band of their own, served first. A flow whose ACKs cross a port that its
# sender's incoming data fills otherwise has that port's queue (180 ms at
# 10 Mb/s) in its round trip, and TCP's RTT unfairness starves it beside
# flows whose ACKs travel clean (issue #32 §3; docs/apps.md, "ACKs first").
ACK_MAX_IP_BYTES = 128
ACK_BAND_FRACTION = 0.01      # the ACK band's assured rate; it may borrow the whole port


def ack_first_commands(dev: str, rate_bps: int, queue_bytes: int) -> list[str]:
    """``tc`` arguments that split the leaf class 5:1 of a Mininet TCLink
    port (HTB root 5:, the link's rate; its bfifo goes) into an ACK band
    5:10 (HTB prio 0) and everything else 5:20 (prio 1), each a bfifo of
    ``queue_bytes``, both borrowing up to the link's rate. No prio qdisc on
    this kernel (docs/platform.md): HTB serves the lower prio first when
    both borrow. Filters on the root: short TCP to 5:10, the rest to 5:20."""
    if not (finite_number(rate_bps) and finite_number(queue_bytes) and rate_bps > 0 and queue_bytes > 0):
        raise BackendError(f"port {dev}: ACKs first needs a finite rate > 0 and queue_bytes > 0, "
                           f"not {rate_bps!r}, {queue_bytes!r}")
    ack = max(8000, int(rate_bps * ACK_BAND_FRACTION))
    return [f"class add dev {dev} parent 5:1 classid 5:10 htb rate {ack}bit ceil {int(rate_bps)}bit prio 0",
            f"class add dev {dev} parent 5:1 classid 5:20 htb rate {int(rate_bps) - ack}bit "
            f"ceil {int(rate_bps)}bit prio 1",
            f"qdisc add dev {dev} parent 5:10 handle 11: bfifo limit {int(queue_bytes)}",
            f"qdisc add dev {dev} parent 5:20 handle 12: bfifo limit {int(queue_bytes)}",
            # IPv4 protocol 6, total length (bytes 2-3) below ACK_MAX_IP_BYTES (a power of two)
            f"filter add dev {dev} parent 5: protocol ip prio 1 u32 match ip protocol 6 0xff "
            f"match u16 0x0000 {0xffff & ~(ACK_MAX_IP_BYTES - 1):#06x} at 2 flowid 5:10",
            f"filter add dev {dev} parent 5: protocol all prio 2 u32 match u32 0 0 flowid 5:20"]


class TcBackend:
    """One executor per port (the root namespace of the switch host)."""

    def __init__(self, wc_aqm: bool = True):
        from hostagent.executor import Executor
        self._executor = Executor
        self.ports: dict[str, object] = {}
        self.wc_aqm = wc_aqm
        self.loaded_aqm = False

    def apply(self, q: PortQueues) -> None:
        ex = self.ports.setdefault(q.port, self._executor())
        ex.apply(P.Plan(tuple(tc_plan(q))))
        if self.wc_aqm:
            from mininet_topos.queues import aqm
            # idempotent; replaces a classifier of an older build
            self.loaded_aqm = aqm.load() or self.loaded_aqm
            aqm.attach(q.port, q.rate_bps, aqm.AqmParams.for_queue(q.queue_bytes))

    def close(self) -> None:
        """Unpin the AQM program if this back-end loaded it (ports that are
        deleted take their filters with them)."""
        if self.loaded_aqm:
            from mininet_topos.queues import aqm
            aqm.unload()
            self.loaded_aqm = False

    def remove(self, port: str) -> None:
        ex = self.ports.pop(port, None)
        if ex is not None:
            ex.teardown()


class OvsdbBackend:
    def close(self) -> None:
        pass

    def apply(self, q: PortQueues) -> None:
        self.remove(q.port)
        res = subprocess.run(["ovs-vsctl", *ovsdb_plan(q)], capture_output=True, text=True)
        if res.returncode != 0:
            raise BackendError(f"ovs-vsctl QoS on {q.port}: {res.stderr.strip()}")

    def remove(self, port: str) -> None:
        """Clear the port's QoS and destroy that QoS row and its queues (only those)."""
        qos = _vsctl("get", "port", port, "qos").strip()
        if not qos or qos == "[]":
            return
        queues = _vsctl("get", "qos", qos, "queues").strip().strip("{}")
        queue_ids = [item.split("=")[1].strip() for item in queues.split(",") if "=" in item]
        _vsctl("clear", "port", port, "qos")
        _vsctl("destroy", "qos", qos, *[a for q in queue_ids for a in ("--", "destroy", "queue", q)])


def _vsctl(*args: str) -> str:
    res = subprocess.run(["ovs-vsctl", *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise BackendError(f"ovs-vsctl {' '.join(args)}: {res.stderr.strip()}")
    return res.stdout


def backend(name: str, wc_aqm: bool = True):
    if name == "tc":
        return TcBackend(wc_aqm)
    if name == "ovsdb":
        return OvsdbBackend()
    raise BackendError(f"queue back-end {name!r}: one of {', '.join(BACKENDS)}")
