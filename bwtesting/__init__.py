"""Fakes and reference models the tests, benchmarks and experiments check the
product against; the product never imports them (tests/unit/test_architecture.py).

- ``fakenet``: OpenFlow switches simulated in memory (flow tables, groups,
  meters, statistics), driven by the apps' real messages;
- ``lp``: exact references for PMPT (the LP, and the one-path MILP; PuLP + HiGHS);
- ``coupled_models``: the coupled congestion controls' window rules in Python,
  which the BPF programs are held to;
- ``lrc_reference``: LRC's Algorithm 1 event by event.
"""
