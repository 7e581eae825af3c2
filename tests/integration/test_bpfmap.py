"""hostagent.bpfmap, the agent's bpf(2) map access, against bpftool's view
of the same pinned maps (a bpffs of the test's own)."""

import json
import subprocess
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostagent.bpfmap import BpfMapError, Maps, PinnedMap, prog_id

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def bpffs(tmp_path_factory):
    root = tmp_path_factory.mktemp(f"bpffs{uuid.uuid4().hex[:4]}")
    subprocess.run(["mount", "-t", "bpf", "bpf", str(root)], check=True)
    try:
        subprocess.run(["bpftool", "map", "create", str(root / "m"), "type", "hash", "key", "8", "value", "16",
                        "entries", "256", "name", "m"], check=True)
        yield root
    finally:
        subprocess.run(["umount", str(root)], check=False)


def _bpftool_lookup(pin, key: bytes) -> bytes | None:
    res = subprocess.run(["bpftool", "-j", "map", "lookup", "pinned", str(pin), "key", *map(str, key)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        return None
    return bytes(int(b, 16) for b in json.loads(res.stdout)["value"])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.binary(min_size=8, max_size=8), value=st.binary(min_size=16, max_size=16))
def test_what_it_writes_bpftool_reads_and_back(bpffs, key, value):
    m = PinnedMap(bpffs / "m")
    try:
        assert (m.key_size, m.value_size) == (8, 16)
        m.update(key, value)
        assert _bpftool_lookup(bpffs / "m", key) == value
        assert m.lookup(key) == value
        subprocess.run(["bpftool", "map", "update", "pinned", str(bpffs / "m"), "key", *map(str, key), "value",
                        *map(str, value[::-1])], check=True)
        assert m.lookup(key) == value[::-1]          # read from the kernel, not remembered
        assert m.delete(key) is True and m.delete(key) is False
        assert m.lookup(key) is None and _bpftool_lookup(bpffs / "m", key) is None
    finally:
        m.close()


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=st.sets(st.binary(min_size=8, max_size=8), max_size=40))
def test_the_keys_it_walks_are_bpftools(bpffs, keys):
    m = PinnedMap(bpffs / "m")
    try:
        for k in keys:
            m.update(k, bytes(16))
        dumped = {bytes(int(b, 16) for b in e["key"]) for e in json.loads(subprocess.run(
            ["bpftool", "-j", "map", "dump", "pinned", str(bpffs / "m")], capture_output=True, text=True,
            check=True).stdout)}
        assert set(m.keys()) == dumped == keys
    finally:
        for k in keys:
            m.delete(k)
        m.close()


def test_wrong_sizes_are_refused_by_name_and_change_nothing(bpffs):
    m = PinnedMap(bpffs / "m")
    try:
        m.update(bytes(8), bytes(range(16)))
        for bad in (lambda: m.update(bytes(4), bytes(16)), lambda: m.update(bytes(8), bytes(8)),
                    lambda: m.lookup(bytes(9)), lambda: m.delete(b"")):
            with pytest.raises(BpfMapError, match=str(bpffs / "m")):
                bad()
        assert m.lookup(bytes(8)) == bytes(range(16))
    finally:
        m.delete(bytes(8))
        m.close()


def test_a_map_pinned_anew_is_opened_again(bpffs):
    """The loader replaces maps (a marker loaded again): an open descriptor
    would keep writing the old one."""
    maps = Maps()
    pin = bpffs / "r"
    subprocess.run(["bpftool", "map", "create", str(pin), "type", "hash", "key", "4", "value", "8", "entries", "8",
                    "name", "r"], check=True)
    try:
        maps.get(pin).update(bytes(4), (1).to_bytes(8, "little"))
        pin.unlink()
        subprocess.run(["bpftool", "map", "create", str(pin), "type", "hash", "key", "4", "value", "8", "entries",
                        "8", "name", "r"], check=True)
        maps.get(pin).update(bytes(4), (2).to_bytes(8, "little"))
        assert _bpftool_lookup(pin, bytes(4)) == (2).to_bytes(8, "little")
        assert maps.get(bpffs / "absent") is None
    finally:
        maps.close()
        pin.unlink()


def test_a_pinned_programs_id_is_bpftools(bpffs):
    from hostagent import cc
    pin = bpffs / "prog"
    (bpffs / "markmaps").mkdir(exist_ok=True)
    subprocess.run(["bpftool", "prog", "load", str(cc.build()["bwf_mark"]), str(pin), "type", "classifier",
                    "pinmaps", str(bpffs / "markmaps")], check=True)
    want = json.loads(subprocess.run(["bpftool", "-j", "prog", "show", "pinned", str(pin)], capture_output=True,
                                     text=True, check=True).stdout)["id"]
    assert prog_id(pin) == want
    with pytest.raises(FileNotFoundError):
        prog_id(bpffs / "none")
