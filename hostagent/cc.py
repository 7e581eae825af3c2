"""Build, load and unload the BPF side of the host agent (once per machine):

- ``bwf_wc`` (hostagent/bpf/bwf_wc.bpf.c): the WC subflows' congestion
  control, a struct_ops Reno whose additive increase is A_l^2/K^2, registered
  twice: ``bwf_wc``, and ``bwf_wc_ecn`` for subflows that negotiated ECN
  (every packet ECN-capable, retransmissions included); its maps
  bwf_alevel (A_l per VM, written by agents), bwf_kcount (K per VM, kept
  by the CC itself), bwf_wcfix (corrupt thresholds/windows it repaired,
  see the source) and bwf_wcmarks (growth owed for further ECN marks, see
  the source) are pinned under /run/bwfabric/bpf, with bwf_bgpace
  (BG's pacing ceilings per VM, written by agents, read by bwf_sockops)
  and bwf_bgcount (each VM's established BG subflows, kept by bwf_sockops),
  both created on their own: no bwf_wc program uses them, so they would not
  outlive the registering bpftool;
- ``bwf_mark`` (hostagent/bpf/bwf_mark.bpf.c): the BG marker, pinned with
  its maps bwf_bgrate and bwf_bgstate; agents attach it to their VMs'
  egress (tc clsact) and write its buckets;
- ``bwf_sockops`` (hostagent/bpf/bwf_sockops.bpf.c): picks Reno for an MPTCP
  connection's first (BG) subflow and bwf_wc(_ecn) for its joins (WC), sizes WC's
  send buffer, and paces BG at its share of the VM's guarantee; attached to
  the cgroup v2 root so that every host namespace's sockets pass through it.

Compiled with clang against the running kernel's BTF (vmlinux.h generated
by bpftool) into build/bpf/, rebuilt when a source is newer. Unloading
detaches the sock_ops program at once; the struct_ops CC can only be
unregistered once no socket uses it any more (it is retried by ``unload``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from bwcommon.buildcache import build_dir

SRC = Path(__file__).resolve().parent / "bpf"
BUILD = build_dir("bpf")
# a bpffs of our own outside /sys: `ip netns exec` remounts /sys and would
# hide /sys/fs/bpf from agents started that way
BPFFS = Path("/run/bwfabric/bpf")
PIN_SOCKOPS = BPFFS / "bwf_sockops"
FIX_MAP = "bwf_wcfix"   # [0] thresholds, [1] windows repaired, [2] of those with a runaway pacing rate, [3] ACKs at the ceiling
MARKS_MAP = "bwf_wcmarks"   # [0] reductions with more than one mark, [1] further marks owed for, [2] capped,
                             # [3] reductions that became loss recoveries (nothing owed), [4] growth withheld
MAPS = ("bwf_alevel", "bwf_kcount", FIX_MAP, MARKS_MAP)
# created here, reused by bwf_sockops when it is loaded (its own definition must match)
PACE_MAP = "bwf_bgpace"
PACE_MAP_SPEC = ["type", "hash", "key", "4", "value", "8", "entries", "4096"]
BGCOUNT_MAP = "bwf_bgcount"   # key = IPv4, value = the VM's established BG subflows (bwf_sockops keeps it)
BGCOUNT_MAP_SPEC = ["type", "hash", "key", "4", "value", "4", "entries", "4096"]
CC_NAMES = ("bwf_wc", "bwf_wc_ecn")   # one object registers both (see bwf_wc.bpf.c)
# the coupled MPTCP congestion controls (hostagent/bpf/bwf_coupled.bpf.c), one object registering three;
# they walk the MPTCP socket's subflow list through bpf_rdonly_cast, which needs kernel 6.2 or newer
COUPLED_NAMES = ("bwf_lia", "bwf_mptcpd", "bwf_liavm")
COUPLED_MAPS = ("bwf_ccconf", "bwf_ccstat", "bwf_cctrace", "bwf_ccese", "bwf_ccconn")
COUPLED_MIN_KERNEL = (6, 2)
# which congestion control bwf_sockops gives a VM's MPTCP subflows (key = IPv4, value = the index in
# hostagent.plan.MPTCP_CCS); no entry: BG/WC (Reno on the first subflow, bwf_wc on the joins)
CCSEL_MAP = "bwf_ccsel"
CCSEL_MAP_SPEC = ["type", "hash", "key", "4", "value", "4", "entries", "4096"]
SOCKOPS_MAPS = ((PACE_MAP, PACE_MAP_SPEC), (BGCOUNT_MAP, BGCOUNT_MAP_SPEC), (CCSEL_MAP, CCSEL_MAP_SPEC))
# bwf_mark (hostagent/bpf/bwf_mark.bpf.c): the BG marker agents attach to their VMs' egress (tc
# clsact); pinned with its maps (buckets written by agents, their state kept by the program)
PIN_MARK = BPFFS / "bwf_mark"
BUCKET_MAP = "bwf_bgrate"    # key = (VM, peer or 0), value = (BG bytes/s, depth); bwf_sockops reads it too
MARK_MAPS = (BUCKET_MAP, "bwf_bgstate")
ALL_MAPS = (*MAPS, *COUPLED_MAPS, *(name for name, _ in SOCKOPS_MAPS), *MARK_MAPS)   # everything pinned in BPFFS
SOCKOPS_USES = (*(name for name, _ in SOCKOPS_MAPS), BUCKET_MAP)   # the pinned maps bwf_sockops is loaded on
TOOLS = ("clang", "bpftool")


class CcError(RuntimeError):
    pass


def _run(cmd: list[str]) -> str:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise CcError(f"{' '.join(cmd)}: {(res.stderr or res.stdout).strip()[-2000:]}")
    return res.stdout


def cgroup2_root() -> Path:
    """Where cgroup v2 is mounted (Mininet mounts v1 hierarchies at
    /sys/fs/cgroup, v2 then lives at /sys/fs/cgroup/unified)."""
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[2] == "cgroup2":
            return Path(parts[1])
    raise CcError("no cgroup v2 mount found (mount -t cgroup2 none /sys/fs/cgroup/unified)")


def build(extra: dict[str, Path] | None = None) -> dict[str, Path]:
    """Compile the agent's BPF programs (and ``extra``: name -> source, the
    emulator's switch-queue AQM) against this kernel's BTF and the BG/WC
    contract; returns name -> object. Rebuilt when a source or the contract
    changed."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        raise CcError(f"building the BPF programs needs {', '.join(missing)} (apt-get install clang bpftool "
                      "libbpf-dev; bwfabric.sh does it)")
    BUILD.mkdir(parents=True, exist_ok=True)
    vmlinux = BUILD / "vmlinux.h"
    if not vmlinux.exists():
        vmlinux.write_text(_run(["bpftool", "btf", "dump", "file", "/sys/kernel/btf/vmlinux", "format", "c"]))
    from bwcommon import contract
    from hostagent.plan import BG_PACE_AFTER_BYTES, BG_PACE_HEADROOM, CLASS_YOUNG
    major, minor = CLASS_YOUNG.split(":")
    defines = [f"-DTOS_WC={contract.TOS_WC:#x}", f"-DTOS_MASK={contract.TOS_MASK:#x}",
               f"-DBG_PACE_AFTER={BG_PACE_AFTER_BYTES}", f"-DPAIR_PACE_HEADROOM_PCT={round(BG_PACE_HEADROOM * 100)}",
               f"-DYOUNG_CLASS={int(major, 16) << 16 | int(minor, 16):#x}"]
    newest_input = Path(contract.__file__).stat().st_mtime
    stamp = BUILD / "defines"          # objects built with other values are rebuilt
    changed = not stamp.exists() or stamp.read_text() != " ".join(defines)
    out = {}
    sources = {name: SRC / f"{name}.bpf.c" for name in ("bwf_wc", "bwf_sockops", "bwf_coupled", "bwf_mark")}
    sources.update(extra or {})
    headers = max((h.stat().st_mtime for h in SRC.glob("*.h")), default=0.0)   # shared by the programs
    for name, src in sources.items():
        obj = BUILD / f"{name}.bpf.o"
        if changed or not obj.exists() or obj.stat().st_mtime < max(src.stat().st_mtime, newest_input, headers):
            _run(["clang", "-O2", "-g", "-target", "bpf", "-D__TARGET_ARCH_x86", *defines, f"-I{BUILD}", f"-I{SRC}",
                  "-c", str(src), "-o", str(obj)])
        out[name] = obj
    if changed:       # only then: a read-only tree (the real-guest experiment's) uses what is built
        stamp.write_text(" ".join(defines))
    return out


