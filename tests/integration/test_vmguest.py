"""A real guest kernel for the VM-scheduling experiment
(experiments.vmguest): the agent's BPF programs, built against this
machine's kernel, load in Debian's 6.12 guest kernel and run a coupled
control on an MPTCP connection there; and cpu_share gives a thread the
turns it promises (one slice in four), with nothing but the scheduler."""

import os
import subprocess
import sys
import time

import pytest

from experiments.coupled.vm_guest import _guest_run
from experiments import vmguest
from hostagent import cc

pytestmark = pytest.mark.root


@pytest.fixture
def off_cpu0():
    """The test's own threads (and what they start) off CPU 0, which the gate uses."""
    mine = os.sched_getaffinity(0)
    if not mine - {0}:
        pytest.fail("these tests need a CPU besides CPU 0")
    os.sched_setaffinity(0, mine - {0})
    try:
        yield
    finally:
        os.sched_setaffinity(0, mine)


def test_cpu_share_gives_a_busy_thread_one_slice_in_four(off_cpu0):
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with vmguest.cpu_share([busy.pid], 0, None) as s:
            time.sleep(2)
        alone = vmguest.share(s["usage"])
        with vmguest.cpu_share([busy.pid], 0, 40.0) as s:
            time.sleep(3)
        shared = vmguest.share(s["usage"])
        turns = s["turns"]
    finally:
        busy.kill()
        busy.wait(5)
    assert alone > 0.9, alone
    # on 40 ms, off 120 ms: a quarter, less what RT throttling (5 %) and the switching take
    assert 0.15 < shared / alone < 0.3, (shared, alone)
    assert len(turns) >= 15 and all(0.03 < off - on < 0.06 for on, off in turns), turns


@pytest.fixture(scope="module")
def loaded():
    if (why := vmguest.missing()) is not None:
        pytest.fail(why)               # ./bwfabric.sh sets the guest up
    loaded_before = cc.cc_registered()
    cc.load()
    try:
        yield
    finally:
        if not loaded_before:
            cc.unload()


def test_the_agents_bpf_programs_run_lia_vm_in_a_6_12_guest(loaded, off_cpu0):
    r = _guest_run(3.0, None, "lia_vm", 100.0, 0)
    g = r["guest"]
    assert g["kernel"].startswith("6.12") and g["kernel"] != os.uname().release, g["kernel"]
    # bwf_sockops gave the guest's subflows the control bwf_ccsel names, and it ran there
    assert g["stats"]["increases"] > 1000, g["stats"]
    # both 100 Mb/s paths carried the connection: each bottleneck sent at least a quarter of the bytes (a
    # mechanism; the goodput itself, a figure the machine's load moves, is printed and lives in the experiment)
    total = sum(r["path_bytes"])
    print(f"guest LIA-VM: {r['mbps']:.1f} Mb/s, per path {[round(b / 1e6, 1) for b in r['path_bytes']]} MB")
    assert total > 5e6 and min(r["path_bytes"]) >= total / 4, r["path_bytes"]
