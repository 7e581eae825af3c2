"""Applies a :class:`hostagent.plan.Plan` in the current network namespace
(the agent runs inside its host's namespace) -- thin and idempotent:

- sysctl: written under /proc/sys; the value found before the first change
  is kept so that ``teardown`` restores it;
- MPTCP: ``ip mptcp limits``; endpoints with our ids (ENDPOINT_ID_BASE+)
  are compared with the plan and only the differing ones removed/added
  (removing a signal endpoint closes the subflows that use it);
- nftables: the whole table replaced in one atomic ``nft -f`` transaction,
  and only when its text changed;
- tc (pyroute2; the bfifo leaves with the tc command, pyroute2 0.9 has no
  bfifo): the HTB tree is built once; later plans with the same
  classes and filters only change class rates in place (LRC moves BG rates
  often: no queue is flushed for that); a different structure rebuilds it;
- BPF map: ``bpftool map update`` on the pinned map of the WC congestion
  control, if loaded (see :mod:`hostagent.bpf`).

Every change made is recorded in ``applied`` and can be undone by
``teardown``. A failing step raises :class:`ExecError` naming it; steps
before it stay in force (the agent then reports the error to the
controller and keeps the previous configuration of the failed part).
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from hostagent import plan as P

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


@dataclass
class Executor:
    state_file: Path | None = None      # where original sysctl values are kept across restarts
    originals: dict[str, str] = field(default_factory=dict)
    applied: dict[str, object] = field(default_factory=dict)
    changes: int = 0                    # steps that really changed something (for tests)

    def __post_init__(self) -> None:
        if self.state_file is not None and Path(self.state_file).exists():
            self.originals = json.loads(Path(self.state_file).read_text()).get("sysctl_originals", {})

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
        tc = [s for s in plan.steps if isinstance(s, (P.TcQdisc, P.TcClass, P.TcLeaf, P.TcFilter))]
        if tc:
            self._tc(tc)
        bpf = plan.of(P.BpfMapSet)
        for step in bpf:
            self._bpf(step)
        # an entry the new plan no longer has (BG pacing once the guarantee is 0)
        self._bpf_remove(keep={("bpf", s.map, s.key_ipv4) for s in bpf})
        self._save()
        return self.changes - before

    def teardown(self) -> None:
        """Undo everything this executor put in force (best effort, all parts tried)."""
        errors = []
        for name, fn in (("tc", self._tc_remove), ("nft", self._nft_remove), ("mptcp", self._mptcp_remove),
                         ("bpf", self._bpf_remove), ("sysctl", self._sysctl_restore)):
            try:
                fn()
            except Exception as exc:  # keep undoing the rest
                errors.append(f"{name}: {exc}")
        self.applied.clear()
        if errors:
            raise ExecError("teardown: " + "; ".join(errors))

    def _save(self) -> None:
        if self.state_file is not None:
            Path(self.state_file).write_text(json.dumps({"sysctl_originals": self.originals}))

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
        self.originals.setdefault(step.key, current)
        if current != " ".join(step.value.split()):
            try:
                path.write_text(step.value)
            except OSError as exc:
                raise ExecError(f"sysctl {step.key}={step.value}: {exc.strerror}") from None
            self.changes += 1
        self.applied.setdefault("sysctl", set()).add(step.key)

    def _sysctl_restore(self) -> None:
        for key in sorted(self.applied.get("sysctl", ())):
            if key in self.originals:
                self._sysctl_path(key).write_text(self.originals[key])

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
            _run(["ip", "mptcp", "limits", "set", "subflows", str(limits.subflows),
                  "add_addr_accepted", str(limits.add_addr_accepted)])
            self.changes += 1
        want = {e.id: e for e in endpoints}
        have_eps = self.mptcp_endpoints()
        for eid, ep in sorted(have_eps.items()):
            if want.get(eid) != ep:
                _run(["ip", "mptcp", "endpoint", "delete", "id", str(eid)])
                self.changes += 1
        for eid, ep in sorted(want.items()):
            if have_eps.get(eid) != ep:
                _run(["ip", "mptcp", "endpoint", "add", ep.address, "dev", ep.dev, "port", str(ep.port),
                      "id", str(ep.id), ep.flags])
                self.changes += 1
        self.applied["mptcp"] = sorted(want)

    def _mptcp_remove(self) -> None:
        for eid in self.mptcp_endpoints():
            _run(["ip", "mptcp", "endpoint", "delete", "id", str(eid)])

    # ---- nftables -----------------------------------------------------------------------------
    def _nft(self, table: P.NftTable) -> None:
        if self.applied.get("nft") == table.text:
            return
        # declare (no-op if present), delete, define: one atomic transaction
        script = f"table ip {table.name} {{}}\ndelete table ip {table.name}\n{table.text}\n"
        _run(["nft", "-f", "-"], stdin=script)
        self.applied["nft"] = table.text
        self.applied["nft_name"] = table.name
        self.changes += 1

    def _nft_remove(self) -> None:
        name = self.applied.get("nft_name")
        if name:
            _run(["nft", "-f", "-"], stdin=f"table ip {name} {{}}\ndelete table ip {name}\n")

    # ---- tc (pyroute2) --------------------------------------------------------------------------
    @staticmethod
    def _structure(steps) -> tuple:
        return tuple((s.dev, s.classid, s.parent, s.prio) if isinstance(s, P.TcClass) else
                     (s.dev, s.parent, s.handle) if isinstance(s, P.TcLeaf) else s for s in steps)

    def _tc(self, steps: list) -> None:
        from pyroute2 import IPRoute

        old = self.applied.get("tc")
        with IPRoute() as ipr:
            if old is not None and self._structure(old) == self._structure(steps):
                for new, was in zip(steps, old):
                    if isinstance(new, P.TcClass) and new != was:
                        idx = self._index(ipr, new.dev)
                        ipr.tc("change-class", "htb", idx, _classid(new.classid), parent=_classid(new.parent),
                               rate=f"{new.rate_bps}bit", ceil=f"{new.ceil_bps}bit", prio=new.prio)
                        self.changes += 1
                    elif isinstance(new, P.TcLeaf) and new != was:
                        self._leaf(new)
                        self.changes += 1
            else:
                for s in steps:
                    idx = self._index(ipr, s.dev)
                    if isinstance(s, P.TcQdisc):
                        ipr.tc("replace", "htb", idx, _classid(s.handle), default=_classid(s.default_class))
                    elif isinstance(s, P.TcClass):
                        ipr.tc("add-class", "htb", idx, _classid(s.classid), parent=_classid(s.parent),
                               rate=f"{s.rate_bps}bit", ceil=f"{s.ceil_bps}bit", prio=s.prio)
                    elif isinstance(s, P.TcLeaf):
                        self._leaf(s)
                    else:
                        keys = [f"{s.tos[0] << 16:#010x}/{s.tos[1] << 16:#010x}+0"]
                        if s.dst is not None:
                            keys.append(f"{int(ipaddress.IPv4Address(s.dst)):#010x}/0xffffffff+16")
                        ipr.tc("add-filter", "u32", idx, parent=_classid(P.TC_HANDLE), prio=s.pref,
                               protocol=0x0800, target=_classid(s.target), keys=keys)
                    self.changes += 1
        self.applied["tc"] = list(steps)

    @staticmethod
    def _leaf(s: P.TcLeaf) -> None:
        # pyroute2 0.9 has no bfifo (it would silently replace the root qdisc): tc does it
        _run(["tc", "qdisc", "replace", "dev", s.dev, "parent", s.parent, "handle", s.handle, "bfifo",
              "limit", str(s.limit_bytes)])

    @staticmethod
    def _index(ipr, dev: str) -> int:
        found = ipr.link_lookup(ifname=dev)
        if not found:
            raise ExecError(f"tc: no interface {dev!r} in this namespace")
        return found[0]

    def _tc_remove(self) -> None:
        from pyroute2 import IPRoute

        steps = self.applied.get("tc") or []
        devs = sorted({s.dev for s in steps if isinstance(s, P.TcQdisc)})
        with IPRoute() as ipr:
            for dev in devs:
                found = ipr.link_lookup(ifname=dev)
                if found:
                    ipr.tc("del", "htb", found[0], _classid(P.TC_HANDLE))

    # ---- BPF map ------------------------------------------------------------------------------
    def apply_bpf(self, step: P.BpfMapSet) -> None:
        self._bpf(step)

    def _bpf(self, step: P.BpfMapSet) -> None:
        pin = BPF_PIN_DIR / step.map
        if not pin.exists():
            raise ExecError(f"BPF map {pin} not found: the WC congestion control is not loaded "
                            "(hostagent.cc.load(), once per machine: `bwfabric agent --load-cc`)")
        key = " ".join(str(b) for b in ipaddress.IPv4Address(step.key_ipv4).packed)
        value = " ".join(str(b) for b in step.value.to_bytes(8, "little"))
        if self.applied.get(("bpf", step.map, step.key_ipv4)) != step.value:
            _run(["bpftool", "map", "update", "pinned", str(pin), "key", *key.split(), "value",
                  *value.split()])
            self.applied[("bpf", step.map, step.key_ipv4)] = step.value
            self.changes += 1

    def _bpf_remove(self, keep: set | frozenset = frozenset()) -> None:
        for k in [k for k in self.applied if isinstance(k, tuple) and k[0] == "bpf" and k not in keep]:
            _, name, ip = k
            pin = BPF_PIN_DIR / name
            if pin.exists():
                key = [str(b) for b in ipaddress.IPv4Address(ip).packed]
                subprocess.run(["bpftool", "map", "delete", "pinned", str(pin), "key", *key],
                               capture_output=True)
            del self.applied[k]
