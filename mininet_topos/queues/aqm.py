"""Random early drop for the WC queue of the tc back-end (``bwf_aqm``, a
tc egress BPF classifier; see bwf_aqm.bpf.c beside this file for why).

This kernel has no red qdisc, so the drop decision is made before the HTB
tree, against a virtual queue that drains at the port rate: WC packets are
dropped -- or, if ECN-capable, marked CE -- with a probability rising
from 0 at ``min`` to ``max_p`` at ``max`` (gentle: to 1 at 2 x ``max``);
BG packets pass. One program is
loaded per machine and pinned; every port gets its own entry (key: ifindex)
in the pinned map ``bwf_aqm_ports``.

    owned = load()                      # once (idempotent); True: none was pinned before
    attach("sl-eth5", 100e6, AqmParams.for_queue(225000))
    stats("sl-eth5")                    # {"wc_seen": .., "wc_dropped": .., "wc_marked": ..}
    unload()                            # unpins (ports keep nothing once deleted)
"""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path
from dataclasses import dataclass

from hostagent import cc

SOURCE = Path(__file__).with_name("bwf_aqm.bpf.c")
PIN_PROG = cc.BPFFS / "bwf_aqm"
PIN_MAPS = cc.BPFFS / "aqm"
MAP = PIN_MAPS / "bwf_aqm_ports"
# struct aqm_port: lock(4) pad(4) rate u64, min u32, max u32, max_p_ppm u32, flags u32, vq, last, seen, dropped,
# marked u64
_VALUE = struct.Struct("<I4xQIIII5Q")


class AqmError(RuntimeError):
    pass


EVERY_CLASS = 1      # bwf_aqm.bpf.c's AQM_EVERY_CLASS


@dataclass(frozen=True)
class AqmParams:
    min_bytes: int
    max_bytes: int
    max_p: float
    # every IPv4 packet of 128 bytes or more meets the early drop, not only WC's (ACKs never):
    # for fabrics without BG/WC classes
    every_class: bool = False

    def __post_init__(self):
        if not 0 < self.min_bytes < self.max_bytes or not 0 < self.max_p <= 1:
            raise AqmError(f"AQM: need 0 < min ({self.min_bytes}) < max ({self.max_bytes}) and 0 < max_p "
                           f"({self.max_p}) <= 1")
        if not isinstance(self.every_class, bool):
            raise AqmError(f"AQM: every_class must be true or false, not {self.every_class!r}")

    @classmethod
    def for_queue(cls, queue_bytes: int, max_p: float = 0.1, every_class: bool = False) -> "AqmParams":
        """Thresholds at 1/3 and 2/3 of a FIFO of ``queue_bytes``: marks
        and drops start well before the tail drops, and late enough that a
        lone flow halving its window still keeps the port busy (at RED's
        usual 1/6 and 1/2 a lone WC subflow left 20 % of the link idle:
        bgwc-sched 0.80 vs 0.91 used)."""
        return cls(max(3000, queue_bytes // 3), max(6000, 2 * queue_bytes // 3), max_p, every_class)


def _run(cmd: list[str]) -> str:
    try:
        return cc._run(cmd)
    except cc.CcError as exc:
        raise AqmError(str(exc)) from None


def loaded() -> bool:
    return PIN_PROG.exists() and MAP.exists()


def _stale() -> bool:
    """A program pinned by an older bwfabric whose map entries have another layout."""
    import json
    try:
        info = json.loads(_run(["bpftool", "-j", "map", "show", "pinned", str(MAP)]))
    except AqmError:
        return True
    return info.get("bytes_value") != _VALUE.size


STAMP = cc.BPFFS.parent / "aqm.build"    # beside the bpffs (it holds only BPF objects)


def load() -> bool:
    """Idempotent: loads and pins the classifier unless the one pinned is of
    this very build (its object's hash) with this map layout. True when none
    was pinned before: the caller owns it and unloads it when done."""
    was = loaded()
    obj = cc.build({"bwf_aqm": SOURCE})["bwf_aqm"]
    stamp = cc.build_stamp(obj)
    if was and not _stale() and STAMP.exists() and STAMP.read_text() == stamp:
        return False
    unload()
    cc._mount_bpffs()
    PIN_MAPS.mkdir(parents=True, exist_ok=True)
    _run(["bpftool", "prog", "load", str(obj), str(PIN_PROG), "type", "classifier", "pinmaps", str(PIN_MAPS)])
    STAMP.write_text(stamp)
    return not was


def unload() -> None:
    for p in (PIN_PROG, MAP, STAMP):
        if p.exists():
            p.unlink()
    if PIN_MAPS.exists() and not any(PIN_MAPS.iterdir()):
        PIN_MAPS.rmdir()


def _ns(netns: str | None) -> list[str]:
    return ["ip", "netns", "exec", netns] if netns else []


def _ifindex(dev: str, netns: str | None = None) -> int:
    import json
    res = subprocess.run([*_ns(netns), "ip", "-j", "link", "show", "dev", dev], capture_output=True, text=True)
    if res.returncode != 0:
        raise AqmError(f"AQM: no interface {dev!r}{f' in {netns}' if netns else ''}")
    return int(json.loads(res.stdout)[0]["ifindex"])


def _hex(data: bytes) -> list[str]:
    return [f"{b:02x}" for b in data]


def attach(dev: str, rate_bps: float, params: AqmParams, netns: str | None = None) -> None:
    """Port ``dev`` (of network namespace ``netns``, default ours) gets the
    classifier on egress and its map entry. Interface indexes are per
    namespace: ports of different namespaces may share an entry."""
    if not loaded():
        raise AqmError("AQM: not loaded (mininet_topos.queues.aqm.load())")
    key = struct.pack("<I", _ifindex(dev, netns))
    value = _VALUE.pack(0, int(rate_bps), params.min_bytes, params.max_bytes, int(params.max_p * 1e6),
                        EVERY_CLASS if params.every_class else 0, 0, 0, 0, 0, 0)
    _run(["bpftool", "map", "update", "pinned", str(MAP), "key", "hex", *_hex(key), "value", "hex", *_hex(value)])
    _run([*_ns(netns), "tc", "qdisc", "replace", "dev", dev, "clsact"])
    _run([*_ns(netns), "tc", "filter", "replace", "dev", dev, "egress", "pref", "1", "handle", "1", "bpf", "da",
          "object-pinned", str(PIN_PROG)])


def stats(dev: str, netns: str | None = None) -> dict[str, int]:
    import json
    key = struct.pack("<I", _ifindex(dev, netns))
    out = json.loads(_run(["bpftool", "-j", "map", "lookup", "pinned", str(MAP), "key", "hex", *_hex(key)]))
    raw = bytes(int(b, 16) for b in out["value"]) if isinstance(out.get("value"), list) else None
    if raw is None:     # BTF-formatted output
        v = out.get("formatted", {}).get("value", out.get("value", {}))
        return {"wc_seen": int(v["wc_seen"]), "wc_dropped": int(v["wc_dropped"]), "wc_marked": int(v["wc_marked"])}
    fields = _VALUE.unpack(raw)
    return {"wc_seen": fields[8], "wc_dropped": fields[9], "wc_marked": fields[10]}
