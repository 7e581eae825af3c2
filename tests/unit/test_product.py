"""The main job's pure parts: its tenants are admitted on its fabric, and
the lowest-1-s-window figure it prints is computed as it says."""

from pathlib import Path

import pytest

from controller import config
from experiments import product, registry
from mininet_topos import builders


def test_the_main_jobs_tenants_are_admitted_and_fill_the_mixed_tors(tmp_path):
    cfg = product.Config()
    builders.fattree(4, link_mbps=cfg.link_mbps, fabric_mbps=cfg.fabric_mbps).save(tmp_path / "topology.json")
    (tmp_path / "bwfabric").mkdir()
    loaded = config.load(product.write_config(cfg, tmp_path / "bwfabric", "bwfabric"))
    assert len(loaded.vms()) == 16 and loaded.cfg.controller.routing == "lessor"
    from controller import admission
    rows = {r["cut"]: r for r in admission.headroom(loaded.topology, {h: v.guarantee_mbps for h, (_, _, v) in
                                                                     loaded.vms().items()}, 0.9)}
    assert rows["ToR e0_0 uplinks"]["capacity_mbps"] == 10.0       # two 5 Mb/s uplinks for two 10 Mb/s hosts
    assert config.load(product.write_config(cfg, tmp_path / "bwfabric", "ecmp")).cfg.tenants == {}


def test_lowest_window_and_mean_of_a_vm():
    rates = [{"t": 0.5 * i, "bg-h1": v, "wc-h1": 1.0, "bg-h2": 9.0} for i, v in enumerate([4, 4, 0, 4, 4, 4])]
    low, mean = product.vm_rates(rates, "h1", 1.0, 0.0, 10.0)
    # samples after t=0: 4, 0, 4, 4, 4 (+1 WC each); 1 s windows of two samples: 3, 3, 5, 5
    assert low == pytest.approx(3.0) and mean == pytest.approx(1 + 16 / 5)


def test_bad_options_are_refused_before_anything_starts(capsys, tmp_path):
    assert registry.run("main", ["web_load=2"], tmp_path) == 2
    assert "web_load" in capsys.readouterr().err
    assert registry.run("main", ["schemes=ospf"], tmp_path) == 2


def test_a_relative_results_directory_gives_absolute_agent_addresses(tmp_path, monkeypatch):
    """`./bwfabric.sh experiment` writes under results/ (relative): the
    agents' unix sockets must still be absolute paths."""
    monkeypatch.chdir(tmp_path)
    cfg = product.Config()
    out = Path("results") / "main"
    (out / "bwfabric").mkdir(parents=True)
    builders.fattree(4, link_mbps=cfg.link_mbps, fabric_mbps=cfg.fabric_mbps).save(out / "topology.json")
    loaded = config.load(product.write_config(cfg, out / "bwfabric", "bwfabric"))
    assert loaded.cfg.agents.address_template.startswith(f"unix:{tmp_path}/")
