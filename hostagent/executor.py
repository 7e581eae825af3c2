"""Applies a :class:`hostagent.plan.Plan` in the current network namespace
(the agent runs inside its host's namespace) -- thin, idempotent, and
always compared against what the kernel *has*, read back, never against
what this process last wrote:

- sysctl: read under /proc/sys and written only where it differs; the value
  found before the first change is persisted (before the write) so that
  ``teardown`` restores it;
- MPTCP: ``ip mptcp limits``; endpoints with our ids (ENDPOINT_ID_BASE+)
  are compared with the kernel's and only the differing ones removed/added
  (removing a signal endpoint closes the subflows that use it);
- nftables: the table is listed (``nft list table``) and, if that differs
  from the listing the planned text produced last time, replaced in one
  atomic ``nft -f`` transaction;
- tc: the HTB tree is read back (qdiscs and classes through pyroute2;
  u32 filters from ``tc filter show``, because pyroute2 0.9.7 decodes u32
  keys one word off) and converged in place, in an order that never
  leaves BG unlimited: missing classes and leaves first, then changed
  rates (``change``, no queue flushed), then new or changed filters, then
  stale filters, then stale classes. The root qdisc is replaced only when
  it is not our HTB; a structural change (hose <-> pipe, a destination
  added or removed) keeps every other class and filter as it is;
- BPF maps: each entry looked up and updated only where it differs (the
  bpf system call, hostagent.bpfmap);
- the BG marker (bwf_mark on the interface's egress, tc clsact): its
  buckets are written before it is attached, and it is attached before
  the HTB's BG class may borrow past the guarantee (and detached only
  after the class is back at it), so BG is never unlimited in between;
  a filter running another program than the one pinned (an older build)
  is replaced.

What a plan touches (devices, table, address) is recorded in the state
file *before* it is touched, so ``teardown`` (SIGTERM) removes everything,
including classes left by an apply that failed half-way. A failing step
raises :class:`ExecError` naming it. ``differences(plan)`` reads the
kernel back and lists where it differs from ``plan``: empty means the plan
is in force, whatever happened before.

``fault``: an optional callable run before every kernel change with its
name; tests inject failures through it.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hostagent.bpfmap import Maps, prog_id
from hostagent import plan as P

log = logging.getLogger("bwfabric.agent")

PROC_SYS = Path("/proc/sys")
BPF_PIN_DIR = Path("/run/bwfabric/bpf")  # hostagent.cc pins the CC's maps here


class ExecError(RuntimeError):
    pass


def _run(cmd: list[str], stdin: str | None = None) -> str:
    res = subprocess.run(cmd, input=stdin, capture_output=True, text=True)
    if res.returncode != 0:
        raise ExecError(f"{' '.join(cmd)}: {(res.stderr or res.stdout).strip()}")
    return res.stdout


def _classid(text: str) -> int:
    major, minor = text.split(":")
    return (int(major or "0", 16) << 16) | int(minor or "0", 16)


def _class_parent(text: str) -> int:
    """A class's parent as the kernel reports it: a class directly under the
    qdisc ("1:") is shown with parent TC_H_ROOT."""
    handle = _classid(text)
    return 0xFFFFFFFF if handle & 0xFFFF == 0 else handle


def _classtext(handle: int) -> str:
    return f"{handle >> 16:x}:{handle & 0xFFFF:x}"


# ---- what the kernel has (tc) ------------------------------------------------------------------------
@dataclass(frozen=True)
class KClass:
    parent: int
    rate_Bps: int
    ceil_Bps: int
    prio: int


@dataclass(frozen=True)
class KFilter:
    target: int
    keys: frozenset          # {(word offset, value, mask)}


@dataclass
class TcState:
    root: tuple[str, int, int] | None = None          # (kind, handle, default class) of the root qdisc
    classes: dict[int, KClass] = field(default_factory=dict)
    leaves: dict[int, tuple[str, int, int]] = field(default_factory=dict)   # parent -> (kind, handle, limit)
    filters: dict[int, KFilter] = field(default_factory=dict)              # pref -> filter


_FILTER_HEAD = re.compile(r"pref (\d+) u32 .*fh \S+::\S+ .*flowid (\S+)")
_FILTER_KEY = re.compile(r"match ([0-9a-f]{8})/([0-9a-f]{8}) at (-?\d+)")


def parse_u32_filters(text: str) -> dict[int, KFilter]:
    """``tc filter show dev X parent 1:`` -> pref -> filter. Keys are put in
    a canonical form (32-bit word offset, value, mask): tc prints a key on
    one byte of a word at that byte's offset."""
    out: dict[int, KFilter] = {}
    pref = target = None
    keys: set = set()

    def flush():
        if pref is not None and target is not None:
            out[pref] = KFilter(target, frozenset(keys))

    for line in text.splitlines():
        head = _FILTER_HEAD.search(line)
        if head:
            flush()
            pref, target, keys = int(head.group(1)), _classid(head.group(2)), set()
            continue
        if line.startswith("filter"):
            flush()
            pref = target = None
            keys = set()
            continue
        key = _FILTER_KEY.search(line)
        if key and pref is not None:
            val, mask, off = int(key.group(1), 16), int(key.group(2), 16), int(key.group(3))
            shift = 8 * (off % 4)
            keys.add((off - off % 4, val >> shift, mask >> shift))
    flush()
    return out


def filter_keys(f: P.TcFilter) -> frozenset:
    keys = {(0, f.tos[0] << 16, f.tos[1] << 16)}
    if f.dst is not None:
        keys.add((16, int(ipaddress.IPv4Address(f.dst)), 0xFFFFFFFF))
    return frozenset(keys)


