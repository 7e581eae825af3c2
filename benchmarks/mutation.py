"""Mutation testing of the core modules with a maintained tool (mutmut 3,
issue #33 section 3): how many of the mutants of each module the unit
tests kill, and which survive. A benchmark-style run (hours for every
module, not part of CI):

    .venv/bin/pip install mutmut==3.8.1        # a development tool, not a runtime dependency
    .venv/bin/python -m benchmarks.mutation [--modules apps/lessor/pmpt.py,...] [--jobs 2] [--keep DIR]
    .venv/bin/python -m benchmarks.mutation --named     # the issue's twelve named mutants, each alone
    .venv/bin/python -m benchmarks.mutation --keep DIR --resume [--only 'apps.lessor.pmpt.*' ...]   # go on

Each run works in a scratch copy of the checkout (``git archive HEAD``:
what is committed, nothing else), configures mutmut there (setup.cfg:
every product package copied, only the chosen modules mutated, the unit
tests as the test selection -- mutmut runs them once to learn which tests
reach each function, then only those per mutant) and prints, per module,
mutants, killed, the kill rate, and every survivor by name (``mutmut show
NAME`` in the kept directory prints its diff). mutmut 3 mutates inside
functions only (module-level constants are never mutated).

Statuses other than killed and survived (no tests reach the function,
timeout, suspicious) are counted apart and listed: a timeout is a mutant
the tests noticed (an endless loop), "no tests" is code no unit test runs.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the modules issue #33 names as the core
CORE = ("controller/admission.py", "controller/config.py", "controller/portstats.py", "controller/api.py",
        "hostagent/agent.py", "bwcommon/channel.py", "hostagent/plan.py", "apps/lessor/pmpt.py",
        "apps/lessor/pre.py", "bwcommon/lrc.py", "apps/lrc/control.py", "hostagent/pair_rates.py",
        "apps/prio_queues/logic.py")
PACKAGES = ("apps", "benchmarks", "bwcommon", "bwfabric", "bwtesting", "controller", "experiments", "hostagent",
            "mininet_topos")
# what the unit tests read besides the packages (mutmut runs them inside its mutants/ copy)
ALSO_COPY = ("examples/", "docs/", ".ci/", "README.md", "pyproject.toml", "requirements.txt", "pytest.ini", "bwfabric.sh")
TARGET_KILL_RATE = 0.90
# tests of the source text rather than behaviour: in mutmut's copy every mutated module imports mutmut's
# trampoline, which the layering test rightly calls a foreign dependency, and the named mutants' texts
# appear once per trampoline copy -- they run in the suite, not here
# and the LESSOR fuzz run, whose outcome depends on which of the app's timers fire between two fuzzed
# events -- how fast the code runs, which mutmut's trampolines change (its module's text says more)
# and the rate pump's tests (no core module is theirs; real agents on real sockets, in real time: twice one
# failed mutmut's clean run, on a machine busy with the pass and a benchmark)
NOT_UNDER_MUTATION = ("tests/unit/test_architecture.py", "tests/unit/test_mutation_harness.py",
                      "tests/unit/test_lessor_fuzz_property.py", "tests/unit/test_ratepump.py")
# issue #33's twelve subtle mutants that survived the unit tests on 2026-11-26 (an operator flipped, a term
# dropped): (what it breaks, module, the text replaced, its replacement, the unit tests that must kill it)
NAMED = (
    ("admission's pod cut counts intra-pod links", "controller/admission.py",
     "if n not in hosts and n not in members))", "if n not in hosts))", "tests/unit/test_admission.py"),
    ("the agent accepts an older version within a generation", "hostagent/agent.py",
     "and version < self.version:", "and version < 0:", "tests/unit/test_agent_state.py tests/unit/test_agent_rounds.py"),
    ("the agent forgets its persisted generation on restart", "hostagent/agent.py",
     "self.max_generation = _read_int(self.generation_file)", "self.max_generation = 0",
     "tests/unit/test_agent_state.py tests/unit/test_agent_rounds.py"),
    ("non-adjacent duplicate YAML keys pass", "controller/config.py",
     "            seen.add(key)\n", "            seen = {key}\n", "tests/unit/test_config.py"),
    ("PMPT stops at 1 - 2 epsilon", "apps/lessor/pmpt.py",
     "if best[0] >= (1 - epsilon) * best_ub:", "if best[0] >= (1 - 2 * epsilon) * best_ub:",
     "tests/unit/test_pmpt.py"),
    ("the host's v is not capped at the NIC", "hostagent/pair_rates.py",
     "p.v_floor_mbps,\n                                    self.nic_mbps)",
     "p.v_floor_mbps,\n                                    float('inf'))", "tests/unit/test_lrc_host.py tests/unit/test_lrc_model.py"),
    ("the factor floor over min(w) instead of the sum of w", "apps/lrc/control.py",
     "self.params.factor_floor * mu_c / sum(ws)", "self.params.factor_floor * mu_c / min(ws)",
     "tests/unit/test_lrc_model.py"),
    ("a port-counter reset read as negative load", "controller/portstats.py",
     "if dt <= 0 or tx < before.tx_bytes or rx < before.rx_bytes or", "if dt <= 0 or",
     "tests/unit/test_portstats.py"),
    ("per-pair slots renumbered: kept slots dropped", "hostagent/plan.py",
     "out = {d: previous[d] for d in dsts if d in previous and 0 <= previous[d] < MAX_PAIRS}", "out = {}",
     "tests/unit/test_agent_plan.py"),
    ("per-pair slots renumbered: a kept slot 0 dropped", "hostagent/plan.py",
     "if d in previous and 0 <= previous[d] < MAX_PAIRS}", "if d in previous and 0 < previous[d] < MAX_PAIRS}",
     "tests/unit/test_agent_plan.py"),
    ("ESE closes a connection's first subflow", "bwtesting/coupled_models.py",
     "if sub == self.ref_sub or first:", "if sub == self.ref_sub:", "tests/unit/test_coupled_models.py"),
    ("ESE's candidate boundary", "bwtesting/coupled_models.py",
     "if samples > self.candidates:", "if samples >= self.candidates:", "tests/unit/test_coupled_models.py"),
)
_RESULT = re.compile(r"^\s*(?P<name>[\w.]+__mutmut_\d+):\s*(?P<status>.+?)\s*$")


def setup_cfg(modules: list[str], tests: str) -> str:
    lines = ["[mutmut]", "source_paths=", *(f"    {p}/" for p in PACKAGES), "only_mutate=",
             *(f"    {m}" for m in modules), "also_copy=", *(f"    {p}" for p in ALSO_COPY),
             "pytest_add_cli_args_test_selection=", f"    {tests}",
             "pytest_add_cli_args=", "    -p", "    no:cacheprovider", "    -q",
             *(f"    --ignore={t}" for t in NOT_UNDER_MUTATION)]
    return "\n".join(lines) + "\n"


def module_of(mutant: str, modules: list[str]) -> str:
    """The module path a mutant name (``controller.admission.x_cuts__mutmut_3``) belongs to."""
    dotted = {m[:-3].replace("/", "."): m for m in modules}
    for prefix in sorted(dotted, key=len, reverse=True):
        if mutant.startswith(prefix + "."):
            return dotted[prefix]
    return "?"


def parse_results(text: str, modules: list[str]) -> dict[str, dict[str, list[str]]]:
    """{module: {status: [mutant names]}} from ``mutmut results --all true``."""
    out: dict[str, dict[str, list[str]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for line in text.splitlines():
        m = _RESULT.match(line)
        if m:
            out[module_of(m["name"], modules)][m["status"]].append(m["name"])
    return out


def table(results: dict[str, dict[str, list[str]]], modules: list[str]) -> list[str]:
    lines = [f"{'module':<32}{'mutants':>8}{'killed':>8}{'survived':>9}{'other':>7}{'kill rate':>10}"]
    for mod in modules:
        by = results.get(mod, {})
        total = sum(len(v) for v in by.values())
        killed, survived = len(by.get("killed", [])), len(by.get("survived", []))
        rate = killed / (killed + survived) if killed + survived else float("nan")
        mark = "" if rate != rate or rate >= TARGET_KILL_RATE else "  < target"
        lines.append(f"{mod:<32}{total:>8}{killed:>8}{survived:>9}{total - killed - survived:>7}{rate:>10.1%}{mark}")
    return lines


def run(modules: list[str], jobs: int, keep: Path | None, resume: bool = False, only: list[str] = ()) -> int:
    """A pass in a fresh copy of HEAD; or, with ``resume``, the mutants of
    ``keep`` (an earlier pass's copy, its code and tests as they were) not
    run yet -- those matching ``only`` (mutmut's names, ``*`` wildcards)."""
    work = Path(tempfile.mkdtemp(prefix="bwf-mutation-")) if keep is None else keep
    if not resume:
        work.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD"], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
        (work / "setup.cfg").write_text(setup_cfg(modules, "tests/unit"))
    t0 = time.monotonic()
    mutmut = [sys.executable, "-m", "mutmut"]
    # CI=true: Hypothesis's derandomized profile (tests/conftest.py) -- the examples that decide a mutant
    # killed are the same in the coverage pass, in every mutant's run and in the next pass
    env = {**os.environ, "CI": "true"}
    proc = subprocess.run([*mutmut, "run", "--max-children", str(jobs), *only], cwd=work, env=env)
    took = time.monotonic() - t0
    res = subprocess.run([*mutmut, "results", "--all", "true"], cwd=work, capture_output=True, text=True, env=env)
    results = parse_results(res.stdout, modules)
    print(f"mutmut run: exit {proc.returncode}, {took / 60:.1f} min, in {work}")
    print("\n".join(table(results, modules)))
    for mod in modules:
        for status, names in sorted(results.get(mod, {}).items()):
            if status != "killed":
                print(f"{mod} {status}: {' '.join(sorted(names))}")
    if keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return proc.returncode


def named(keep: Path | None) -> int:
    """Each of NAMED applied alone to a scratch copy of HEAD and its unit
    tests run (stopping at the first failure): killed, or SURVIVED. A
    mutant whose text is not found (the code moved) is said, not skipped."""
    work = Path(tempfile.mkdtemp(prefix="bwf-named-")) if keep is None else keep
    work.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
    env = {**os.environ, "CI": "true"}
    survived = 0
    print(f"{'mutant':<56}{'module':<30}{'result':>10}{'s':>6}")
    for what, module, old, new, tests in NAMED:
        path = work / module
        text = path.read_text()
        if text.count(old) != 1:
            print(f"{what:<56}{module:<30}{'NOT FOUND':>10}")
            survived += 1
            continue
        path.write_text(text.replace(old, new))
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests.split()],
                              cwd=work, env=env, capture_output=True, text=True)
        path.write_text(text)
        killed = proc.returncode == 1                  # a test failed (2-5: collection or usage errors)
        survived += not killed
        print(f"{what:<56}{module:<30}{'killed' if killed else 'SURVIVED':>10}{time.monotonic() - t0:>6.0f}")
    print(f"{len(NAMED) - survived} of {len(NAMED)} killed")
    if keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if survived else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modules", default=",".join(CORE), help="comma-separated module paths (default: the core)")
    ap.add_argument("--jobs", type=int, default=2, help="mutants tested at once")
    ap.add_argument("--keep", type=Path, default=None, help="work here and keep it (mutmut show NAME)")
    ap.add_argument("--resume", action="store_true", help="go on with --keep DIR's pass (its copy of the code "
                    "and tests): the mutants not run yet")
    ap.add_argument("--only", nargs="+", default=[], help="with --resume: only mutants matching these names "
                    "(e.g. 'apps.lessor.pmpt.*')")
    ap.add_argument("--named", action="store_true", help="only issue #33's twelve named mutants, each alone "
                    "(minutes, no mutmut needed)")
    args = ap.parse_args(argv)
    if args.named:
        return named(args.keep)
    modules = [m for m in args.modules.split(",") if m]
    missing = [m for m in modules if not (ROOT / m).is_file()]
    if missing or not modules or args.jobs < 1:
        ap.error(f"need existing module paths and --jobs >= 1 (missing: {', '.join(missing) or 'none'})")
    if args.resume and (args.keep is None or not (args.keep / "setup.cfg").is_file()):
        ap.error("--resume needs --keep DIR of an earlier pass")
    if args.only and not args.resume:
        ap.error("--only goes with --resume")
    try:
        import mutmut  # noqa: F401
    except ImportError:
        ap.error("mutmut is not installed: .venv/bin/pip install mutmut==3.8.1")
    return run(modules, args.jobs, args.keep, args.resume, args.only)


if __name__ == "__main__":
    sys.exit(main())
