"""LESSOR: CPU-adaptive polling (PRE) and FPTAS multipath allocation (PMPT).

Not implemented yet: tracked by issue #3. The table pipeline leaves room for
it (exact-match long-flow entries above the routing defaults in table 1).
"""
