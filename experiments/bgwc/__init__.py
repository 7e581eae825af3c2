"""BG/WC experiments on the paper's testbed (S1-S4 -> S5-S8 through one
shared link), with the prio_queues app and tc queues on every switch port,
a host agent per server (MPTCP: 1 BG + N WC subflows, nftables marking, HTB
guarantee, bwf_wc congestion control, Eq. 1 buffers).

Rates are measured at the receivers: an nftables table in each receiver's
namespace counts arriving bytes per sender and class (ToS 0x00 TCP = BG,
0x20 = WC, UDP), sampled every ``sample_s``.

Kinds (one command per figure: ``bwfabric experiment bgwc-fig12`` ...):
- ``fig12``: guarantees in the ratio 350:250:200:100 of the link; each
  sender runs one MPTCP connection; halfway each also sends UDP at 5 % of
  the link (UDP is BG: its BG TCP should drop by as much).
- ``fig13``: the same without UDP; S2 stops for ``stop_s`` seconds, then
  restarts.
- ``table3``: S1-S3 share the link with the A_l policy, rows (400/200/200,
  300/100/100, 400/200/100, 400/200/off of 1000, scaled): WC in proportion
  to A_l.
- ``fig14``: S1 opens ``conns`` connections (3, then 5), S3 and S4 one
  each; with policy ``equal`` (A_l = 1 each) WC should be equal per VM, with
  no policy (A_l = K, plain per-subflow Reno) proportional to subflows.
- ``adversarial``: S4 marks everything BG and sends UDP far above its
  guarantee; the others must keep their guarantees.

The experiment configures bwfabric as an operator does: a configuration
file declares the fabric, the agents and each sender's tenant (the sender's
VM and its receiver's, at the sender's guarantee); every change a kind makes
during the run (Table 3's rows, Fig. 14's policies) goes through the
controller's API, and the controller pushes it to the agents.

Modules: :mod:`.testbed` (options, shape), :mod:`.measure` (counters,
traffic), :mod:`.scenarios` (the kinds and their verdicts), :mod:`.plots`.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict
from pathlib import Path

from experiments import configs, ktrace, ovs
from experiments import results as R
from experiments.agents import Agents, BpfLoaded
from experiments.bgwc.measure import (RunLog, interval_rates, meter_drops, parse_meter_stats, share_error,  # noqa: F401
                                      window_mean)
from experiments.bgwc.plots import plot, share_spread_lines
from experiments.bgwc.scenarios import (KIND_RUNNERS, Bench, decide_backup, fig13_verdict, pair_tenants,  # noqa: F401
                                        sched_best)
from experiments.bgwc.testbed import (KINDS, METER_HEADROOM, PAIR, PAPER_LINK, SENDERS, Config)  # noqa: F401
from experiments.controller_proc import ControllerProcess
from experiments.fabric import Fabric
from hostagent import cc
from mininet_topos import builders

METERED_KINDS = ("fig12", "fig13", "adversarial")
INITIAL = (350, 250, 200, 100)          # fig12/fig13/adversarial guarantees (of the paper's 1000)


def agent_defaults(cfg: Config) -> dict:
    """The agents' tuning for this run (the configuration's agents.defaults)."""
    out = {"beta": cfg.beta, "stale_loss_cnt": cfg.stale_loss_cnt, "ecn": cfg.ecn, "pace_bg": cfg.pace_bg,
           "unit_mbps": cfg.unit_mbps}
    if cfg.rto_min_ms:
        out["rto_min_ms"] = cfg.rto_min_ms
    if cfg.rcvbuf_initial_kb:
        out["rcvbuf_initial_kb"] = cfg.rcvbuf_initial_kb
    if cfg.rtt_hint_ms:
        out["rtt_hint_ms"] = cfg.rtt_hint_ms
    return out


def write_config(cfg: Config, out_dir: Path, api_port: int) -> tuple[Path, tuple[str, ...]]:
    """The run's configuration: the kind's first tenants (so the ToR meters
    of the metered kinds exist from the start) and, for ``adversarial``, S4
    without an agent (policed by its ToR meter only)."""
    unmanaged = ("s4",) if cfg.kind == "adversarial" else ()
    metered = cfg.kind in METERED_KINDS
    g = {s: r * cfg.scale for s, r in zip(SENDERS, INITIAL)} if metered else {"s1": INITIAL[0] * cfg.scale}
    path = configs.write(out_dir / "bwfabric.yaml", out_dir / "topology.json", "single_path", cfg.of_port,
                         prio_queues=True, prio={"meters": metered, "meter_headroom": METER_HEADROOM},
                         tenants=pair_tenants(cfg, g), agents_dir=out_dir / "agents",
                         agent_defaults=agent_defaults(cfg), api_port=api_port)
    if unmanaged:
        import yaml
        data = yaml.safe_load(path.read_text())
        data["agents"]["unmanaged"] = list(unmanaged)
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, unmanaged


def run(cfg: Config, out_dir: Path) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    topo = builders.bgwc_testbed(link_mbps=cfg.link_mbps, mtu=cfg.mtu, queue_bytes=int(cfg.queue_kb * 1000))
    topo.save(out_dir / "topology.json")
    report: dict = {"config": asdict(cfg), "scale": f"{cfg.link_mbps:g} Mb/s links for the paper's "
                    f"{PAPER_LINK:g}: rates x{cfg.scale:g}; U = {cfg.unit_mbps:g} Mb/s"}
    api_port = cfg.of_port + 1000
    conf, unmanaged = write_config(cfg, out_dir, api_port)
    metered = cfg.kind in METERED_KINDS
    report["meters_mbps"] = ({s: round(r * cfg.scale * METER_HEADROOM, 3) for s, r in zip(SENDERS, INITIAL)}
                             if metered else None)
    hosts = [h for h in (*SENDERS, *PAIR.values()) if h not in unmanaged]
    with BpfLoaded(), Fabric(topo, of_port=cfg.of_port, queues="tc", wc_aqm=cfg.wc_aqm) as fab, \
            Agents(fab, out_dir / "agents", hosts), ControllerProcess(conf, out_dir / "controller.log"):
        fab.wait_routes(60)
        api = configs.ApiClient.from_config(conf)
        bench = Bench(fab, cfg, api, unmanaged=unmanaged)
        report["warnings"] = list(fab.warnings)
        drops_before = ovs.packet_socket_drops() or 0
        fixes_before, cuts_before = cc.repairs(), cc.mark_debts()
        ktrace_path = out_dir / "ktrace.txt.gz"
        with (ktrace.KernelTrace(ktrace_path) if cfg.ktrace else contextlib.nullcontext()):
            report.update(KIND_RUNNERS[cfg.kind](bench))
        report["config_in_force_s"] = [round(w, 3) for w in bench.config_waits]
        # corrupt WC thresholds/windows bwf_wc put right (see its source)
        report["wc_cc_repairs"] = {k: v - fixes_before[k] for k, v in cc.repairs().items()}
        # WC windows cut again for ECN marks beyond a reduction's first
        report["wc_mark_debts"] = {k: v - cuts_before[k] for k, v in cc.mark_debts().items()}
        # packets the emulator itself lost (OVS did not read a port in time):
        # every class alike, so a run with any is not a faithful one
        report["emulator_drops"] = (ovs.packet_socket_drops() or 0) - drops_before
        if report["emulator_drops"]:
            report["warnings"].append(f"ovs-vswitchd dropped {report['emulator_drops']} packets on its port "
                                      "sockets (not read in time): the emulation was overloaded")
        report["run_t0_epoch"] = list(bench.log.run_t0s)
        # an application asleep in send() gives its connection no data: BG runs dry without any stall
        report["sender_waits"] = [{"run": i, **w} for i, ws in enumerate(bench.log.sender_waits) for w in ws]
        if cfg.ktrace:
            # a connection's DATA_ACK standing still >= 0.3 s with data outstanding: a hole holding BG back
            try:
                lost = ktrace.overwritten(ktrace_path)
                if lost:
                    report["warnings"].append(f"ktrace: the kernel's trace buffer overwrote {lost} events: "
                                              "stalls early in the run may be missing")
                report["connection_stalls"] = ktrace.report(ktrace.read(ktrace_path), bench.log.run_t0s,
                                                            bench.log.connections,
                                                            {h: topo.host(h).ip for h in SENDERS})
            except (ktrace.KtraceError, OSError) as exc:    # the run's figures stand without it
                report["warnings"].append(f"ktrace: no connection stalls: {exc}")
        if cfg.trace:
            report["subflow_traces"] = list(bench.log.traces)
        if metered:
            report["meter_drops"] = meter_drops(topo)
    R.write_json(out_dir / "results.json", report)
    plot(report, out_dir / "results.png")
    for line in share_spread_lines(report):
        print(line)
    print(json.dumps(report.get("verdict", {}), indent=1))
    print(f"\nresults: {out_dir / 'results.json'}  plot: {out_dir / 'results.png'}")
    return report
