"""LRC at a real host agent (issue #22): open pairs seen in the kernel's
conntrack table, per-pair BG and WC classes, WC ceilings moved by the
rates-only path, pairs closed when idle -- every step read back."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.root
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("marker", [False, True], ids=["htb", "bwf_mark"])
def test_lrc_pairs_classes_and_fast_path_on_a_live_agent(netns, marker):
    """``htb``: each pair's BG is an HTB class (1:100 + slot); ``bwf_mark``
    (the default): a bucket of the marker keyed (source, pair), moved by
    the same rates-only path. WC ceilings are HTB classes (1:300 + slot)
    either way."""
    res = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-m", "tests.integration.agent_scenarios",
                          "lrc_pairs_marker" if marker else "lrc_pairs"], capture_output=True, text=True,
                         timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)

    def bg(snap, dst, slot):
        """The pair's BG limit in force (Mb/s), wherever this mode keeps it; and that the other place is empty."""
        if marker:
            assert f"1:{0x100 + slot:x}" not in snap["classes"]
            return snap["buckets"].get(dst)
        assert dst not in snap["buckets"]
        return snap["classes"].get(f"1:{0x100 + slot:x}")

    # no traffic: no pairs
    assert out["quiet"]["did"] == "idle" and bg(out["quiet"], "10.9.0.2", 0) is None
    # UDP to .2: its pair opens; alone, its guarantee is the whole hose (40), WC ceiling nothing yet
    one = out["one_pair"]
    assert one["did"] == "pairs" and one["in_force"], one
    assert bg(one, "10.9.0.2", 0) == pytest.approx(40, rel=0.01)
    assert one["classes"]["1:300"] == pytest.approx(0.008, abs=0.001)
    assert set(out["rates_reply"]["pairs"]) == {"10.9.0.2"}
    # the factor (r̃ 30, w 2): v = 60 at α·τ_v = 1, so WC = 60 - 40
    f = out["factor"]
    assert f["did"] == "rates" and f["in_force"], f
    assert f["classes"]["1:300"] == pytest.approx(20, rel=0.01)
    # .3 opens too: Algorithm 1 splits the hose 1:3 at once (10 and 30)
    two = out["two_pairs"]
    assert two["did"] == "pairs" and two["in_force"], two
    assert bg(two, "10.9.0.2", 0) == pytest.approx(10, rel=0.01)
    assert bg(two, "10.9.0.3", 1) == pytest.approx(30, rel=0.01)
    # the factor alternates 20/30 every round: rates only, and the kernel agrees at the end
    assert set(out["update_did"]) <= {"rates", "idle"} and out["update_did"].count("rates") >= 90
    assert out["repairs"] == 0
    after = out["after_updates"]
    assert after["in_force"], after["differences"]
    ms = out["update_ms"]
    print(f"LRC rates-only round ({'bwf_mark' if marker else 'htb'}): median {ms[len(ms) // 2]:.2f} ms, "
          f"p90 {ms[int(len(ms) * 0.9)]:.2f} ms")
    # idle for longer than pair_idle_s: both pairs close, their classes and buckets go
    idle = out["idle"]
    assert idle["did"] == "pairs" and idle["in_force"] and idle["pairs"] == {}
    assert not any(c.startswith(("1:1", "1:3")) and len(c) == 5 for c in idle["classes"]), idle["classes"]
    assert idle["buckets"] == {}
    assert out["clean"] == []


def test_lrc_pairs_that_are_buckets_open_and_close_without_a_whole_apply(netns):
    """``wc: competition`` with the marker (the main job's LRC): a pair's
    BG is its bucket and nothing else, so a pair that opens, splits the
    hose or closes is a bucket written or deleted in one bpftool process
    (Agent._pairs_fast) -- and the kernel, read back, agrees each time."""
    res = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-m", "tests.integration.agent_scenarios",
                          "lrc_pairs_buckets"], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    assert out["quiet"]["did"] == "idle" and out["quiet"]["buckets"] == {}
    one, two, idle = out["one_pair"], out["two_pairs"], out["idle"]
    for step, fast in ((one, 1), (two, 2), (idle, 3)):
        assert step["did"] == "pairs" and step["in_force"], step
        assert step["fast"] == fast, step                   # by the buckets alone, every time
    assert one["buckets"] == {"10.9.0.2": pytest.approx(40, rel=0.01)}
    assert two["buckets"] == {"10.9.0.2": pytest.approx(10, rel=0.01), "10.9.0.3": pytest.approx(30, rel=0.01)}
    assert idle["buckets"] == {}
    assert out["repairs"] == 0 and out["clean"] == []


def test_entries_another_run_left_under_a_vms_address_are_removed_when_it_is_configured(netns):
    """The pinned maps are the machine's: an agent that died before its
    teardown leaves entries keyed by its VMs' addresses (measured: a VM
    paced at 0.26 Mb/s, the guarantee another run's VM of that address
    had). Configuring a VM deletes what is under its address and not in
    its plan -- a pacing ceiling it does not want, a pair bucket -- and
    status reads it back; another address's entries stay."""
    res = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-m", "tests.integration.agent_scenarios",
                          "strays_removed"], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    assert out["apply"]["ok"], out
    assert out["pace"] is None and not out["stale_bucket"] and out["foreign_bucket"], out
    assert out["in_force"] and out["differences"] == [], out
    assert not out["after_write"]["in_force"] and "bwf_bgpace" in " ".join(out["after_write"]["differences"])


def test_an_agent_killed_under_lrc_leaves_its_limits_and_restarts_into_the_fail_safe(netns, tmp_path):
    """Issue #34 section 4: SIGKILL an agent running LRC (a pair at BG 40,
    WC ceiling 20 from a factor). The kernel keeps every limit (the VM is
    never unlimited); the agent started again changes nothing before its
    configuration comes; the controller's push puts the pair at its
    guarantee with no WC above it until a fresh factor (the fail-safe, not
    the dead process's factor); the factor then moves it as before."""
    import signal
    import time as _time

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen(["ip", "netns", "exec", netns, sys.executable, "-m", "tests.integration.agent_scenarios",
                              "lrc_before_kill", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, cwd=ROOT, env=env)
    try:
        line = first.stdout.readline()
        assert line, first.stderr.read()[-3000:]
        before = json.loads(line)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    assert first.returncode == -signal.SIGKILL
    _time.sleep(0.5)
    res = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-m", "tests.integration.agent_scenarios",
                          "lrc_after_kill", str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    after = json.loads(res.stdout)
    print("killed with:", {k: before["classes"].get(k) for k in ("1:100", "1:300")},
          "kernel at restart:", {k: after["kernel_at_start"].get(k) for k in ("1:100", "1:300")},
          "pushed, no factor:", {k: after["no_factor_yet"].get(k) for k in ("1:100", "1:300")},
          "fresh factor:", {k: after["fresh_factor"].get(k) for k in ("1:100", "1:300")})
    assert before["in_force"] and before["classes"]["1:100"] == pytest.approx(40, rel=0.01)
    assert before["classes"]["1:300"] == pytest.approx(20, rel=0.01)
    # the kernel kept every limit through the kill
    assert after["kernel_at_start"] == before["classes"]
    # the controller's push, no factor yet: BG at the guarantee, WC nothing above it
    assert after["no_factor_in_force"], after
    assert after["no_factor_yet"]["1:100"] == pytest.approx(40, rel=0.01)
    assert after["no_factor_yet"]["1:300"] == pytest.approx(0.008, abs=0.001)
    assert after["fresh_factor"]["1:300"] == pytest.approx(20, rel=0.01)
    assert after["clean"] == []