def read_tc(dev: str) -> TcState | None:
    """The HTB tree on ``dev`` as the kernel has it (None: no such device)."""
    from pyroute2 import IPRoute

    st = TcState()
    with IPRoute() as ipr:
        found = ipr.link_lookup(ifname=dev)
        if not found:
            return None
        idx = found[0]
        for q in ipr.get_qdiscs(idx):
            kind = q.get_attr("TCA_KIND")
            if q["parent"] == 0xFFFFFFFF:
                opts = q.get_attr("TCA_OPTIONS") or {}
                init = dict(opts.get("attrs", [])).get("TCA_HTB_INIT", {}) if kind == "htb" else {}
                st.root = (kind, q["handle"], init.get("defcls", 0))
            else:
                limit = _bfifo_limit(q.get_attr("TCA_OPTIONS")) if kind == "bfifo" else -1
                st.leaves[q["parent"]] = (kind, q["handle"], limit)
        if st.root is not None and st.root[0] == "htb":
            for c in ipr.get_classes(idx):
                if c.get_attr("TCA_KIND") != "htb":
                    continue
                attrs = dict((c.get_attr("TCA_OPTIONS") or {}).get("attrs", []))
                parms = attrs.get("TCA_HTB_PARMS", {})
                rate = attrs.get("TCA_HTB_RATE64") or parms.get("rate", 0)
                ceil = attrs.get("TCA_HTB_CEIL64") or parms.get("ceil", 0)
                st.classes[c["handle"]] = KClass(c["parent"], int(rate), int(ceil), int(parms.get("prio", 0)))
    if st.root is not None and st.root[0] == "htb":
        st.filters = parse_u32_filters(_run(["tc", "filter", "show", "dev", dev, "parent", _classtext(st.root[1])]))
    return st


def read_class_bytes(dev: str) -> dict[str, int]:
    """Bytes sent through each HTB class on ``dev`` ("1:10" -> bytes), as
    the kernel counts them ({} without the device or an HTB root)."""
    from pyroute2 import IPRoute

    out: dict[str, int] = {}
    with IPRoute() as ipr:
        found = ipr.link_lookup(ifname=dev)
        if not found:
            return out
        for c in ipr.get_classes(found[0]):
            if c.get_attr("TCA_KIND") != "htb":
                continue
            stats2 = c.get_attr("TCA_STATS2")
            basic = stats2.get_attr("TCA_STATS_BASIC") if stats2 is not None else None
            if basic is not None:
                out[_classtext(c["handle"])] = int(basic["bytes"])
            elif c.get_attr("TCA_STATS") is not None:
                out[_classtext(c["handle"])] = int(c.get_attr("TCA_STATS")["bytes"])
    return out


def _bfifo_limit(raw) -> int:
    """bfifo's options are a bare u32 limit; pyroute2 may hand them over as
    bytes, hex text ('00:00:04:00') or an int."""
    if isinstance(raw, int):
        return raw
    if isinstance(raw, (bytes, bytearray)) and len(raw) >= 4:
        return int.from_bytes(raw[:4], "little")
    if isinstance(raw, str) and re.fullmatch(r"([0-9a-f]{2}:?)+", raw):
        return int.from_bytes(bytes.fromhex(raw.replace(":", ""))[:4], "little")
    return -1


def _rate_close(kernel_Bps: int, want_bps: int) -> bool:
    """The kernel keeps HTB rates in bytes/s: a planned rate in bit/s is in
    force if it rounds to what the kernel holds."""
    return abs(kernel_Bps - want_bps / 8) <= 1 + 1e-6 * want_bps / 8


