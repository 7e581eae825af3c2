"""coupled-check: LIA, MPTCP-D and LIA-VM traced on two paths and replayed through their reference models.

    bwfabric experiment coupled-check [key=value ...]      (the options: :class:`Config`)
    python -m experiments.coupled check [--key value ...]
"""

from __future__ import annotations

from dataclasses import dataclass

from bwtesting.coupled_models import replay
from experiments.coupled import report
from experiments.coupled.testbed import Path, testbed, select, Tracer, stats, run_flows, vm_gate
from hostagent.plan import MPTCP_CCS

KIND = 'check'
HELP = 'LIA, MPTCP-D and LIA-VM traced on two paths and replayed through their reference models'


@dataclass
class Config:
    """The options of coupled-check and their defaults (the one source: the
    registry and ``python -m experiments.coupled`` both read this)."""
    seconds: float = 8.0


def measure(cfg: Config):
    return check(cfg.seconds)


def run(cfg: Config, out_dir):
    """The registry's entry: result.json (and figure.png) in ``out_dir``."""
    return report.run(KIND, measure, draw, cfg, out_dir)


def check(seconds: float) -> dict:
    """Each coupled control on two disjoint paths of unequal delay (and
    LIA-VM also under VM scheduling), traced and replayed."""
    cases = [("lia", [Path(250, 50), Path(1000, 50)]), ("mptcp_d", [Path(250, 50), Path(1000, 50)]),
             ("lia_vm", [Path(250, 50, gate=vm_gate(30, direction="both")), Path(1000, 50)])]
    out = {}
    for kind, paths in cases:
        with testbed(paths) as bed:
            select(bed.all_addrs(), kind)
            before = stats()
            with Tracer() as tr:
                flows = run_flows(bed, seconds)
            after = stats()
            select(bed.all_addrs(), "bgwc")
        recs = [r for r in tr.records if r.kind == MPTCP_CCS.index(kind)]
        rep = replay(recs)
        out[kind] = {"records": len(recs), "increases": rep.increases, "worst_rel": rep.worst_rel,
                     "worst_abs_segments": rep.worst_abs, "samples": rep.samples,
                     "worst_srtt_us": rep.worst_srtt_us, "off_periods": rep.off_periods,
                     "off_mismatch": rep.off_mismatch, "uncounted": rep.uncounted,
                     "ese_expected": len(rep.ese_expected), "ese_seen": len(rep.ese_seen),
                     "agrees": rep.agrees(), "flows": flows["flows"],
                     "stats": {k: after[k] - before[k] for k in after},
                     "subflows_seen": len({(r.conn, r.sub) for r in recs})}
    return out


draw = None      # a table of agreements, no figure
