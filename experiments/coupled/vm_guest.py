"""coupled-vm-guest: LIA vs LIA-VM with a real guest kernel as the sender VM, its vCPU round-robin with three CPU hogs at each slice (Fig. 7a; needs `python -m experiments.vmguest setup`).

    bwfabric experiment coupled-vm-guest [key=value ...]      (the options: :class:`Config`)
    python -m experiments.coupled vm-guest [--key value ...]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

from experiments.coupled import report
from experiments.coupled import vm
from experiments.coupled.testbed import SINK, Path, guest_mac, testbed

KIND = 'vm-guest'
HELP = 'LIA vs LIA-VM with a real guest kernel as the sender VM, its vCPU round-robin with three CPU hogs at each slice (Fig. 7a; needs `python -m experiments.vmguest setup`)'


@dataclass
class Config:
    """The options of coupled-vm-guest and their defaults (the one source: the
    registry and ``python -m experiments.coupled`` both read this)."""
    seconds: float = 20.0
    slices: tuple[float, ...] = (30.0, 120.0, 480.0)
    runs: int = 2
    mbps: float = 100.0


def measure(cfg: Config):
    return vm_guest(cfg.seconds, list(cfg.slices), cfg.runs, mbps=cfg.mbps)


def run(cfg: Config, out_dir):
    """The registry's entry: result.json (and figure.png) in ``out_dir``."""
    return report.run(KIND, measure, draw, cfg, out_dir)


def vm_guest(seconds: float, slices: list[float], runs: int, mbps: float,
             kinds=("lia", "lia_vm", "uncoupled"), cpu: int = 0) -> dict:
    """Fig. 7a with a real guest as the sender VM (experiments.vmguest):
    its vCPU runs on host CPU ``cpu`` for a slice and waits three while a
    CPU hog has it (vmguest.cpu_share; alone there for the row without
    scheduling); two
    paths of ``mbps`` and 0.5 ms RTT, ungated delay lines. Everything else
    of the run is kept off ``cpu``. Each run's goodput at the receiver and
    the guest's BPF counters (off-periods LIA-VM detected)."""
    from experiments import vmguest
    if (why := vmguest.missing()) is not None:
        raise RuntimeError(why)
    mine = os.sched_getaffinity(0)
    if not mine - {cpu}:
        raise RuntimeError(f"the run needs a CPU besides {cpu} for everything but the guest's vCPU")
    os.sched_setaffinity(0, mine - {cpu})
    rows = []
    try:
        for sl in [None, *slices]:
            row: dict = {"slice_ms": sl}
            for kind in kinds:
                runs_ = [_guest_run(seconds, sl, kind, mbps, cpu) for _ in range(runs)]
                row[kind] = [r["mbps"] for r in runs_]
                row[f"{kind}_guest"] = [r["guest"] for r in runs_]
                row[f"{kind}_vcpu_share"] = [r["vcpu_share"] for r in runs_]
            rows.append(row)
            print(json.dumps(row, default=str), file=sys.stderr, flush=True)
    finally:
        os.sched_setaffinity(0, mine)
    duty = 1 / 4
    base = rows[0]
    for r in rows[1:]:
        # what the VM's turns allow: its unscheduled goodput while on, nothing while off
        r["of_duty_bound"] = {k: sum(r[k]) / len(r[k]) / (duty * sum(base[k]) / len(base[k])) for k in kinds}
    return {"mbps": mbps, "seconds": seconds, "duty": duty, "rows": rows}


def _guest_run(seconds: float, slice_ms: float | None, kind: str, mbps: float, cpu: int, warm: float = 2.0) -> dict:
    from experiments import vmguest
    with testbed([Path(250, mbps), Path(250, mbps)], guest=True) as bed:
        sink = subprocess.Popen(["ip", "netns", "exec", bed.b, sys.executable, "-c", SINK, "1", str(warm)],
                                stdout=subprocess.PIPE, text=True)
        try:
            assert sink.stdout.readline().strip() == "ready"
            spec = {"nics": bed.sender_nics(), "subflows": bed.subflows(), "kind": kind, "dst": bed.dst,
                    "src": bed.addrs(0)[0], "seconds": seconds}
            with vmguest.Guest(bed.a, [(f"t{i}", guest_mac(i)) for i in range(len(bed.paths))], spec) as g:
                tids = g.vcpu_tids()
                # scheduled from the sender's start: a guest kernel booting on 1/4 of a CPU in 1.4 s gaps
                # panics in its boot-time timer check
                g.wait_marker("ready", 300)
                paths_before = bed.path_bytes()
                with vmguest.cpu_share(tids, cpu, slice_ms) as sched:
                    guest = g.wait(timeout=seconds + 900)
                path_bytes = [x - y for x, y in zip(bed.path_bytes(), paths_before)]
            if "error" in guest or "error" in guest.get("sender", {}):
                raise RuntimeError(f"the guest's job failed: {guest}")
            got = json.loads(sink.communicate(timeout=60)[0])["0"]
        finally:
            if sink.poll() is None:
                sink.kill()
                sink.wait(5)
    # the vCPU's share while the sender ran: samples up to its end, less the guest's power-off
    vcpu = vmguest.share(sched["usage"], until=sched["usage"][-1][0] - 0.6 if sched["usage"] else None)
    return {"mbps": got["bytes"] * 8 / 1e6 / max(got["measured_s"], 1e-9), "guest": guest, "vcpu_share": vcpu,
            "path_bytes": path_bytes}


def draw(out: dict, ax) -> None:
    vm.draw(out, ax, guest=True)
