import pytest

from experiments import registry, results
from experiments.options import OptionError, parse_options
from experiments.routing_comparison import Config


def test_options_parse_and_reject():
    cfg = parse_options(Config, ["k=4", "apps=ecmp", "load=0.7", "workload=none", "link-mbps=5"])
    assert (cfg.apps, cfg.load, cfg.workload, cfg.link_mbps) == (("ecmp",), 0.7, None, 5.0)
    with pytest.raises(OptionError, match="unknown option 'colour'"):
        parse_options(Config, ["colour=red"])
    with pytest.raises(OptionError, match="load='high'"):
        parse_options(Config, ["load=high"])
    with pytest.raises(OptionError, match="load=1.5"):
        parse_options(Config, ["load=1.5"])
    with pytest.raises(OptionError, match="'ospf'"):
        parse_options(Config, ["apps=ospf"])
    with pytest.raises(OptionError, match="'ring'"):
        parse_options(Config, ["patterns=ring"])
    with pytest.raises(OptionError, match="topology='torus'"):
        parse_options(Config, ["topology=torus"])
    with pytest.raises(OptionError, match="servers_per_tor=0"):
        parse_options(Config, ["topology=vl2", "servers-per-tor=0"])


def test_fidelity_vl2_builds_the_scaled_vl2_and_its_strides_cross_tors():
    from controller.network_view import NetworkView
    from experiments.routing_comparison import FIDELITY_VL2, _pairs
    from mininet_topos import builders
    cfg = parse_options(Config, registry.default_items(FIDELITY_VL2))
    topo = builders.evaluation_fabric(cfg.topology, link_mbps=cfg.link_mbps, fabric_mbps=cfg.fabric_mbps,
                                      servers_per_tor=cfg.servers_per_tor)
    view = NetworkView(topo)
    assert (len(view.hosts), len(topo.switches)) == (20, 10)
    assert {lk.capacity_mbps for lk in topo.links if lk.a.startswith("h") or lk.b.startswith("h")} == {10.0}
    assert {lk.capacity_mbps for lk in topo.links
            if not (lk.a.startswith("h") or lk.b.startswith("h"))} == {25.0}
    for pattern in ("stride5", "stride10"):
        pairs = _pairs(pattern, view.hosts, 1)
        assert all(view.host_switch(s)[0] != view.host_switch(d)[0] for s, d in pairs), pattern
    with pytest.raises(ValueError, match="topology 'ring'"):
        builders.evaluation_fabric("ring")


def test_registry_rejects_unknown_experiment_and_bad_option(capsys, tmp_path):
    assert registry.run("nosuch", [], tmp_path) == 2
    assert "unknown experiment 'nosuch'" in capsys.readouterr().err
    assert registry.run("routing", ["load=2"], tmp_path) == 2
    assert "load=2.0" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())   # nothing started, nothing written


def test_percentile_and_mean():
    assert results.percentile([], 95) is None
    assert results.percentile([5], 95) == 5
    assert results.percentile(list(range(1, 101)), 95) == pytest.approx(95.05)
    assert results.percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)
    assert results.mean([1, 2, 3]) == 2
    stats = results.fct_stats([{"fct": 1.0, "complete": True}, {"fct": None, "complete": False},
                               {"fct": 3.0, "complete": True}])
    assert stats["completed"] == 2 and stats["mean_fct_s"] == 2.0 and stats["flows"] == 3


def test_window_bytes_splits_boundary_slots():
    from experiments.traffic import window_bytes
    slots = [100, 100, 100, 100]          # 0.1 s slots starting 0.05 s before t0
    assert window_bytes(slots, 0.1, -0.05, (0.0, 10.0)) == pytest.approx(350)
    assert window_bytes(slots, 0.1, -0.05, (0.1, 0.2)) == pytest.approx(100)
    assert window_bytes(slots, 0.1, 0.0, (1.0, 2.0)) == 0


def test_lessor_sweep_resume_refuses_other_settings_and_never_overwrites(tmp_path):
    import json
    from experiments.lessor_eval import Config, _load_previous
    from experiments.options import OptionError
    cfg = Config(resume=True)
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"identity": {**json.loads(json.dumps(cfg.identity())), "duration": 99.0},
                                "runs": {"1/0.5/ecmp": {}}}))
    with pytest.raises(OptionError, match="duration: 99.0 there, 20.0 now"):
        _load_previous(path, cfg)
    assert json.loads(path.read_text())["runs"] == {"1/0.5/ecmp": {}}      # untouched
    path.write_text(json.dumps({"identity": json.loads(json.dumps(cfg.identity())), "runs": {"1/0.5/ecmp": {"x": 1}}}))
    assert _load_previous(path, cfg) == {"1/0.5/ecmp": {"x": 1}}
    assert _load_previous(path, Config(resume=False)) == {}


def test_every_registered_experiment_parses_its_own_defaults():
    from experiments.options import parse_options
    from experiments.registry import EXPERIMENTS, default_items
    for name, (module, overrides, _) in EXPERIMENTS.items():
        cfg = parse_options(module.Config, default_items(overrides))
        for k, v in overrides.items():
            assert getattr(cfg, k) == v, (name, k)


@pytest.mark.parametrize("item,phrase", [("load=nan", "finite"), ("load=inf", "finite"), ("k=2.5", "integer"),
                                         ("mptcp=maybe", "boolean"), ("seed=", "integer")])
def test_non_finite_and_mistyped_options_are_refused_by_name(item, phrase):
    with pytest.raises(OptionError, match=f"option {item.split('=')[0]}=.*{phrase}"):
        parse_options(Config, [item])