def _bpffs_mounted() -> bool:
    return any(line.split()[1] == str(BPFFS) and line.split()[2] == "bpf"
               for line in Path("/proc/mounts").read_text().splitlines())


def _mount_bpffs() -> None:
    if not _bpffs_mounted():
        BPFFS.mkdir(parents=True, exist_ok=True)
        _run(["mount", "-t", "bpf", "bpf", str(BPFFS)])


def kernel_version() -> tuple[int, int]:
    major, minor = os.uname().release.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def coupled_supported() -> str | None:
    """None, or why the coupled congestion controls cannot run here."""
    if kernel_version() < COUPLED_MIN_KERNEL:
        return (f"the coupled MPTCP congestion controls need kernel {'.'.join(map(str, COUPLED_MIN_KERNEL))} or "
                f"newer (bpf_rdonly_cast, to read the sibling subflows); this is {os.uname().release}")
    return None


def _pin_maps(names: tuple[str, ...] = MAPS) -> None:
    """Pin a registered CC's maps: the newest map of each name (bpftool
    registered it just now)."""
    maps = json.loads(_run(["bpftool", "-j", "map", "show"]))
    for name in names:
        ids = [m["id"] for m in maps if m.get("name") == name]
        if not ids:
            raise CcError(f"map {name} of the registered CC not found")
        if (BPFFS / name).exists():
            (BPFFS / name).unlink()
        _run(["bpftool", "map", "pin", "id", str(max(ids)), str(BPFFS / name)])


