"""benchmarks/pmpt_scale.py: the fabrics are what its docstring says, and
a run reports the decision PMPT made (not a figure: those it prints)."""

import numpy as np
import pytest

from benchmarks import pmpt_scale as B


def test_the_three_fabrics():
    equal, uneven, failed = (B.fabric(4, kind) for kind in B.FABRICS)
    assert np.all(equal.capacity == 10e6) and equal.view.version == 0
    assert np.all((uneven.capacity >= 3e6) & (uneven.capacity <= 10e6)) and len(set(uneven.capacity)) > 10
    down = [(u, v) for u, v in failed.links if not failed.view.link_up(u, v)]
    roles = {(failed.view.graph.nodes[u]["role"], failed.view.graph.nodes[v]["role"]) for u, v in down}
    assert len(down) == 2 * 12 and roles == {("aggregation", "core"), ("core", "aggregation")}
    with pytest.raises(ValueError, match="fabric 'flat'"):
        B.fabric(4, "flat")


def test_a_run_reports_the_decision_it_timed():
    r = B.run(4, "uneven", 16, warm=2)
    assert r["k"] == 4 and r["fabric"] == "uneven" and 0 < r["flows"] <= 16 and len(r["warm_s"]) == 2
    assert r["phases"] > 0 and r["stopped_by"] == "certified gap" and r["certified"] >= 0.95
    assert 0 < r["one_path_lambda"] <= r["bound"] and r["lambda"] <= r["bound"]
    # the link back (the run checks the answer is the first one again): only pairs whose paths can cross it
    # are walked again (6 of these 13)
    assert 0 < r["pairs_walked_at_repair"] < r["tor_pairs"], r
    equal = B.run(4, "equal", 16, warm=0)
    assert equal["phases"] == 0 and equal["certified"] == 1.0 and equal["warm_median_s"] is None
