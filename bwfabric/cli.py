"""``bwfabric``: one command for the controller, topologies, config checks and
experiments."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _parse_params(items: list[str]) -> dict:
    params = {}
    for item in items:
        if "=" not in item:
            raise SystemExit(f"bwfabric: --param {item!r}: expected KEY=VALUE")
        key, value = item.split("=", 1)
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    return params


def cmd_controller(args) -> int:
    from controller import config, launcher
    try:
        if args.config:
            if args.topology:
                raise ValueError("give --config or --topology/--apps, not both")
            loaded = config.load(args.config, salvage=True)
        elif args.topology:
            loaded = launcher.shorthand(args.topology, (args.apps or "ecmp").split(","), of_port=args.of_port,
                                        listen_host=args.listen, log_level=args.log_level,
                                        tls={"key": args.of_tls_key, "cert": args.of_tls_cert,
                                             "ca": args.of_tls_ca})
        else:
            raise ValueError("give --config FILE (or --topology FILE --apps NAMES)")
        launcher.run(loaded)
    except config.ConfigError as exc:
        print("bwfabric controller: refused, nothing started:\n  " + "\n  ".join(exc.problems), file=sys.stderr)
        return 2
    except (ValueError, launcher.ListenError) as exc:
        print(f"bwfabric controller: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_topology(args) -> int:
    from mininet_topos import builders
    try:
        topo = builders.build(args.kind, **_parse_params(args.param))
    except (TypeError, ValueError) as exc:
        print(f"bwfabric topology: {exc}", file=sys.stderr)
        return 2
    if args.output == "-":
        print(json.dumps(topo.to_dict(), indent=1))
    else:
        topo.save(args.output)
        print(f"wrote {args.output}: {len(topo.switches)} switches, {len(topo.hosts)} hosts, "
              f"{len(topo.links)} links")
    return 0


def cmd_check_config(args) -> int:
    """Configuration files (YAML, with admission control) and topology
    descriptions (*.json): every problem with its path; exit 1 if any."""
    from controller.topology import TopologyDescription, TopologyError
    status = 0
    if args.builtin:
        from mininet_topos import builders
        for kind in builders.BUILDERS:
            topo = builders.build(kind)
            TopologyDescription.from_dict(json.loads(json.dumps(topo.to_dict())))
            print(f"ok: built-in {kind} ({len(topo.switches)} switches, {len(topo.hosts)} hosts)")
    elif not args.files:
        print("bwfabric check-config: name one or more files (or --builtin)", file=sys.stderr)
        return 2
    for path in args.files:
        if path.endswith(".json"):
            try:
                topo = TopologyDescription.load(path)
            except TopologyError as exc:
                print("\n".join(f"{path}: {p}" for p in exc.problems), file=sys.stderr)
                status = 1
                continue
            print(f"ok: {path} ({len(topo.switches)} switches, {len(topo.hosts)} hosts, "
                  f"{len(topo.links)} links)")
            continue
        status = max(status, _check_config_file(path))
    return status


def _check_config_file(path: str) -> int:
    from controller import admission, config
    try:
        loaded = config.load(path)
    except config.ConfigError as exc:
        print("\n".join(p if p.startswith(path) else f"{path}: {p}" for p in exc.problems), file=sys.stderr)
        try:       # what a controller starting now would do: the operator's file, the overlay's misfits set aside
            salvaged = config.load(path, salvage=True)
        except config.ConfigError:
            return 1
        if salvaged.set_aside is not None:
            print(f"{path}: a controller starting now would start without part of the API's changes: "
                  f"{salvaged.set_aside.describe()}", file=sys.stderr)
        return 1
    guarantees = loaded.guarantees()
    rows = admission.headroom(loaded.topology, guarantees, loaded.cfg.admission.mu)
    tight = max(rows, key=lambda r: r["crossing_mbps"] / r["limit_mbps"]) if rows else None
    print(f"ok: {path} (config {loaded.digest}: {len(loaded.topology.switches)} switches, "
          f"{len(loaded.topology.hosts)} hosts, {len(loaded.cfg.tenants)} tenants, {len(loaded.vms())} VMs; "
          f"{len(rows)} cuts admitted" + (f", tightest {tight['cut']} at {tight['crossing_mbps']:g} of "
                                          f"{tight['limit_mbps']:g} Mb/s" if tight else "") + ")")
    return 0


def _api(args):
    from bwfabric.client import ApiClient
    import os
    path = args.config or os.environ.get("BWFABRIC_CONFIG") or "/etc/bwfabric/bwfabric.yaml"
    return ApiClient.from_config(path)


def cmd_status(args) -> int:
    """The controller's state as tables, over its API."""
    from bwfabric.client import ApiClientError, status_text
    try:
        api = _api(args)
        status, agents, tenants = api.get("/v1/status"), api.get("/v1/agents"), api.get("/v1/tenants")
    except (ApiClientError, OSError) as exc:
        print(f"bwfabric status: {exc}", file=sys.stderr)
        return 2
    print(status_text(status, agents["agents"], tenants["tenants"]))
    return 0