def _available() -> set[str]:
    return set(Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split())


def _registered() -> set[str]:
    """Ours, of the registered congestion controls."""
    return (set(CC_NAMES) | set(COUPLED_NAMES)) & _available()


def cc_registered() -> bool:
    """Both BG/WC congestion controls registered."""
    return set(CC_NAMES) <= _registered()


def coupled_registered() -> bool:
    return set(COUPLED_NAMES) <= _registered()


def status() -> dict:
    attached = False
    try:
        attached = "bwf_sockops" in _run(["bpftool", "cgroup", "show", str(cgroup2_root())])
    except CcError:
        pass
    return {"cc_registered": cc_registered(), "coupled_registered": coupled_registered(),
            "sockops_attached": attached, "marker_pinned": PIN_MARK.exists(),
            "maps_pinned": [m for m in ALL_MAPS if (BPFFS / m).exists()]}


STAMP = BPFFS.parent / "bpf.build"   # beside the bpffs: it holds only BPF objects


def build_stamp(*objs: Path) -> str:
    """What identifies a build of these objects (loaders keep it beside the
    bpffs and replace programs whose stamp differs)."""
    import hashlib
    return " ".join(f"{o.stem}:{hashlib.sha256(o.read_bytes()).hexdigest()[:16]}" for o in objs)