@dataclass
class Executor:
    state_file: Path | None = None      # sysctl originals and what was touched, across restarts
    bpf_pin_dir: Path = BPF_PIN_DIR
    fault: Callable[[str], None] | None = None
    originals: dict[str, str] = field(default_factory=dict)
    touched: dict[str, list] = field(default_factory=dict)   # kind -> names ("dev", "nft", "bpf")
    nft_listing: dict[str, str] = field(default_factory=dict)  # planned text -> the kernel's listing of it
    changes: int = 0                    # kernel changes made (for tests and logs)
    mptcp_limits_original: dict = field(default_factory=dict)   # `ip mptcp limits` before we set them
    maps: Maps = field(default_factory=Maps)   # the pinned BPF maps, open (bpf system call)

    def __post_init__(self) -> None:
        if self.state_file is not None and Path(self.state_file).exists():
            try:
                data = json.loads(Path(self.state_file).read_text())
                if not isinstance(data, dict):
                    raise ValueError("not an object")
                self.originals = dict(data.get("sysctl_originals", {}))
                self.touched = {k: list(v) for k, v in dict(data.get("touched", {})).items()}
                self.mptcp_limits_original = {str(k): str(v) for k, v in
                                              dict(data.get("mptcp_limits_original", {})).items()}
            except (ValueError, TypeError, AttributeError) as exc:
                raise ExecError(f"{self.state_file}: corrupt executor state ({exc}); move it away to start "
                                "afresh (it lists what to undo on teardown)") from None

    def _step(self, name: str) -> None:
        """Before every kernel change."""
        if self.fault is not None:
            self.fault(name)
        self.changes += 1

    def _touch(self, kind: str, name) -> None:
        have = self.touched.setdefault(kind, [])
        if name not in have:
            have.append(name)
            self._save()

    # ---- whole plans ------------------------------------------------------------------
    def apply(self, plan: P.Plan) -> int:
        before = self.changes
        for step in plan.of(P.Sysctl):
            self._sysctl(step)
        limits = plan.of(P.MptcpLimits)
        if limits:
            self._mptcp(limits[0], plan.of(P.MptcpEndpoint))
        for table in plan.of(P.NftTable):
            self._nft(table)
        buckets, markers = plan.of(P.BgBucket), plan.of(P.TcMarker)
        for b in buckets:                   # the marker's buckets, then the marker, then the classes
            self._bucket(b)
        for m in markers:
            self._marker(m)
        tc = [s for s in plan.steps if isinstance(s, (P.TcQdisc, P.TcClass, P.TcLeaf, P.TcFilter))]
        for dev in sorted({s.dev for s in tc}):
            self._tc(dev, [s for s in tc if s.dev == dev])
        self._marker_remove(keep={m.dev for m in markers})       # ...and the other way round
        self._bucket_remove(keep={(b.src, b.dst or "") for b in buckets})
        bpf = plan.of(P.BpfMapSet)
        for step in bpf:
            self._bpf(step)
        self._bpf_remove(keep={(s.map, s.key_ipv4) for s in bpf})
        for step in plan.of(P.BpfMapAbsent):
            self._bpf_absent(step)
        # this plan's VMs own their addresses' buckets: any other left by an earlier run goes
        self._bucket_strays({s.key_ipv4 for s in bpf if s.map == P.BPF_MAP},
                            keep={(b.src, b.dst or "") for b in buckets})
        conf = plan.of(P.BpfConf)
        for step in conf:
            self._bpf_conf(step)
        self._bpf_conf_reset(keep={(s.map, s.index) for s in conf})
        self._save()
        return self.changes - before

    def differences(self, plan: P.Plan) -> list[str]:
        """Where the kernel differs from ``plan`` (read back now); empty
        when the plan is in force."""
        out: list[str] = []
        for step in plan.of(P.Sysctl):
            try:
                have = " ".join(self._sysctl_path(step.key).read_text().split())
            except OSError:
                have = None
            if have != " ".join(step.value.split()):
                out.append(f"sysctl {step.key}: {have!r}, planned {step.value!r}")
        limits = plan.of(P.MptcpLimits)
        if limits:
            cur = _run(["ip", "mptcp", "limits", "show"]).split()
            have = dict(zip(cur[::2], cur[1::2]))
            if (have.get("subflows"), have.get("add_addr_accepted")) != (str(limits[0].subflows),
                                                                          str(limits[0].add_addr_accepted)):
                out.append(f"mptcp limits {have}")
        want_eps = {e.id: e for e in plan.of(P.MptcpEndpoint)}
        if self.mptcp_endpoints() != want_eps:
            out.append(f"mptcp endpoints {sorted(self.mptcp_endpoints())}, planned {sorted(want_eps)}")
        for table in plan.of(P.NftTable):
            if self._nft_list(table.name) != self._nft_expected(table):
                out.append(f"nft table {table.name}")
        tc = [s for s in plan.steps if isinstance(s, (P.TcQdisc, P.TcClass, P.TcLeaf, P.TcFilter))]
        for dev in sorted({s.dev for s in tc}):
            out.extend(self._tc_differences(dev, [s for s in tc if s.dev == dev]))
        for step in plan.of(P.BpfMapSet):
            have = self._bpf_lookup(step.map, step.key_ipv4)
            if have != step.value:
                out.append(f"bpf {step.map}[{step.key_ipv4}] = {have}, planned {step.value}")
        for step in plan.of(P.BpfMapAbsent):
            have = self._bpf_lookup(step.map, step.key_ipv4)
            if have is not None:
                out.append(f"bpf {step.map}[{step.key_ipv4}] = {have}, planned none")
        planned_marks = {m.dev for m in plan.of(P.TcMarker)}
        for dev in sorted(planned_marks | set(self.touched.get("marker", []))):
            have = self.marker_prog(dev)
            if dev in planned_marks and (have is None or have != self._mark_prog_id()):
                out.append(f"tc {dev} egress marker: program {have}, pinned {self._mark_prog_id()}")
            elif dev not in planned_marks and have is not None:
                out.append(f"tc {dev} egress marker present, not planned")
        planned_buckets = {(b.src, b.dst or ""): b for b in plan.of(P.BgBucket)}
        for b in planned_buckets.values():
            have = self._bpf_raw(P.BPF_BUCKET_MAP, b.key())
            if have != b.value():
                out.append(f"bpf {P.BPF_BUCKET_MAP}[{b.src}->{b.dst or 'hose'}] = {_bucket_text(have)}, planned "
                           f"{b.rate_Bps} B/s x {b.depth_bytes} B")
        for src, dst in self.touched.get("bucket", []):
            if (src, dst) not in planned_buckets and \
                    self._bpf_raw(P.BPF_BUCKET_MAP, _bucket_key(src, dst)) is not None:
                out.append(f"bpf {P.BPF_BUCKET_MAP}[{src}->{dst or 'hose'}] present, not planned")
        for step in plan.of(P.BpfConf):
            have = self._bpf_read(step.map, _index_key(step.index))
            if have != step.value:
                out.append(f"bpf {step.map}[{step.index}] = {have}, planned {step.value}")
        return out

    def change_rates(self, classes: list[P.TcClass]) -> int:
        """LRC's fast path: change the rates of classes that exist already,
        nothing else read or written -- one ``tc -batch`` process for all of
        them (pyroute2 0.9.7 took 2.6 ms a netlink call here: 85 ms for a VM
        of 32 pairs). A class that is not there fails the batch: an
        ExecError, and the caller re-applies its whole plan (which reads
        everything back)."""
        if not classes:
            return 0
        lines = "".join(f"class change dev {c.dev} parent {c.parent} classid {c.classid} htb rate {c.rate_bps}bit "
                        f"ceil {c.ceil_bps}bit prio {c.prio}\n" for c in classes)
        _run(["tc", "-batch", "-"], stdin=lines)
        return len(classes)

    def class_bytes(self, dev: str) -> dict[str, int]:
        """Bytes through each HTB class on ``dev`` (read from the kernel)."""
        return read_class_bytes(dev)

    def pair_slots(self, dev: str) -> dict[str, int]:
        """The pipe-model slots in force on ``dev``: destination -> slot, read
        back from the u32 filters (pref PAIR_PREF_BASE + slot)."""
        st = read_tc(dev)
        if st is None:
            return {}
        out = {}
        for pref, f in st.filters.items():
            slot = pref - P.PAIR_PREF_BASE
            dst = [v for off, v, m in f.keys if off == 16 and m == 0xFFFFFFFF]
            if 0 <= slot < P.MAX_PAIRS and len(dst) == 1:
                out[str(ipaddress.IPv4Address(dst[0]))] = slot
        return out

    def clean_differences(self) -> list[str]:
        """What of ours is still in the kernel (empty after a full teardown)."""
        out = []
        for dev in self.touched.get("dev", []):
            st = read_tc(dev)
            if st is not None and st.root is not None and st.root[:2] == ("htb", _classid(P.TC_HANDLE)):
                out.append(f"tc htb on {dev}")
        for name in self.touched.get("nft", []):
            if self._nft_list(name) is not None:
                out.append(f"nft table {name}")
        if self.mptcp_endpoints():
            out.append(f"mptcp endpoints {sorted(self.mptcp_endpoints())}")
        if self.mptcp_limits_original and self._mptcp_limits() != self.mptcp_limits_original:
            out.append(f"mptcp limits {self._mptcp_limits()}, originally {self.mptcp_limits_original}")
        for m, ip in self.touched.get("bpf", []):
            if self._bpf_lookup(m, ip) is not None:
                out.append(f"bpf {m}[{ip}]")
        for m, index in self.touched.get("bpfconf", []):
            if self._bpf_read(m, _index_key(index)) not in (None, 0):
                out.append(f"bpf {m}[{index}]")
        out += [f"tc {dev} egress marker" for dev in self.touched.get("marker", [])
                if self.marker_prog(dev) is not None]
        out += [f"bpf {P.BPF_BUCKET_MAP}[{src}->{dst or 'hose'}]" for src, dst in self.touched.get("bucket", [])
                if self._bpf_raw(P.BPF_BUCKET_MAP, _bucket_key(src, dst)) is not None]
        for key, value in self.originals.items():
            try:
                have = " ".join(self._sysctl_path(key).read_text().split())
            except OSError:
                continue
            if have != value:
                out.append(f"sysctl {key} {have!r}, originally {value!r}")
        return out

    def teardown(self) -> None:
        """Undo everything this executor (or an earlier run with the same
        state file) may have put in force; every part is tried."""
        errors = []
        for name, fn in (("tc", self._tc_remove), ("marker", self._marker_remove), ("bucket", self._bucket_remove),
                         ("nft", self._nft_remove), ("mptcp", self._mptcp_remove),
                         ("bpf", self._bpf_remove), ("bpfconf", self._bpf_conf_reset),
                         ("sysctl", self._sysctl_restore)):
            t0 = time.monotonic()
            try:
                fn()
            except Exception as exc:  # keep undoing the rest
                errors.append(f"{name}: {exc}")
            if time.monotonic() - t0 > 1.0:     # a slow shutdown names its slow part
                log.warning("teardown: removing %s took %.1f s", name, time.monotonic() - t0)
        if errors:
            raise ExecError("teardown: " + "; ".join(errors))
        self.touched.clear()
        self._save()

    def _save(self) -> None:
        if self.state_file is not None:
            tmp = Path(f"{self.state_file}.tmp")
            tmp.write_text(json.dumps({"sysctl_originals": self.originals, "touched": self.touched,
                                       "mptcp_limits_original": self.mptcp_limits_original}))
            tmp.replace(self.state_file)

    # ---- sysctl ------------------------------------------------------------------------
    @staticmethod
    def _sysctl_path(key: str) -> Path:
        return PROC_SYS / key.replace(".", "/")

    def _sysctl(self, step: P.Sysctl) -> None:
        path = self._sysctl_path(step.key)
        try:
            current = " ".join(path.read_text().split())
        except OSError as exc:
            raise ExecError(f"sysctl {step.key}: {exc.strerror}") from None
        if step.key not in self.originals:
            self.originals[step.key] = current
            self._save()                # before the write: a crash after it still restores
        if current != " ".join(step.value.split()):
            self._step(f"sysctl {step.key}")
            try:
                path.write_text(step.value)
            except OSError as exc:
                raise ExecError(f"sysctl {step.key}={step.value}: {exc.strerror}") from None

    def _sysctl_restore(self) -> None:
        for key, value in sorted(self.originals.items()):
            path = self._sysctl_path(key)
            try:
                if " ".join(path.read_text().split()) != value:
                    path.write_text(value)
            except OSError as exc:
                raise ExecError(f"restoring sysctl {key}={value}: {exc.strerror}") from None

    # ---- MPTCP -------------------------------------------------------------------------------
    @staticmethod
    def mptcp_endpoints() -> dict[int, P.MptcpEndpoint]:
        """Our endpoints (ids in our range) as the kernel has them."""
        out = {}
        for line in _run(["ip", "mptcp", "endpoint", "show"]).splitlines():
            tok = line.split()
            if "id" not in tok:
                continue
            eid = int(tok[tok.index("id") + 1])
            if not P.ENDPOINT_ID_BASE < eid <= P.ENDPOINT_ID_BASE + 64:
                continue
            port = int(tok[tok.index("port") + 1]) if "port" in tok else 0
            dev = tok[tok.index("dev") + 1] if "dev" in tok else ""
            flags = "signal" if "signal" in tok else ("subflow" if "subflow" in tok else "")
            out[eid] = P.MptcpEndpoint(eid, tok[0], dev, port, flags)
        return out

    def _mptcp(self, limits: P.MptcpLimits, endpoints: list[P.MptcpEndpoint]) -> None:
        cur = _run(["ip", "mptcp", "limits", "show"]).split()
        have = dict(zip(cur[::2], cur[1::2]))
        if have.get("subflows") != str(limits.subflows) or have.get("add_addr_accepted") != str(
                limits.add_addr_accepted):
            if not self.mptcp_limits_original:        # saved before the write: a crash after it still restores
                self.mptcp_limits_original = {k: have[k] for k in ("subflows", "add_addr_accepted") if k in have}
                self._save()
            self._step("mptcp limits")
            _run(["ip", "mptcp", "limits", "set", "subflows", str(limits.subflows),
                  "add_addr_accepted", str(limits.add_addr_accepted)])
        want = {e.id: e for e in endpoints}
        have_eps = self.mptcp_endpoints()
        for eid, ep in sorted(have_eps.items()):
            if want.get(eid) != ep:
                self._step(f"mptcp endpoint delete {eid}")
                _run(["ip", "mptcp", "endpoint", "delete", "id", str(eid)])
        for eid, ep in sorted(want.items()):
            if have_eps.get(eid) != ep:
                self._step(f"mptcp endpoint add {eid}")
                _run(["ip", "mptcp", "endpoint", "add", ep.address, "dev", ep.dev, "port", str(ep.port),
                      "id", str(ep.id), ep.flags])

    def _mptcp_remove(self) -> None:
        for eid in self.mptcp_endpoints():
            _run(["ip", "mptcp", "endpoint", "delete", "id", str(eid)])
        if self.mptcp_limits_original:
            if self._mptcp_limits() != self.mptcp_limits_original:
                args = [x for k, v in sorted(self.mptcp_limits_original.items()) for x in (k, v)]
                _run(["ip", "mptcp", "limits", "set", *args])
            self.mptcp_limits_original = {}

    @staticmethod
    def _mptcp_limits() -> dict:
        cur = _run(["ip", "mptcp", "limits", "show"]).split()
        have = dict(zip(cur[::2], cur[1::2]))
        return {k: have[k] for k in ("subflows", "add_addr_accepted") if k in have}

    # ---- nftables -----------------------------------------------------------------------------
    @staticmethod
    def _nft_list(name: str) -> str | None:
        res = subprocess.run(["nft", "list", "table", "ip", name], capture_output=True, text=True)
        return res.stdout if res.returncode == 0 else None

    def _nft_expected(self, table: P.NftTable) -> str:
        """The kernel's listing of the planned table: remembered from the
        last apply, or (after a restart) made by loading the text into a
        scratch table for a moment (its rules only repeat ours)."""
        hit = self.nft_listing.get(table.text)
        if hit is not None:
            return hit
        probe = f"{table.name}_probe"
        text = table.text.replace(f"table ip {table.name} ", f"table ip {probe} ", 1)
        _run(["nft", "-f", "-"], stdin=f"table ip {probe} {{}}\ndelete table ip {probe}\n{text}\n")
        try:
            listing = (self._nft_list(probe) or "").replace(f"table ip {probe} ", f"table ip {table.name} ", 1)
        finally:
            _run(["nft", "-f", "-"], stdin=f"table ip {probe} {{}}\ndelete table ip {probe}\n")
        self.nft_listing[table.text] = listing
        return listing

    def _nft(self, table: P.NftTable) -> None:
        have = self._nft_list(table.name)
        if have is not None and self._nft_expected(table) == have:
            return
        self._touch("nft", table.name)
        self._step(f"nft table {table.name}")
        # declare (no-op if present), delete, define: one atomic transaction
        script = f"table ip {table.name} {{}}\ndelete table ip {table.name}\n{table.text}\n"
        _run(["nft", "-f", "-"], stdin=script)
        self.nft_listing[table.text] = self._nft_list(table.name)

    def _nft_remove(self) -> None:
        for name in self.touched.get("nft", []):
            _run(["nft", "-f", "-"], stdin=f"table ip {name} {{}}\ndelete table ip {name}\n")

    # ---- tc (pyroute2) --------------------------------------------------------------------------
    def _tc_differences(self, dev: str, steps: list) -> list[str]:
        st = read_tc(dev)
        if st is None:
            return [f"tc: no interface {dev}"]
        out = []
        for s in steps:
            if isinstance(s, P.TcQdisc):
                if st.root != ("htb", _classid(s.handle), _classid(s.default_class)):
                    out.append(f"tc {dev} root {st.root}")
            elif isinstance(s, P.TcClass):
                k = st.classes.get(_classid(s.classid))
                if k is None or k.parent != _class_parent(s.parent) or k.prio != s.prio or \
                        not _rate_close(k.rate_Bps, s.rate_bps) or not _rate_close(k.ceil_Bps, s.ceil_bps):
                    out.append(f"tc {dev} class {s.classid}: {k}")
            elif isinstance(s, P.TcLeaf):
                if st.leaves.get(_classid(s.parent)) != ("bfifo", _classid(s.handle), s.limit_bytes):
                    out.append(f"tc {dev} leaf under {s.parent}: {st.leaves.get(_classid(s.parent))}")
            elif st.filters.get(s.pref) != KFilter(_classid(s.target), filter_keys(s)):
                out.append(f"tc {dev} filter pref {s.pref}: {st.filters.get(s.pref)}")
        want_classes = {_classid(s.classid) for s in steps if isinstance(s, P.TcClass)}
        want_prefs = {s.pref for s in steps if isinstance(s, P.TcFilter)}
        out += [f"tc {dev} extra class {_classtext(c)}" for c in sorted(set(st.classes) - want_classes)]
        out += [f"tc {dev} extra filter pref {p}" for p in sorted(set(st.filters) - want_prefs)]
        return out

    def _tc(self, dev: str, steps: list) -> None:
        """Converge ``dev``'s HTB tree on ``steps`` (see the module doc for
        the order, which keeps BG limited throughout)."""
        from pyroute2 import IPRoute

        self._touch("dev", dev)
        st = read_tc(dev)
        if st is None:
            raise ExecError(f"tc: no interface {dev!r} in this namespace")
        qdisc = next(s for s in steps if isinstance(s, P.TcQdisc))
        classes = [s for s in steps if isinstance(s, P.TcClass)]
        leaves = [s for s in steps if isinstance(s, P.TcLeaf)]
        filters = [s for s in steps if isinstance(s, P.TcFilter)]
        root = _classid(qdisc.handle)
        with IPRoute() as ipr:
            idx = ipr.link_lookup(ifname=dev)[0]
            if st.root is None or st.root[:2] != ("htb", root):
                self._step(f"tc {dev} root htb")
                ipr.tc("replace", "htb", idx, root, default=_classid(qdisc.default_class))
                st = TcState(root=("htb", root, _classid(qdisc.default_class)))
            elif st.root[2] != _classid(qdisc.default_class):
                self._step(f"tc {dev} root default")
                ipr.tc("change", "htb", idx, root, default=_classid(qdisc.default_class))
            # classes: parents first (the root class is listed first by the planner)
            for c in classes:
                cid, parent = _classid(c.classid), _classid(c.parent)
                have = st.classes.get(cid)
                kw = dict(parent=parent, rate=f"{c.rate_bps}bit", ceil=f"{c.ceil_bps}bit", prio=c.prio)
                if have is not None and have.parent != _class_parent(c.parent):
                    self._step(f"tc {dev} class {c.classid} re-parented")
                    self._class_del(dev, cid)
                    have = None
                if have is None:
                    self._step(f"tc {dev} class {c.classid} add")
                    ipr.tc("add-class", "htb", idx, cid, **kw)
                elif not (_rate_close(have.rate_Bps, c.rate_bps) and _rate_close(have.ceil_Bps, c.ceil_bps)
                          and have.prio == c.prio):
                    self._step(f"tc {dev} class {c.classid} change")
                    ipr.tc("change-class", "htb", idx, cid, **kw)
            for leaf in leaves:
                if st.leaves.get(_classid(leaf.parent)) != ("bfifo", _classid(leaf.handle), leaf.limit_bytes):
                    self._step(f"tc {dev} leaf {leaf.parent}")
                    self._leaf(leaf)
            for f in filters:
                want = KFilter(_classid(f.target), filter_keys(f))
                have_f = st.filters.get(f.pref)
                if have_f == want:
                    continue
                if have_f is not None:
                    self._step(f"tc {dev} filter {f.pref} replace")
                    self._filter_del(dev, f.pref)
                self._step(f"tc {dev} filter {f.pref} add")
                keys = [f"{v:#010x}/{m:#010x}+{off}" for off, v, m in sorted(want.keys)]
                ipr.tc("add-filter", "u32", idx, parent=root, prio=f.pref, protocol=0x0800,
                       target=_classid(f.target), keys=keys)
            for pref in sorted(set(st.filters) - {f.pref for f in filters}):
                self._step(f"tc {dev} filter {pref} delete")
                self._filter_del(dev, pref)
            stale = set(st.classes) - {_classid(c.classid) for c in classes}
            # children before parents
            for cid in sorted(stale, key=lambda c: -_depth(c, st.classes)):
                self._step(f"tc {dev} class {_classtext(cid)} delete")
                self._class_del(dev, cid)

    @staticmethod
    def _class_del(dev: str, cid: int) -> None:
        # pyroute2 0.9.7's htb plugin cannot encode a class delete (it builds rate tables from nothing)
        _run(["tc", "class", "del", "dev", dev, "classid", _classtext(cid)])

    @staticmethod
    def _filter_del(dev: str, pref: int) -> None:
        _run(["tc", "filter", "del", "dev", dev, "parent", P.TC_HANDLE, "pref", str(pref)])

    @staticmethod
    def _leaf(s: P.TcLeaf) -> None:
        # pyroute2 0.9 has no bfifo (it would silently replace the root qdisc): tc does it
        _run(["tc", "qdisc", "replace", "dev", s.dev, "parent", s.parent, "handle", s.handle, "bfifo",
              "limit", str(s.limit_bytes)])

    def _tc_remove(self) -> None:
        for dev in self.touched.get("dev", []):
            st = read_tc(dev)
            if st is not None and st.root is not None and st.root[:2] == ("htb", _classid(P.TC_HANDLE)):
                _run(["tc", "qdisc", "del", "dev", dev, "root"])

    # ---- BPF map ------------------------------------------------------------------------------
    def _bpf_lookup(self, name: str, ip: str) -> int | None:
        return self._bpf_read(name, ipaddress.IPv4Address(ip).packed)

    def _bpf_read(self, name: str, key_bytes: bytes) -> int | None:
        """The pinned map's value at the key (little-endian), read back; None: no map or no entry."""
        raw = self._bpf_raw(name, key_bytes)
        return None if raw is None else int.from_bytes(raw, "little")

    def _bpf_raw(self, name: str, key_bytes: bytes) -> bytes | None:
        """The pinned map's value at the key, as bytes; None: no map or no entry."""
        m = self._map(name)
        if m is None:
            return None
        try:
            return m.lookup(bytes(key_bytes))
        except OSError as exc:
            raise ExecError(f"BPF map {name}: lookup: {exc}") from None

    def _map(self, name: str):
        """The pinned map ``name``, open (hostagent.bpfmap: the bpf system
        call, not a bpftool process per entry); None: not pinned."""
        try:
            return self.maps.get(self.bpf_pin_dir / name)
        except OSError as exc:
            raise ExecError(f"BPF map {self.bpf_pin_dir / name}: {exc}") from None

    def _map_update(self, name: str, key: bytes, value: bytes) -> None:
        m = self._map(name)
        if m is None:
            raise ExecError(f"BPF map {self.bpf_pin_dir / name} not found: the host's BPF side is not loaded "
                            "(hostagent.cc.load(), once per machine: `bwfabric agent --load-cc`)")
        try:
            m.update(key, value)
        except OSError as exc:
            raise ExecError(f"BPF map {name}: update: {exc}") from None

    def _map_delete(self, name: str, key: bytes) -> bool:
        m = self._map(name)
        if m is None:
            return False
        try:
            return m.delete(key)
        except OSError as exc:
            raise ExecError(f"BPF map {name}: delete: {exc}") from None

    def apply_bpf(self, step: P.BpfMapSet) -> None:
        self._bpf(step)

    def _bpf(self, step: P.BpfMapSet) -> None:
        pin = self.bpf_pin_dir / step.map
        if not pin.exists():
            raise ExecError(f"BPF map {pin} not found: the WC congestion control is not loaded "
                            "(hostagent.cc.load(), once per machine: `bwfabric agent --load-cc`)")
        self._touch("bpf", [step.map, step.key_ipv4])
        if self._bpf_lookup(step.map, step.key_ipv4) == step.value:
            return
        self._step(f"bpf {step.map}[{step.key_ipv4}]")
        self._map_update(step.map, ipaddress.IPv4Address(step.key_ipv4).packed, step.value.to_bytes(step.width, "little"))

    def _bpf_absent(self, step: P.BpfMapAbsent) -> None:
        if self._bpf_lookup(step.map, step.key_ipv4) is None:
            return
        self._step(f"bpf {step.map}[{step.key_ipv4}] delete (not ours: left by another run)")
        self._map_delete(step.map, ipaddress.IPv4Address(step.key_ipv4).packed)

    def _bucket_strays(self, addresses: set[str], keep: set) -> None:
        """Delete bwf_mark buckets (and their state) whose source is one of
        ``addresses`` and that ``keep`` does not list: the marker and
        bwf_sockops's per-pair pacing would read them for this VM's flows.
        One walk of the map's keys."""
        m = self._map(P.BPF_BUCKET_MAP) if addresses else None
        if m is None:
            return
        try:
            keys = m.keys()
        except OSError as exc:
            raise ExecError(f"BPF map {P.BPF_BUCKET_MAP}: walking its keys: {exc}") from None
        for key in keys:
            if len(key) != 8:
                continue
            src = str(ipaddress.IPv4Address(key[:4]))
            dst = "" if key[4:] == bytes(4) else str(ipaddress.IPv4Address(key[4:]))
            if src not in addresses or (src, dst) in keep:
                continue
            for name in (P.BPF_BUCKET_MAP, P.BPF_BUCKET_STATE):
                if self._bpf_raw(name, key) is not None:
                    self._step(f"bpf {name}[{src}->{dst or 'hose'}] delete (not ours: left by another run)")
                    self._map_delete(name, key)

    def _bpf_remove(self, keep: set | frozenset = frozenset()) -> None:
        for entry in list(self.touched.get("bpf", [])):
            name, ip = entry
            if (name, ip) in keep:
                continue
            if self._bpf_lookup(name, ip) is not None:
                self._step(f"bpf {name}[{ip}] delete")
                self._map_delete(name, ipaddress.IPv4Address(ip).packed)
            self.touched["bpf"].remove(entry)
            self._save()

    # ---- the BG marker (bwf_mark) -----------------------------------------------------------------
    def _mark_prog_id(self) -> int | None:
        pin = self.bpf_pin_dir / P.MARK_PROG
        if not pin.exists():
            return None
        try:
            return prog_id(pin)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ExecError(f"BPF program {pin}: {exc}") from None

    @staticmethod
    def marker_prog(dev: str) -> int | None:
        """The id of the program our egress filter runs on ``dev`` (None: no such filter)."""
        res = subprocess.run(["tc", "filter", "show", "dev", dev, "egress"], capture_output=True, text=True)
        return parse_marker_filter(res.stdout) if res.returncode == 0 else None

    def _marker(self, step: P.TcMarker) -> None:
        want = self._mark_prog_id()
        if want is None:
            raise ExecError(f"BPF program {self.bpf_pin_dir / P.MARK_PROG} not found: the host's BPF side is not "
                            "loaded (hostagent.cc.load(), once per machine: `bwfabric agent --load-cc`)")
        self._touch("marker", step.dev)
        if self.marker_prog(step.dev) == want:
            return
        if "clsact" not in _run(["tc", "qdisc", "show", "dev", step.dev]):
            self._step(f"tc {step.dev} clsact")
            _run(["tc", "qdisc", "add", "dev", step.dev, "clsact"])
        self._step(f"tc {step.dev} egress marker")
        _run(["tc", "filter", "replace", "dev", step.dev, "egress", "pref", str(P.MARK_PREF), "handle", "1", "bpf",
              "da", "object-pinned", str(self.bpf_pin_dir / P.MARK_PROG)])

    def _marker_remove(self, keep: set | frozenset = frozenset()) -> None:
        for dev in list(self.touched.get("marker", [])):
            if dev in keep:
                continue
            if self.marker_prog(dev) is not None:
                self._step(f"tc {dev} egress marker delete")
                _run(["tc", "filter", "del", "dev", dev, "egress", "pref", str(P.MARK_PREF)])
                left = _run(["tc", "filter", "show", "dev", dev, "egress"]) + \
                    _run(["tc", "filter", "show", "dev", dev, "ingress"])
                if not left.strip():          # the clsact was ours alone
                    _run(["tc", "qdisc", "del", "dev", dev, "clsact"])
            self.touched["marker"].remove(dev)
            self._save()

    def _bucket(self, b: P.BgBucket) -> None:
        pin = self.bpf_pin_dir / P.BPF_BUCKET_MAP
        if not pin.exists():
            raise ExecError(f"BPF map {pin} not found: the host's BPF side is not loaded "
                            "(hostagent.cc.load(), once per machine: `bwfabric agent --load-cc`)")
        self._touch("bucket", [b.src, b.dst or ""])
        have = self._bpf_raw(P.BPF_BUCKET_MAP, b.key())
        if have == b.value():
            return
        self._step(f"bpf {P.BPF_BUCKET_MAP}[{b.src}->{b.dst or 'hose'}]")
        self._map_update(P.BPF_BUCKET_MAP, b.key(), b.value())
        # a new bucket starts full, with its counters at 0 (not an earlier run's, left by a process
        # that died before its teardown); a changed one keeps its tokens (bwf_mark: LRC moves a
        # pair's rate every round, a full bucket each time would let a burst through)
        if have is None:
            self._map_delete(P.BPF_BUCKET_STATE, b.key())

    def set_buckets(self, buckets: list[P.BgBucket], remove: list[tuple[str, str]] = ()) -> None:
        """LRC's fast path with the marker: the moved (or opened) pairs'
        buckets written and the closed pairs' (``remove``: (src, dst), in
        force now) deleted, with the bpf system call (a bpftool process
        took ~3 ms each, 100 ms for a VM of 32 pairs). A moved bucket
        keeps its tokens and counters (bwf_mark reads the rate at every
        packet); a closed pair's state stays until the next full apply or
        the teardown removes it (it stays ours: touched). Not read back
        here: status reads every bucket back against the plan. A delete of
        a bucket that is not there is an ExecError (after the rest); so is
        a bucket map that is not pinned (_map_update)."""
        for b in buckets:
            self._touch("bucket", [b.src, b.dst or ""])
            self._step(f"bpf {P.BPF_BUCKET_MAP}[{b.src}->{b.dst or 'hose'}]")
        for src, dst in remove:
            self._step(f"bpf {P.BPF_BUCKET_MAP}[{src}->{dst or 'hose'}] delete")
        for b in buckets:
            self._map_update(P.BPF_BUCKET_MAP, b.key(), b.value())
        for src, dst in remove:
            if not self._map_delete(P.BPF_BUCKET_MAP, _bucket_key(src, dst)):
                raise ExecError(f"bpf {P.BPF_BUCKET_MAP}[{src}->{dst or 'hose'}]: not there to delete")

    def _bucket_remove(self, keep: set | frozenset = frozenset()) -> None:
        for entry in list(self.touched.get("bucket", [])):
            src, dst = entry
            if (src, dst) in keep:
                continue
            key = _bucket_key(src, dst)
            for name in (P.BPF_BUCKET_MAP, P.BPF_BUCKET_STATE):
                if self._bpf_raw(name, key) is not None:
                    self._step(f"bpf {name}[{src}->{dst or 'hose'}] delete")
                    self._map_delete(name, key)
            self.touched["bucket"].remove(entry)
            self._save()

    def bucket_counters(self, src: str, dst: str | None = None) -> dict[str, int] | None:
        """Bytes bwf_mark let through as BG, demoted, dropped, and demoted
        with a CE mark for a bucket since it was (re)configured; None: none
        kept."""
        raw = self._bpf_raw(P.BPF_BUCKET_STATE, _bucket_key(src, dst or ""))
        if raw is None or len(raw) < 72:
            return None
        words = [int.from_bytes(raw[i:i + 8], "little") for i in range(0, 72, 8)]
        return dict(zip(("conform", "demoted", "dropped", "ce_marked"), (*words[3:6], words[8])))

    def _bpf_conf(self, step: P.BpfConf) -> None:
        pin = self.bpf_pin_dir / step.map
        if not pin.exists():
            raise ExecError(f"BPF map {pin} not found: the coupled congestion controls are not loaded "
                            "(hostagent.cc.load() loads them on kernels >= 6.2)")
        self._touch("bpfconf", [step.map, step.index])
        if self._bpf_read(step.map, _index_key(step.index)) == step.value:
            return
        self._step(f"bpf {step.map}[{step.index}]")
        self._map_update(step.map, _index_key(step.index), step.value.to_bytes(8, "little"))

    def _bpf_conf_reset(self, keep: set | frozenset = frozenset()) -> None:
        """Entries no longer planned go back to 0 (the program's default): an array keeps every index."""
        for entry in list(self.touched.get("bpfconf", [])):
            name, index = entry
            if (name, index) in keep:
                continue
            if self._bpf_read(name, _index_key(index)) not in (None, 0):
                self._step(f"bpf {name}[{index}] reset")
                self._map_update(name, _index_key(index), bytes(8))
            self.touched["bpfconf"].remove(entry)
            self._save()


_MARKER_FILTER = re.compile(rf"pref {P.MARK_PREF} bpf .*\b{P.MARK_PROG}\b.*direct-action.* id (\d+)")


def parse_marker_filter(text: str) -> int | None:
    """``tc filter show dev X egress`` -> the id of the program our marker
    filter runs (pref MARK_PREF, bwf_mark, direct action), or None."""
    for line in text.splitlines():
        m = _MARKER_FILTER.search(line)
        if m:
            return int(m.group(1))
    return None


def _bucket_key(src: str, dst: str) -> bytes:
    return ipaddress.IPv4Address(src).packed + (ipaddress.IPv4Address(dst).packed if dst else bytes(4))


def _bucket_text(raw: bytes | None) -> str:
    if raw is None or len(raw) != 16:
        return repr(raw)
    return f"{int.from_bytes(raw[:8], 'little')} B/s x {int.from_bytes(raw[8:], 'little')} B"


def _index_key(index: int) -> bytes:
    return index.to_bytes(4, "little")


def _depth(cid: int, classes: dict[int, KClass]) -> int:
    d, seen = 0, set()
    while cid in classes and cid not in seen:
        seen.add(cid)
        cid = classes[cid].parent
        d += 1
    return d
