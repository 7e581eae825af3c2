"""Coupled MPTCP congestion control on emulated paths (issue #23): a
sender namespace A and a receiver B joined by paths, each a veth pair
through a delay line (mininet_topos.delayline) and a token bucket after
it (the path's rate and its drop-tail queue). Subflows are pinned to paths by source address
(policy routing on A): path i's addresses are 10.78.i.1, .11, .21, ...;
B answers on the path it was reached by.

- ``disjoint``: one path per subflow group -- path i carries the subflows
  from its addresses;
- ``shared``: one path whose token bucket every subflow (and a competing
  TCP flow, if asked) shares: a shared bottleneck.

A's congestion control is chosen as the product chooses it: the agent's
map bwf_ccsel (by the subflow's source address), read by bwf_sockops. The
BPF programs record every decision into bwf_cctrace when asked
(``trace=True``), and :func:`bwtesting.coupled_models.replay` checks them.

One module per experiment (``KINDS``), each with its options and their
defaults in its ``Config`` -- the one source that both
``bwfabric experiment coupled-KIND key=value`` and this package's command
read -- and the testbed they share (:mod:`experiments.coupled.testbed`).

    python -m experiments.coupled check [--seconds 8]       # the three controls against their models
    python -m experiments.coupled lia-shared                 # LIA vs one TCP flow on one bottleneck
    python -m experiments.coupled vm [--slices 30 120 480]   # LIA vs LIA-VM under VM scheduling
    python -m experiments.coupled ese                        # MPTCP-D's elimination, TP / FP
    python -m experiments.coupled plot KIND RESULT.json PNG  # a saved result's figure
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import typing

KINDS = {"check": "check", "lia-shared": "lia_shared", "throughput": "throughput", "vm": "vm", "ese": "ese",
         "cubic": "cubic", "transfer": "transfer", "weights": "weights", "gating": "gating",
         "short-rtt": "short_rtt", "vm-guest": "vm_guest"}


def module(kind: str):
    """The experiment ``kind``'s module (Config, measure, run, draw, HELP)."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: one of {', '.join(KINDS)}")
    return importlib.import_module(f"experiments.coupled.{KINDS[kind]}")


def _argument(parser: argparse.ArgumentParser, f: dataclasses.Field, hint) -> None:
    """``--name`` for one Config field; no default of its own (None: the
    Config's applies)."""
    flag = "--" + f.name.replace("_", "-")
    args = typing.get_args(hint)
    if hint is bool:
        parser.add_argument(flag, action="store_true", default=None, help=f"(default {f.default})")
    elif typing.get_origin(hint) is tuple:
        parser.add_argument(flag, type=args[0], nargs="+", default=None, help=f"(default {' '.join(map(str, f.default))})")
    else:
        kind = next((a for a in args if a is not type(None)), hint) if args else hint
        parser.add_argument(flag, type=kind, default=None, help=f"(default {f.default})")


def parse(argv=None) -> tuple[str, object, str | None] | tuple[str, list, None]:
    """(kind, its Config, the figure's path), or ("plot", [kind, result, png], None)."""
    ap = argparse.ArgumentParser(prog="python -m experiments.coupled")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for kind in KINDS:
        mod = module(kind)
        c = sub.add_parser(kind, help=mod.HELP)
        hints = typing.get_type_hints(mod.Config)
        for f in dataclasses.fields(mod.Config):
            _argument(c, f, hints[f.name])
        c.add_argument("--plot", metavar="PNG", help="write the figure here")
    c = sub.add_parser("plot", help="the figure of a saved result: plot KIND RESULT.json PNG")
    c.add_argument("what", choices=tuple(k for k in KINDS if module(k).draw is not None))
    c.add_argument("result")
    c.add_argument("png")
    args = ap.parse_args(argv)
    if args.cmd == "plot":
        return "plot", [args.what, args.result, args.png], None
    given = {k: (tuple(v) if isinstance(v, list) else v) for k, v in vars(args).items()
             if v is not None and k not in ("cmd", "plot")}
    return args.cmd, module(args.cmd).Config(**given), args.plot


def main(argv=None) -> None:
    from experiments.coupled import report
    kind, cfg, png = parse(argv)
    if kind == "plot":
        what, result, png = cfg
        with open(result) as f:
            report.figure(what, json.load(f), png, module(what).draw)
        return
    mod = module(kind)
    from hostagent import cc
    cc.load()
    out = mod.measure(cfg)
    print(json.dumps(out, indent=1, default=str))
    if png and mod.draw is not None:
        report.figure(kind, out, png, mod.draw)