def load() -> dict:
    """Idempotent: registers the CC and attaches the sock_ops program unless
    already there -- as built now: programs loaded from an older build (the
    stamp in the bpffs differs) are unloaded first. Returns :func:`status`."""
    objs = build()
    _mount_bpffs()
    coupled = coupled_supported() is None
    stamp = build_stamp(objs["bwf_wc"], objs["bwf_sockops"], objs["bwf_mark"],
                        *([objs["bwf_coupled"]] if coupled else []))
    # a sock_ops program without one of its maps pinned was loaded by a bwfabric that had no such map
    unpinned = PIN_SOCKOPS.exists() and not all((BPFFS / name).exists() for name in SOCKOPS_USES)
    if (_registered() or PIN_SOCKOPS.exists()) and (not STAMP.exists() or STAMP.read_text() != stamp or unpinned):
        try:
            unload(wait_s=10)
        except CcError as exc:
            raise CcError(f"programs of an older build are loaded and could not be replaced: {exc}") from None
        _mount_bpffs()
    if not cc_registered():
        if _registered():
            raise CcError(f"only {', '.join(sorted(_registered()))} of {', '.join(CC_NAMES)} is registered: "
                          "unload first (python -m hostagent.cc unload)")
        _run(["bpftool", "struct_ops", "register", str(objs["bwf_wc"])])
        if not cc_registered():
            raise CcError(f"bpftool registered {objs['bwf_wc'].name} but the kernel does not list "
                          f"{' and '.join(CC_NAMES)}")
        _pin_maps()
    elif not all((BPFFS / m).exists() for m in MAPS):
        raise CcError(f"bwf_wc is registered but its maps are not pinned in {BPFFS}: unload it first "
                      "(python -m hostagent.cc unload)")
    if coupled and not coupled_registered():
        if set(COUPLED_NAMES) & _registered():
            raise CcError(f"only {', '.join(sorted(set(COUPLED_NAMES) & _registered()))} of "
                          f"{', '.join(COUPLED_NAMES)} is registered: unload first (python -m hostagent.cc unload)")
        _run(["bpftool", "struct_ops", "register", str(objs["bwf_coupled"])])
        if not coupled_registered():
            raise CcError(f"bpftool registered {objs['bwf_coupled'].name} but the kernel does not list "
                          f"{' and '.join(COUPLED_NAMES)}")
        _pin_maps(COUPLED_MAPS)
    # the marker first: bwf_sockops reads its bucket map (a VM-pair's BG limit is its pacing rate)
    if not PIN_MARK.exists() or not all((BPFFS / m).exists() for m in MARK_MAPS):
        for m in (PIN_MARK, *(BPFFS / m for m in MARK_MAPS)):
            if m.exists():
                m.unlink()
        _run(["bpftool", "prog", "load", str(objs["bwf_mark"]), str(PIN_MARK), "type", "classifier",
              "pinmaps", str(BPFFS)])
    st = status()
    if PIN_SOCKOPS.exists() and not _reads_pinned_buckets():   # loaded with a bucket map that is gone
        if st["sockops_attached"]:
            _run(["bpftool", "cgroup", "detach", str(cgroup2_root()), "sock_ops", "pinned", str(PIN_SOCKOPS)])
        PIN_SOCKOPS.unlink()
        st = status()
    if not st["sockops_attached"]:
        for name, spec in SOCKOPS_MAPS:
            if not (BPFFS / name).exists():
                _run(["bpftool", "map", "create", str(BPFFS / name), *spec, "name", name])
        if not PIN_SOCKOPS.exists():
            _run(["bpftool", "prog", "load", str(objs["bwf_sockops"]), str(PIN_SOCKOPS), "type", "sockops",
                  *(w for name in SOCKOPS_USES for w in ("map", "name", name, "pinned", str(BPFFS / name)))])
        _run(["bpftool", "cgroup", "attach", str(cgroup2_root()), "sock_ops", "pinned", str(PIN_SOCKOPS)])
    STAMP.write_text(stamp)
    return status()


def _reads_pinned_buckets() -> bool:
    """Whether the pinned bwf_sockops uses the pinned bucket map (the
    marker's now), not one the marker had before it was loaded again."""
    def ids(kind: str, pin: Path) -> set[int]:
        got = json.loads(_run(["bpftool", "-j", kind, "show", "pinned", str(pin)]))
        return {got["id"]} if kind == "map" else set(got.get("map_ids", []))
    try:
        return bool(ids("map", BPFFS / BUCKET_MAP) & ids("prog", PIN_SOCKOPS))
    except (CcError, ValueError, KeyError, TypeError):
        return False