def cmd_tenants(args) -> int:
    """List, show, put (from a JSON/YAML file) or delete a tenant, over the API."""
    import yaml

    from bwfabric.client import ApiClientError, table
    try:
        api = _api(args)
        if args.action == "list":
            tenants = api.get("/v1/tenants")["tenants"]
            print(table([[t, len(v["vms"]), sum(vm["guarantee_mbps"] for vm in v["vms"].values()), v["policy"]]
                         for t, v in sorted(tenants.items())], ["tenant", "VMs", "guarantees Mb/s", "policy"]))
            return 0
        if not args.name:
            raise ApiClientError(f"tenants {args.action}: name a tenant")
        if args.action == "show":
            print(json.dumps(api.get(f"/v1/tenants/{args.name}"), indent=1))
        elif args.action == "delete":
            print(json.dumps(api.delete(f"/v1/tenants/{args.name}")))
        else:
            if not args.file:
                raise ApiClientError("tenants put: give the tenant's definition (--file, JSON or YAML)")
            print(json.dumps(api.put(f"/v1/tenants/{args.name}", yaml.safe_load(Path(args.file).read_text()))))
    except (ApiClientError, OSError) as exc:
        print(f"bwfabric tenants: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_reload(args) -> int:
    from bwfabric.client import ApiClientError
    try:
        print(json.dumps(_api(args).call("POST", "/v1/reload")))
    except (ApiClientError, OSError) as exc:
        print(f"bwfabric reload: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_config_reference(args) -> int:
    if args.metrics:
        from controller import metrics
        print(metrics.reference_markdown())
    else:
        from controller import config
        print(config.reference_markdown())
    return 0


def cmd_agent(args) -> int:
    import logging

    from hostagent import agent
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s agent[{args.host}] %(levelname)s %(message)s")
    return agent.main(args.host, args.key_file, args.listen, args.state_dir, load_cc=args.load_cc,
                      bpf_dir=args.bpf_dir)


def cmd_agent_key(args) -> int:
    """Derive one host's agent key from the controller's master secret."""
    from bwcommon.channel import ChannelError, host_key, load_secret, write_secret
    try:
        if args.new_master:
            import secrets
            write_secret(args.master, secrets.token_hex(32) + "\n")   # 0600 from creation; never overwrites
        master = load_secret(args.master, private=True)
    except (OSError, ChannelError) as exc:
        print(f"bwfabric agent-key: {exc}", file=sys.stderr)
        return 2
    for host in args.hosts:
        print(f"{host} {host_key(master, host).hex()}" if len(args.hosts) > 1 else host_key(master, host).hex())
    return 0


def _interrupt(*_):
    raise KeyboardInterrupt


def cmd_experiment(args) -> int:
    import signal

    from experiments import registry
    # SIGTERM (and SIGINT even when started in the background, where it is
    # ignored) unwind like Ctrl-C: the fabric and the controller are torn down
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    return registry.run(args.name, args.option + args.options, Path(args.out))


def cmd_simulate(args) -> int:
    if args.name == "fabric":
        from experiments.flowsim import command as flowsim
        return flowsim.main(args.set, Path(args.out), args.json)
    if args.name == "bgwc-fig19":
        from experiments.flowsim import shuffle
        return shuffle.main(Path(args.out), args.set, args.json)
    if args.name == "fabric-validate-ns3":
        from experiments.flowsim import ns3check
        return ns3check.main(args.set, Path(args.out), args.json)
    if args.name == "fabric-validate":
        from experiments.flowsim import validate
        return validate.main(([args.scenario] if args.scenario else []) + args.more, Path(args.out), args.json)
    from experiments.lrcsim import command
    if args.set:
        print("bwfabric simulate: --set is for 'fabric' runs", file=sys.stderr)
        return 2
    if args.name == "lrc":
        if not args.scenario:
            print("bwfabric simulate lrc: give a scenario file (YAML or JSON; see docs/lrc.md)", file=sys.stderr)
            return 2
        return command.scenario(args.scenario, args.json)
    return command.figure(args.name, Path(args.out), args.delay, args.tau_ms, args.json)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bwfabric", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("controller", help="run the controller (apps on os-ken, agent sessions, API)")
    c.add_argument("--config", help="the configuration (YAML); see docs/config.md")
    c.add_argument("--topology", help="shorthand without a config file: a topology description (JSON)...")
    c.add_argument("--apps", help="...and apps, comma-separated: a routing app (single_path, ecmp, lessor, "
                   "hedera) and optionally prio_queues; the options below apply to the shorthand only")
    c.add_argument("--of-port", type=int, default=6653)
    c.add_argument("--listen", default="127.0.0.1")
    c.add_argument("--log-level", default="INFO")
    c.add_argument("--of-tls-key", help="OpenFlow over TLS: the controller's private key (mode 600)")
    c.add_argument("--of-tls-cert", help="OpenFlow over TLS: the controller's certificate")
    c.add_argument("--of-tls-ca", help="OpenFlow over TLS: CA certificate that signed the switches' certificates")
    c.set_defaults(func=cmd_controller)

    t = sub.add_parser("topology", help="write a built-in topology description")
    t.add_argument("kind", help="fattree, vl2, lessor-testbed, bgwc-testbed, star")
    t.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="builder parameter, e.g. k=4 or link_mbps=10")
    t.add_argument("-o", "--output", default="-")
    t.set_defaults(func=cmd_topology)

    k = sub.add_parser("check-config", help="check configurations (YAML, with admission control) and topology "
                       "descriptions (.json) without starting anything")
    k.add_argument("files", nargs="*")
    k.add_argument("--builtin", action="store_true", help="also check the built-in topologies")
    k.set_defaults(func=cmd_check_config)

    for name, fn, help_ in (("status", cmd_status, "the controller's configuration, tenants and agents (API)"),
                            ("reload", cmd_reload, "make the controller read its configuration file again (API)")):
        q = sub.add_parser(name, help=help_)
        q.add_argument("--config", help="the controller's configuration (default $BWFABRIC_CONFIG or "
                       "/etc/bwfabric/bwfabric.yaml): where its API listens and its token")
        q.set_defaults(func=fn)
    q = sub.add_parser("tenants", help="list, show, put or delete tenants (API)")
    q.add_argument("action", choices=("list", "show", "put", "delete"))
    q.add_argument("name", nargs="?")
    q.add_argument("--file", help="put: the tenant (JSON or YAML: policy, wc_subflows, vms)")
    q.add_argument("--config", help="the controller's configuration (as for status)")
    q.set_defaults(func=cmd_tenants)

    r = sub.add_parser("config-reference", help="print the configuration reference (docs/config.md)")
    r.add_argument("--metrics", action="store_true", help="the metrics reference instead (docs/metrics.md)")
    r.set_defaults(func=cmd_config_reference)

    e = sub.add_parser("experiment", help="run an emulated experiment (default: the main job)")
    e.add_argument("name", nargs="?", default="main")
    e.add_argument("options", nargs="*", metavar="KEY=VALUE", help="experiment options, e.g. loads=0.5,0.7")
    e.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="experiment option (same as a positional KEY=VALUE)")
    e.add_argument("--out", default="results", help="directory for JSON and PNG results")
    e.set_defaults(func=cmd_experiment)

    m = sub.add_parser("simulate", help="simulate: a fabric at flow level with the product's routing in the loop "
                       "(fabric --set KEY=VALUE ...), checked against emulated runs (fabric-validate RESULTS...) and against ns-3 "
                       "(fabric-validate-ns3 --set ...), seed 000's Figs. 19-20 at 400 hosts (bgwc-fig19), LRC from a scenario file (lrc SCENARIO) or a paper figure "
                       "(lrc-fig8, lrc-fig9, lrc-fig10, lrc-fig11, lrc-delay-table, lrc-validate)")
    m.add_argument("name")
    m.add_argument("scenario", nargs="?", help="lrc: the scenario (YAML or JSON); fabric-validate: emulated results")
    m.add_argument("more", nargs="*", help="fabric-validate: more emulated results")
    m.add_argument("--json", action="store_true", help="print the summary as JSON")
    m.add_argument("--out", default="results/simulate", help="figures: directory for JSON and PNG results")
    m.add_argument("--delay", type=float, default=None, help="figures: stats-to-host delay (s)")
    m.add_argument("--tau-ms", type=float, default=None, help="figures: τ_v = τ_r = this (the paper's '15 ms')")
    m.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="fabric: k, link_mbps, routings (single_path,ecmp,hedera,lessor), loads, seconds, drain, "
                   "warmup, seed, workload, window_ms, vms_per_host, cpu (measured or a share), rtt_ms; "
                   "fabric-validate-ns3: k, link_mbps, loads, seconds, warmup, drain, seed, workload, link_delay_us, "
                   "queue_packets, ecn_k, mss, tcp, min_rto_ms, delack_ms, init_cwnd, buf_bytes, ns3_python; bgwc-fig19: "
                   "seed, jobs, arrival_per_s, window_ms, max_tasks")
    m.set_defaults(func=cmd_simulate)

    a = sub.add_parser("agent", help="run the host agent (in the host's network namespace)")
    a.add_argument("--host", required=True, help="this host's name in the topology")
    a.add_argument("--key-file", required=True, help="this host's key (hex), from bwfabric agent-key")
    a.add_argument("--listen", required=True, help="unix:/path or tcp:ADDR:PORT")
    a.add_argument("--state-dir", required=True, help="replay guard and undo state")
    a.add_argument("--bpf-dir", default=None,
                   help="where the WC congestion control's maps are pinned (default /run/bwfabric/bpf)")
    a.add_argument("--load-cc", action="store_true",
                   help="build/load the BPF congestion control and sock_ops program (once per machine)")
    a.set_defaults(func=cmd_agent)

    k = sub.add_parser("agent-key", help="derive hosts' agent keys from the master secret")
    k.add_argument("--master", required=True, help="master secret file (hex)")
    k.add_argument("--new-master", action="store_true", help="first write a new random master secret there")
    k.add_argument("hosts", nargs="+")
    k.set_defaults(func=cmd_agent_key)
    return p


# what each command needs installed beyond the base (the agent's) install: pyproject.toml's extras
COMMAND_EXTRA = {"controller": "controller", "topology": "controller", "check-config": "controller",
                 "config-reference": "controller", "experiment": "emulation", "simulate": "emulation"}
OUR_PACKAGES = {"bwcommon", "hostagent", "controller", "apps", "bwfabric", "bwtesting", "mininet_topos",
                "experiments", "benchmarks"}


def missing_extra(command: str, exc: ModuleNotFoundError) -> str | None:
    """The hint for a command whose role's packages are not installed (a
    third-party module missing), None for anything else."""
    top = (exc.name or "").split(".")[0]
    if not top or top in OUR_PACKAGES:
        return None
    extra = COMMAND_EXTRA.get(command)
    where = f"pip install 'bwfabric[{extra}]'" if extra else "pip install bwfabric"
    return (f"bwfabric {command}: needs {top!r}, which this installation lacks; this command is the "
            f"{extra or 'agent'} role's: {where} (docs/deploy.md)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ModuleNotFoundError as exc:
        hint = missing_extra(args.command, exc)
        if hint is None:
            raise
        print(hint, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
