from experiments.results import common_fct_stats


def test_common_fct_only_counts_flows_every_scheme_finished():
    runs = {
        "a": [{"id": 0, "fct": 1.0, "complete": True}, {"id": 1, "fct": 9.0, "complete": True},
              {"id": 2, "fct": 2.0, "complete": True}],
        "b": [{"id": 0, "fct": 2.0, "complete": True}, {"id": 1, "fct": None, "complete": False},
              {"id": 2, "fct": 4.0, "complete": True}],
    }
    s = common_fct_stats(runs)
    # flow 1 (slow under a, unfinished under b) is left out of both means
    assert s["a"]["mean_fct_s"] == 1.5 and s["b"]["mean_fct_s"] == 3.0
    assert s["a"]["common_flows"] == 2
    assert s["a"]["completed_fraction"] == 1.0 and s["b"]["completed_fraction"] == 2 / 3
