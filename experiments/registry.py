"""Named experiments for ``bwfabric experiment NAME``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from experiments import bgwc, bgwc_fig17, coupled, lessor_dynamics, lessor_eval, lrc_emu, product, routing_comparison
from experiments.options import OptionError, parse_options

EXPERIMENTS = {
    # name: (module with Config and run, overrides of its defaults, one-line help)
    "main": (product, {}, "three tenants on an over-subscribed FatTree k=4: bwfabric vs best effort vs static "
             "reservation, 3 runs: guarantees held, short flows' completion, aggregate vs the max-min ideal"),
    "routing": (routing_comparison, {}, "FatTree k=4 10 Mb/s: permutation + web search, single_path vs ecmp"),
    "fidelity": (routing_comparison, routing_comparison.FIDELITY,
                 "single_path stride-4/stride-8/permutation vs the max-min ideal"),
    "fidelity-vl2": (routing_comparison, routing_comparison.FIDELITY_VL2,
                     "the same on VL2 (d0=2, d1=4, d2=4; 10 Mb/s servers, 25 Mb/s fabric)"),
    "lessor-permutation": (routing_comparison, routing_comparison.LESSOR_PERMUTATION,
                           "FatTree k=4 random permutation of long flows: single_path, ecmp, hedera, lessor"),
    "lessor-many2one": (routing_comparison, routing_comparison.LESSOR_MANY2ONE,
                        "FatTree k=4, 15 long flows into one host under LESSOR: moves per allocation"),
    "lessor-fattree": (lessor_eval, {}, "FatTree k=4 web-search ON-OFF, loads 0.1-0.9 x 3 seeds: "
                       "throughput, FCT, controller CPU and polling period vs load, 4 schemes"),
    "lessor-vl2": (lessor_eval, lessor_eval.VL2, "the same on VL2 (d0=2, d1=4, d2=4; scaled speeds)"),
    "lessor-failure": (lessor_dynamics, lessor_dynamics.FAILURE,
                       "a fabric link fails under LESSOR's long flows: blackhole time vs polling period"),
    "lessor-polling": (lessor_dynamics, lessor_dynamics.POLLING,
                       "Algorithm 1: polling period and controller CPU over idle / flow storm / idle"),
    **{f"bgwc-{k}": (bgwc, {"kind": k}, f"BG/WC testbed: {help_}") for k, help_ in bgwc.KINDS.items()},
    "bgwc-fig17": (bgwc_fig17, {}, "BG/WC Fig. 17: the WC subflow's path +1 ms RTT every 15 s (delay lines); "
                   "the receive-buffer rule keeps WC's rate (beta 3 vs 0.5)"),
    **{f"lrc-{k}": (lrc_emu, {"kind": k}, f"LRC on the BG/WC testbed: {help_}") for k, help_ in lrc_emu.KINDS.items()},
    **{f"coupled-{k}": (coupled.module(k), {}, f"coupled MPTCP congestion control, two-path namespaces: "
                        f"{coupled.module(k).HELP}") for k in coupled.KINDS},
}


def default_items(overrides: dict) -> list[str]:
    """An experiment's overrides as KEY=VALUE items (tuples comma-joined)."""
    return [f"{k}={','.join(map(str, v)) if isinstance(v, tuple) else v}" for k, v in overrides.items()]


def run(name: str, option_items: list[str], out: Path) -> int:
    if name not in EXPERIMENTS:
        print(f"bwfabric experiment: unknown experiment {name!r}; known: "
              + ", ".join(f"{n} ({h})" for n, (_, _, h) in EXPERIMENTS.items()), file=sys.stderr)
        return 2
    module, overrides, _ = EXPERIMENTS[name]
    out = Path(out).resolve()        # agents' sockets and the configuration's paths must be absolute
    try:
        cfg = parse_options(module.Config, default_items(overrides) + list(option_items))
    except (OptionError, ValueError) as exc:
        print(f"bwfabric experiment {name}: {exc}", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("bwfabric experiment: emulation needs root (Mininet, Open vSwitch)", file=sys.stderr)
        return 2
    from experiments.controller_proc import DEATHS
    from experiments.fabric import FabricError
    from experiments.environment import Recorder
    DEATHS.clear()
    try:
        with Recorder(out / name):       # environment.json: what the result was measured on
            module.run(cfg, out / name)
    except FabricError as exc:
        print(f"bwfabric experiment {name}: {exc}", file=sys.stderr)
        return 1
    if DEATHS:
        print(f"bwfabric experiment {name}: FAILED -- {len(DEATHS)} process(es) it depends on died during it "
              "(its figures were measured without them; traffic kept flowing on the rules already "
              "installed):\n  " + "\n  ".join(DEATHS), file=sys.stderr)
        return 1
    return 0



__all__ = ["run", "EXPERIMENTS"]
