"""LESSOR (Liu et al., FITEE 2016): PRE + PMPT, and the Hedera baseline.

Pure logic, no os-ken:
- ``pre``: Algorithm 1 (CPU-adaptive polling period), Eq. 4 rate prediction,
  short/long classification, link loads and ToR-pair available bandwidth;
- ``paths``: the path dictionary of candidate ToR-pair paths;
- ``pmpt``: the primal-dual FPTAS for the max-concurrent-flow LP, with a
  certified gap; ``placement`` and ``clos_coloring``: one path per flow;
- ``lp``: exact references (LP and one-path MILP, PuLP + HiGHS);
- ``hedera``: demand estimation and Global First Fit.

The controller side: ``logic`` and ``hedera_logic`` (pure: poll ToRs,
allocate, install) and their os-ken apps ``app`` (``lessor``) and
``hedera_app`` (``hedera``); the emulated experiments are
``experiments/lessor_eval.py`` and ``experiments/routing_comparison.py``.
"""
