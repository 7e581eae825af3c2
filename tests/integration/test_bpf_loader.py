"""The host's BPF loader (hostagent.cc.load): bwf_sockops paces a VM-pair's
BG at the rate in bwf_mark's bucket map, so the two programs must share
that one pinned map -- also after the marker was loaded again."""

import json
import subprocess

import pytest

from hostagent import cc

pytestmark = pytest.mark.root


def _map_id(pin) -> int:
    return json.loads(subprocess.run(["bpftool", "-j", "map", "show", "pinned", str(pin)], capture_output=True,
                                     text=True, check=True).stdout)["id"]


def _prog_maps(pin) -> set[int]:
    return set(json.loads(subprocess.run(["bpftool", "-j", "prog", "show", "pinned", str(pin)], capture_output=True,
                                         text=True, check=True).stdout).get("map_ids", []))


def test_sockops_reads_the_markers_bucket_map_also_after_the_marker_is_loaded_again():
    loaded_before = cc.cc_registered()
    try:
        cc.load()
        bucket = cc.BPFFS / cc.BUCKET_MAP
        assert _map_id(bucket) in _prog_maps(cc.PIN_SOCKOPS) & _prog_maps(cc.PIN_MARK)
        old = _map_id(bucket)
        cc.PIN_MARK.unlink()                     # the marker gone (its maps are pinned still)
        st = cc.load()
        assert st["sockops_attached"] and st["marker_pinned"]
        new = _map_id(bucket)
        assert new != old                         # a fresh bucket map, with the marker loaded again...
        assert new in _prog_maps(cc.PIN_SOCKOPS) and old not in _prog_maps(cc.PIN_SOCKOPS)   # ...and sockops on it
    finally:
        if not loaded_before:
            cc.unload()
