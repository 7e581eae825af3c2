"""The agent's kernel-filtered conntrack read (hostagent.conntrack) on a
real namespace: exactly the entries of the VM's address that the kernel's
whole text lists, none of the foreign ones (issue #31: reading the whole
table cost CPU in proportion to it)."""

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.root

SCRIPT = textwrap.dedent('''
    import json, socket, subprocess
    from hostagent.conntrack import ConntrackReader
    from hostagent.lrc import read_conntrack
    subprocess.run(["ip", "addr", "add", "10.9.0.2/24", "dev", "ag0"], check=True)
    for cmd in (["add", "table", "ip", "t"], ["add", "chain", "ip", "t", "o",
                "{ type filter hook output priority 0; }"], ["add", "rule", "ip", "t", "o", "ct", "state", "new", "counter"]):
        subprocess.run(["nft", *cmd], check=True)
    for src, n in (("10.9.0.1", 5), ("10.9.0.2", 300)):       # the VM's 5 and 300 foreign entries
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((src, 0))
        for i in range(n):
            s.sendto(b"x", ("10.9.0.%d" % (10 + i % 200), 4000 + i))
    whole = [e for e in read_conntrack() if "10.9.0.1" in (e.saddr, e.daddr)]
    with ConntrackReader() as r:
        mine = r.entries_of("10.9.0.1")
        none = r.entries_of("10.9.1.1")
    print(json.dumps({"whole": sorted(map(str, (e.key for e in whole))), "mine": sorted(map(str, (e.key for e in mine))),
                      "total": len(read_conntrack()), "none": len(none),
                      "fields": [[e.proto, e.timeout_s > 0, e.sport > 0, e.dport >= 4000] for e in mine]}))
''')


def test_the_filtered_read_is_the_vms_part_of_the_whole_table(netns):
    res = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", SCRIPT], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert len(out["mine"]) == 5 and out["mine"] == out["whole"] and out["total"] >= 305
    assert out["none"] == 0 and all(f == [17, True, True, True] for f in out["fields"])


EVENTS = textwrap.dedent('''
    import json, socket, subprocess, time
    from hostagent.conntrack import VmConntrack
    for cmd in (["add", "table", "ip", "t"], ["add", "chain", "ip", "t", "o",
                "{ type filter hook output priority 0; }"], ["add", "rule", "ip", "t", "o", "ct", "state", "new", "counter"]):
        subprocess.run(["nft", *cmd], check=True)
    subprocess.run(["ip", "addr", "add", "10.9.0.2/24", "dev", "ag0"], check=True)
    vm = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    vm.bind(("10.9.0.1", 0))
    vm.sendto(b"x", ("10.9.0.10", 5000))                    # before: found by the first (dump) read
    ct = VmConntrack("10.9.0.1")
    first = len(ct.entries())
    vm.sendto(b"x", ("10.9.0.11", 5001))                    # after: found through the NEW event
    other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    other.bind(("10.9.0.2", 0))
    for i in range(200):                                   # foreign: no lookups for them
        other.sendto(b"x", ("10.9.0.%d" % (20 + i % 100), 6000 + i))
    second = sorted(e.dport for e in ct.entries())
    print(json.dumps({"first": first, "second": second, "tracked": len(ct.tuples), "resyncs": ct.resyncs}))
''')


def test_the_event_driven_read_follows_new_entries_without_rereading_the_table(netns):
    res = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", EVENTS], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["first"] == 1 and out["second"] == [5000, 5001]
    assert out["tracked"] == 2 and out["resyncs"] == 1          # one dump; the rest came from events
