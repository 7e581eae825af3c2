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
    "bwfabric_packet_ins": ("counter", (), "PacketIns received (bwfabric installs rules proactively: expect 0)"),
    "bwfabric_openflow_messages_sent": ("counter", ("kind",), "OpenFlow messages sent to switches, by kind"),
    "bwfabric_switches_connected": ("gauge", (), "switches with a live OpenFlow connection"),
    "bwfabric_loop_errors": ("counter", ("loop",), "rounds of a periodic loop or handler that raised"),
    "bwfabric_refused_inputs": ("counter", ("kind",), "inputs refused at the OpenFlow boundary"),
    "bwfabric_tenant_guarantee_bytes_per_second": ("gauge", ("tenant", "vm", "host"), "a VM's hose guarantee"),
    "bwfabric_tenant_bg_rate_bytes_per_second": ("gauge", ("tenant", "vm", "host"),
                                                 "a VM's BG rate leaving its host (agent class counters)"),
    "bwfabric_tenant_wc_rate_bytes_per_second": ("gauge", ("tenant", "vm", "host"),
                                                 "a VM's WC rate leaving its host (agent class counters)"),
    "bwfabric_agent_connected": ("gauge", ("host",), "1 while the controller's session to the agent is up"),
    "bwfabric_agent_in_force": ("gauge", ("host",), "1 if the agent's kernel matches its configuration"),
    "bwfabric_agent_config_age_seconds": ("gauge", ("host",), "time since the agent last confirmed a push"),
    "bwfabric_agent_config_version": ("gauge", ("host",), "configuration version the agent confirmed"),
    "bwfabric_agent_pushes": ("counter", ("host",), "configurations the agent confirmed"),
    "bwfabric_agent_push_failures": ("counter", ("host",), "pushes that failed (connection, timeout)"),
    "bwfabric_agent_refusals": ("counter", ("host",), "pushes the agent refused"),
    "bwfabric_agent_connects": ("counter", ("host",), "connections the session made to the agent"),
    "bwfabric_agent_class_bytes": ("counter", ("host", "class"), "bytes sent through an agent's HTB class"),
    "bwfabric_lrc_rounds": ("counter", (), "LRC controller rounds run (one per tau_r)"),
    "bwfabric_lrc_pairs": ("gauge", (), "VM-pairs LRC is controlling (reported open by the agents)"),
    "bwfabric_lrc_delay_seconds": ("gauge", (), "LRC's measured delay: port statistics asked -> the agent's "
                                   "reply to that round's factors (running average)"),
    "bwfabric_lrc_link_factor_bytes_per_second": ("gauge", ("src", "dst"), "LRC's link factor r_l: the rate "
                                                  "per unit of pair weight on the link from src to dst"),
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
        with self.lock:
            providers = list(self.providers.items())
        out = []
        for name, fn in providers:
            try:
                out.extend(fn())
            except Exception:  # noqa: BLE001 - one broken provider must not break the scrape
                self.provider_errors[name] = self.provider_errors.get(name, 0) + 1
                log.exception("metrics provider %s failed", name)
        return out

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
