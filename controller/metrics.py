"""Prometheus metrics of the controller, read at scrape time.

One collector asks everyone who knows something for it when Prometheus
scrapes (no counters to keep in step): the runtime (configuration hash,
version, load errors), the agent sessions, and the apps, which register a
provider each (:func:`register`). Names follow Prometheus' rules: the
``bwfabric_`` prefix, base units (bytes, seconds), ``_total`` on counters,
labels for switch, port, link, tenant and host -- never per flow.

Every metric is declared in :data:`CATALOGUE` (name, kind, help), from
which the README's metrics reference is made; a provider that yields an
undeclared name fails the tests.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import CollectorRegistry

from bwcommon.validate import finite_number

log = logging.getLogger("bwfabric.metrics")

# name (without _total for counters): (kind, labels, help)
CATALOGUE: dict[str, tuple[str, tuple[str, ...], str]] = {
    "bwfabric_config_hash": ("info", ("hash", "file"), "the configuration in force (Faucet's config_hash_info)"),
    "bwfabric_config_version": ("gauge", (), "configuration version in force (1 at start, +1 per accepted change)"),
    "bwfabric_controller_generation": ("gauge", (), "this controller process's generation (agents refuse lower)"),
    "bwfabric_config_load_errors": ("counter", (), "configuration changes refused (reload or API)"),
    "bwfabric_config_load_error": ("gauge", (), "1 if the latest configuration change was refused"),
    "bwfabric_link_capacity_bytes_per_second": ("gauge", ("src", "dst"), "link capacity, one direction"),
    "bwfabric_link_load_bytes_per_second": ("gauge", ("src", "dst"),
                                            "measured load from src to dst (port statistics)"),
    "bwfabric_port_transmit_bytes": ("counter", ("switch", "port"), "bytes a switch port sent (port statistics)"),
    "bwfabric_polling_period_seconds": ("gauge", (), "LESSOR's flow-statistics polling period"),
    "bwfabric_controller_cpu_ratio": ("gauge", (), "controller process CPU use, fraction of one core"),
    "bwfabric_pmpt_runs": ("counter", (), "PMPT allocations run"),
    "bwfabric_pmpt_lambda": ("gauge", (), "the last allocation's concurrent-flow ratio lambda"),
    "bwfabric_pmpt_duration_seconds": ("gauge", (), "the last allocation's computation time"),
    "bwfabric_pmpt_flows_placed": ("gauge", (), "long flows the last allocation placed"),
    "bwfabric_bg_routes_vms": ("gauge", (), "VMs whose BG has a default route (LESSOR)"),
    "bwfabric_bg_routes_links_over_mu": ("gauge", (), "links whose default-route BG bound exceeds mu x capacity"),
    "bwfabric_policed_flows": ("gauge", (), "long flows LESSOR holds to their receivers' fair shares (meters at their source ToRs)"),
    "bwfabric_packet_ins": ("counter", (), "PacketIns received (bwfabric installs rules proactively: expect 0)"),
    "bwfabric_openflow_messages_sent": ("counter", ("kind",), "OpenFlow messages sent to switches, by kind"),
    "bwfabric_switches_connected": ("gauge", (), "switches with a live OpenFlow connection"),
    "bwfabric_port_changes": ("counter", ("what",), "port up/down reports (received), recomputations of the "
                              "routes they caused (recomputed), reports folded into another's (coalesced), 'up' "
                              "reports of a flapping port held down (held_down), held ports let back in (released)"),
    "bwfabric_ha_leader": ("gauge", ("node",), "controller.ha: 1 while this controller leads, 0 as a standby"),
    "bwfabric_ha_generation": ("gauge", (), "controller.ha: the leader's generation as this controller knows it"),
    "bwfabric_ha_etcd_errors": ("counter", (), "controller.ha: election rounds etcd did not answer"),
    "bwfabric_switch_reconciles": ("counter", ("how",), "(re)connected switches brought to the view: read back and "
                                   "reconciled (read), or wiped and installed anew (wiped)"),
    "bwfabric_loop_errors": ("counter", ("loop",), "rounds of a periodic loop or handler that raised"),
    "bwfabric_refused_inputs": ("counter", ("kind",), "inputs refused at the OpenFlow boundary"),
    "bwfabric_tenant_guarantee_bytes_per_second": ("gauge", ("tenant", "vm", "host"), "a VM's hose guarantee"),
    "bwfabric_tenant_bg_rate_bytes_per_second": ("gauge", ("tenant", "vm", "host"),
                                                 "a VM's BG rate leaving its host (agent class counters)"),
    "bwfabric_tenant_wc_rate_bytes_per_second": ("gauge", ("tenant", "vm", "host"),
                                                 "a VM's WC rate leaving its host (agent class counters)"),
    "bwfabric_agent_connected": ("gauge", ("host",), "1 while the controller's session to the agent is up"),
    "bwfabric_agent_in_force": ("gauge", ("host",), "1 if the agent's kernel matches its configuration"),
    "bwfabric_vm_in_force": ("gauge", ("tenant", "vm", "host"), "1 if a VM's kernel objects (a VM in a network "
                             "namespace of its own) match its configuration"),
    "bwfabric_agent_config_age_seconds": ("gauge", ("host",), "time since the agent last confirmed a push"),
    "bwfabric_agent_config_version": ("gauge", ("host",), "configuration version the agent confirmed"),
    "bwfabric_agent_pushes": ("counter", ("host",), "configurations the agent confirmed"),
    "bwfabric_agent_push_failures": ("counter", ("host",), "pushes that failed (connection, timeout)"),
    "bwfabric_agent_refusals": ("counter", ("host",), "pushes the agent refused"),
    "bwfabric_agent_connects": ("counter", ("host",), "connections the session made to the agent"),
    "bwfabric_agent_rate_pushes": ("counter", ("host",), "rate-factor messages (LRC) the agent answered"),
    "bwfabric_rate_pump_failures": ("counter", (), "rate-factor requests of the rate pump that failed (the session "
                                    "reconnects)"),
    "bwfabric_rate_pump_errors": ("counter", (), "bugs the rate pump caught and survived (logged with a traceback)"),
    "bwfabric_agent_class_bytes": ("counter", ("host", "class"), "bytes sent through an agent's HTB class"),
    "bwfabric_lrc_rounds": ("counter", (), "LRC controller rounds run (one per tau_r)"),
    "bwfabric_lrc_pairs": ("gauge", (), "VM-pairs LRC is controlling (reported open by the agents)"),
    "bwfabric_lrc_delay_seconds": ("gauge", (), "LRC's measured delay: port statistics asked -> the agent's "
                                   "reply to that round's factors (running average)"),
    "bwfabric_lrc_link_factor_bytes_per_second": ("gauge", ("src", "dst"), "LRC's link factor r_l: the rate "
                                                  "per unit of pair weight on the link from src to dst"),
    "bwfabric_config_overlay_set_aside": ("gauge", (), "1 if this controller started without part of the API's "
                                          "persisted changes (they no longer fit; kept in a side file)"),
    "bwfabric_api_persist_errors": ("counter", (), "accepted API changes that could not be written to the state "
                                    "file (refused, nothing changed)"),
    "bwfabric_api_requests": ("counter", ("code",), "API requests answered, by HTTP status code"),
    "bwfabric_metrics_provider_errors": ("counter", ("provider",), "metrics providers that raised or yielded a "
                                         "malformed sample (dropped from the scrape)"),
    "bwfabric_agent_report_refusals": ("counter", ("host",), "agent replies or reports refused as malformed "
                                       "(the host's data is left out; everyone else goes on)"),
    "bwfabric_admission_headroom_bytes_per_second": ("gauge", ("cut",), "mu x capacity minus the guarantees "
                                                     "that can cross a cut (admission control)"),
}

Provider = Callable[[], Iterable[tuple[str, dict, float]]]   # (name, labels, value)


class Collector:
    """Providers yield (metric name, labels, value); the collector groups
    them into families by the catalogue. A provider that raises is logged
    and counted; the scrape goes on without it."""

    def __init__(self):
        self.providers: dict[str, Provider] = {}
        self.lock = threading.Lock()
        self.provider_errors: dict[str, int] = {}

    def register(self, name: str, fn: Provider) -> None:
        with self.lock:
            self.providers[name] = fn

    def samples(self) -> list[tuple[str, dict, float]]:
        """Every provider's samples that are well formed; a provider that
        raises loses its samples this scrape, a malformed sample (an
        undeclared name, other labels, a value that is not a finite number)
        is dropped -- both counted per provider and logged, never a failed
        scrape for everyone."""
        with self.lock:
            providers = list(self.providers.items())
        out = []
        for name, fn in providers:
            try:
                got = list(fn())
            except Exception:  # noqa: BLE001 - one broken provider must not break the scrape
                self._error(name)
                log.exception("metrics provider %s failed", name)
                continue
            for sample in got:
                problem = sample_problem(sample)
                if problem:
                    self._error(name)
                    log.warning("metrics provider %s: sample dropped: %s", name, problem)
                else:
                    out.append(sample)
        with self.lock:
            errors = dict(self.provider_errors)
        out.extend(("bwfabric_metrics_provider_errors", {"provider": n}, v) for n, v in sorted(errors.items()))
        return out

    def _error(self, name: str) -> None:
        with self.lock:
            self.provider_errors[name] = self.provider_errors.get(name, 0) + 1

    def collect(self):
        families: dict[str, object] = {}
        for name, labels, value in self.samples():
            kind, label_names, help_ = CATALOGUE[name]
            fam = families.get(name)
            if fam is None:
                cls = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily, "info": InfoMetricFamily}[kind]
                fam = families[name] = (cls(name, help_, labels=label_names) if kind != "info"
                                        else cls(name, help_, labels=()))
            if kind == "info":
                fam.add_metric([], {k: str(v) for k, v in labels.items()})
            else:
                fam.add_metric([str(labels[k]) for k in label_names], float(value))
        yield from families.values()


def sample_problem(sample) -> str | None:
    """Why a provider's sample cannot be exported (None: it can)."""
    if not (isinstance(sample, tuple) and len(sample) == 3):
        return f"not a (name, labels, value) triple: {sample!r:.80}"
    name, labels, value = sample
    if name not in CATALOGUE:
        return f"{name!r:.80} is not a declared metric"
    kind, label_names, _ = CATALOGUE[name]
    if not isinstance(labels, dict) or (kind != "info" and set(labels) != set(label_names)):
        return f"{name}: labels {labels!r:.80} are not {list(label_names)}"
    if kind != "info" and not finite_number(value):
        return f"{name}{labels!r:.80}: value {value!r:.40} is not a finite number"
    if kind == "counter" and value < 0:
        return f"{name}{labels!r:.80}: counter value {value!r} is negative"
    return None


COLLECTOR = Collector()


def register(name: str, fn: Provider) -> None:
    """An app's provider (replacing one of the same name)."""
    COLLECTOR.register(name, fn)


def registry() -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(COLLECTOR)
    return reg


def reference_markdown() -> str:
    """``docs/metrics.md``: every metric of :data:`CATALOGUE`."""
    lines = ["# Metrics reference", "",
             "Generated from `controller/metrics.py` by `bwfabric config-reference --metrics`; do not edit.", "",
             "`GET /metrics` on the API listener (Prometheus text format, no token: bind the API to a management",
             "address). Counters carry `_total`; rates are bytes per second.", "",
             "| metric | type | labels | meaning |", "|---|---|---|---|"]
    for name, (kind, labels, help_) in CATALOGUE.items():
        shown = name + ("_total" if kind == "counter" else "_info" if kind == "info" else "")
        lines.append(f"| `{shown}` | {kind} | {', '.join(labels) or '-'} | {help_} |")
    return "\n".join(lines)