def unload(wait_s: float = 10.0) -> dict:
    """Detach sock_ops, then unregister the CC once no socket uses it."""
    root = cgroup2_root()
    if PIN_SOCKOPS.exists():
        subprocess.run(["bpftool", "cgroup", "detach", str(root), "sock_ops", "pinned", str(PIN_SOCKOPS)],
                       capture_output=True)
        PIN_SOCKOPS.unlink()
    if PIN_MARK.exists():      # filters that run it keep it loaded until agents detach them
        PIN_MARK.unlink()
    deadline = time.monotonic() + wait_s
    while _registered():
        for name in sorted(_registered()):
            subprocess.run(["bpftool", "struct_ops", "unregister", "name", name], capture_output=True, text=True)
        if not _registered():
            break
        if time.monotonic() > deadline:
            raise CcError(f"{', '.join(sorted(_registered()))} still in use by sockets after {wait_s:g} s; "
                          "not unregistered")
        time.sleep(0.5)
    for m in ALL_MAPS:
        if (BPFFS / m).exists():
            (BPFFS / m).unlink()
    if STAMP.exists():
        STAMP.unlink()
    if _bpffs_mounted() and not [p for p in BPFFS.iterdir() if not p.name.endswith(".debug")]:
        subprocess.run(["umount", str(BPFFS)], capture_output=True)   # ours, now empty
    return status()


def read_map(name: str) -> dict[str, int]:
    """{IPv4: value} of a pinned map (for tests and status)."""
    if not (BPFFS / name).exists():
        return {}
    entries = json.loads(_run(["bpftool", "-j", "map", "dump", "pinned", str(BPFFS / name)]))
    out = {}
    for e in entries:
        key = e.get("key")
        val = e.get("value")
        if isinstance(key, list):
            key = ".".join(str(int(b, 16)) for b in key)
            val = int.from_bytes(bytes(int(b, 16) for b in val), "little")
        out[str(key)] = val
    return out


def parse_array_dump(entries: list) -> list[int]:
    """Values of a bpftool -j dump of an array map of u64, in key order
    (with BTF bpftool gives numbers; without, lists of hex bytes)."""
    def num(v) -> int:
        if isinstance(v, list):
            return int.from_bytes(bytes(int(b, 16) for b in v), "little")
        return int(v)
    return [num(e["value"]) for e in sorted(entries, key=lambda e: num(e["key"]))]


def _counters(name: str, keys: tuple[str, ...]) -> dict[str, int]:
    """A pinned array map of u64 counters by name (zeros when not loaded)."""
    if not (BPFFS / name).exists():
        return dict.fromkeys(keys, 0)
    vals = parse_array_dump(json.loads(_run(["bpftool", "-j", "map", "dump", "pinned", str(BPFFS / name)])))
    return dict(zip(keys, vals))


def repairs() -> dict[str, int]:
    """How many corrupt slow-start thresholds and windows bwf_wc has put
    right since it was loaded (bwf_wcfix), and of the windows how many had
    left the pacing rate above 1 Gb/s (``runaway_pace``: bwf_sockops' WC
    pacing ceiling is there to keep this at 0), and at how many ACKs a WC
    subflow's pacing rate was at that ceiling (``at_ceiling``)."""
    return _counters(FIX_MAP, ("ssthresh", "cwnd", "runaway_pace", "at_ceiling"))


def mark_debts() -> dict[str, int]:
    """What bwf_wc_ecn owed for the ECN marks it met during a reduction
    beyond the first (bwf_wcmarks): reductions that met more than one,
    further marks owed for in all, reductions that met more marks than the
    cap, reductions that became loss recoveries (nothing owed), and the
    segments of window growth withheld to pay."""
    return _counters(MARKS_MAP, ("reductions", "marks_owed", "capped", "loss_disarmed", "growth_withheld"))


if __name__ == "__main__":
    import sys
    actions = {"load": load, "unload": unload, "status": status, "build": build, "repairs": repairs,
               "mark_debts": mark_debts}
    if len(sys.argv) != 2 or sys.argv[1] not in actions:
        print(f"usage: python -m hostagent.cc {{{','.join(actions)}}}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(actions[sys.argv[1]](), default=str))
