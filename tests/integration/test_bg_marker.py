"""bwf_mark, the host's BG marker (issue #32 §2-3), on real namespaces: the
agent's whole plan in a VM's namespace, its own UDP far over its guarantee,
and what the peer receives.

Mechanisms asserted (none is a figure machine load can move):
- the plan is in force as read back (the marker runs the pinned program,
  the bucket holds the planned rate and depth, BG's HTB class may borrow);
- UDP past the bucket is dropped at the host: what the peer receives as BG
  UDP, and what the bucket let through, never exceed rate x time + depth;
- TCP past the bucket is demoted, not queued: with the VM's UDP flood
  spending every token, connections still open and finish, and their
  packets reach the peer as DSCP CS1 (the rewritten checksum is valid, or
  the peer's kernel would drop them);
- a young flow's demoted packets go to the young WC class (1:21);
- with a bucket that holds nothing, a connection's SYN (no payload) stays
  BG while its data is demoted; a ping's requests are demoted and still
  answered: the rewritten IP checksum is valid (TCP's multi-segment packets
  would not show it: software GSO recomputes their headers after the marker);
- turning ``demote_bg`` off detaches the marker and puts BG's class back
  at the guarantee; teardown leaves nothing of ours.
"""

import json
import subprocess
import sys
import textwrap
import time

import pytest

from hostagent import cc
from tests.integration.netns_pair import ns as _ns, veth_pair

pytestmark = pytest.mark.root

A, B = "10.62.0.1", "10.62.0.2"
G_MBPS, NIC_MBPS, UDP_MBPS = 0.5, 10.0, 9.0

PEER = textwrap.dedent('''
    import socket, threading
    srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("%s", 7000)); srv.listen(64)
    srv2 = socket.socket(); srv2.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv2.bind(("%s", 7002)); srv2.listen(64)
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("%s", 7001))
    threading.Thread(target=lambda: [u.recv(65536) for _ in iter(int, 1)], daemon=True).start()

    def serve(s):
        while True:
            c, _ = s.accept()
            n = 0
            while n < 20000:
                b = c.recv(65536)
                if not b:
                    break
                n += len(b)
            c.sendall(b"k")
            c.close()
    threading.Thread(target=serve, args=(srv2,), daemon=True).start()
    print("ready", flush=True)
    serve(srv)
''' % (B, B, B))

COUNTERS = textwrap.dedent('''
    table ip bwfmt {
      chain in {
        type filter hook input priority filter; policy accept;
        ip saddr %s ip dscp cs0 udp dport 7001 counter
        ip saddr %s ip dscp cs1 udp dport 7001 counter
        ip saddr %s ip dscp cs0 tcp dport 7000 counter
        ip saddr %s ip dscp cs1 tcp dport 7000 counter
        ip saddr %s ip dscp cs1 icmp type echo-request counter
        ip saddr %s ip dscp cs0 tcp dport 7002 tcp flags & (syn | ack) == syn counter
        ip saddr %s ip dscp cs1 tcp dport 7002 counter
      }
    }
''' % (A, A, A, A, A, A, A))

VM = textwrap.dedent('''
    import json, socket, subprocess, sys, threading, time
    from hostagent import plan as P
    from hostagent.executor import Executor
    dev, state = sys.argv[1], sys.argv[2]
    base = {"host": "a", "interface": dev, "address": "%s", "nic_mbps": %r, "guarantee_mbps": %r,
            "wc_subflows": 1}
    cfg = P.HostConfig.from_dict(base)
    plan = P.host_plan(cfg)
    ex = Executor(state_file=state)
    out = {"first": ex.apply(plan), "again": ex.apply(plan), "differences": ex.differences(plan),
           "marker": ex.marker_prog(dev), "pinned": ex._mark_prog_id()}
    bucket = next(s for s in plan.steps if isinstance(s, P.BgBucket))
    out["rate"], out["depth"] = bucket.rate_Bps, bucket.depth_bytes

    def transfer(port=7000):
        s = socket.socket()
        s.settimeout(20)
        try:
            s.connect(("%s", port))
            s.sendall(b"x" * 20000)
            return s.recv(1) == b"k"
        except OSError:
            return False
        finally:
            s.close()
    stop = threading.Event()

    from benchmarks.bg_hol import udp_flood
    t0 = time.monotonic()
    th = threading.Thread(target=udp_flood, args=(("%s", 7001), %r, stop))
    th.start()
    time.sleep(1.0)
    out["flooded"] = [transfer() for _ in range(3)]
    time.sleep(0.5)
    stop.set()
    th.join()
    out["elapsed"] = time.monotonic() - t0
    out["counters"] = ex.bucket_counters("%s")
    out["class_bytes"] = ex.class_bytes(dev)
    # a bucket that holds nothing: every BG packet is demoted, small ones too -- TCP's multi-segment
    # packets get their IP checksums recomputed by software GSO after the marker, a ping's do not:
    # its replies prove the rewritten header is valid on the wire
    key = [str(x) for x in bucket.key()]
    subprocess.run(["bpftool", "map", "update", "pinned", str(ex.bpf_pin_dir / P.BPF_BUCKET_MAP), "key", *key,
                    "value", *(["1"] + ["0"] * 15)], check=True)
    ping = subprocess.run(["ping", "-c", "3", "-i", "0.2", "-W", "2", "%s"], capture_output=True, text=True)
    out["ping_received"] = int(ping.stdout.split(" received")[0].rsplit(" ", 1)[-1]) if " received" in ping.stdout else 0
    # ...and a connection with that bucket: its SYN (no payload) stays BG, its data is demoted
    out["empty_bucket_transfer"] = transfer(7002)
    out["restored"] = ex.apply(plan) == 1 and ex.differences(plan) == []
    off = P.host_plan(P.HostConfig.from_dict({**base, "demote_bg": False}))
    ex.apply(off)
    out["off"] = {"differences": ex.differences(off), "marker": ex.marker_prog(dev),
                  "bg": next(s for s in off.steps if isinstance(s, P.TcClass) and s.classid == P.CLASS_BG).ceil_bps}
    out["back_on"] = ex.apply(plan) > 0 and ex.differences(plan) == []
    ex.teardown()
    out["clean"] = ex.clean_differences()
    out["counters_after"] = ex.bucket_counters("%s")
    print(json.dumps(out))
''' % (A, NIC_MBPS, G_MBPS, B, B, UDP_MBPS, A, B, A))


@pytest.fixture
def vm_and_peer(tmp_path):
    loaded_before = cc.cc_registered()
    try:
        with veth_pair("bwmk", A, B) as (a, b, dev, _):
            cc.load()
            yield a, b, dev, tmp_path
    finally:
        if not loaded_before:
            cc.unload()


def _counters(ns_name):
    rules = json.loads(_ns(ns_name, "nft", "-j", "list", "table", "ip", "bwfmt").stdout)["nftables"]
    out = []
    for r in rules:
        for e in r.get("rule", {}).get("expr", []):
            if "counter" in e:
                out.append(e["counter"]["bytes"])
    return dict(zip(("udp_cs0", "udp_cs1", "tcp_cs0", "tcp_cs1", "icmp_cs1", "syn_cs0_7002", "cs1_7002"), out))


def test_bg_past_the_bucket_is_demoted_or_dropped_never_queued(vm_and_peer):
    a, b, dev, tmp = vm_and_peer
    assert _ns(b, "nft", "-f", "-", input=COUNTERS).returncode == 0
    peer = subprocess.Popen(["ip", "netns", "exec", b, sys.executable, "-c", PEER], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert peer.stdout.readline().strip() == "ready"
        res = _ns(a, sys.executable, "-c", VM, dev, str(tmp / "ex.json"), timeout=180,
                  cwd=str(cc.SRC.parents[1]))
        assert res.returncode == 0, res.stderr
        out = json.loads(res.stdout)
    finally:
        peer.kill()
        peer.wait()
    got = _counters(b)
    print(json.dumps({"vm": out, "peer": got}, indent=1))
    # in force as read back
    assert out["first"] > 0 and out["again"] == 0 and out["differences"] == []
    assert out["marker"] is not None and out["marker"] == out["pinned"]
    # UDP past the bucket dropped at the host: what conformed (and what the peer got as BG UDP)
    # stays within the token bucket's bound over the whole run
    bound = out["rate"] * out["elapsed"] + out["depth"] + 10_000     # late ACKs
    c = out["counters"]
    assert c["dropped"] > 0 and c["conform"] <= bound
    assert 0 < got["udp_cs0"] <= bound and got["udp_cs1"] == 0
    # TCP past it demoted, not queued: every connection opened and finished under the flood,
    # and reached the peer as CS1
    assert out["flooded"] == [True, True, True]
    assert c["demoted"] > 0 and got["tcp_cs1"] > 0
    # young flows' demoted packets were steered to their own HTB class (skb->priority); the old WC
    # class gets only what no full socket sent (a closed connection's last ACKs)
    cb = out["class_bytes"]
    assert cb["1:21"] >= 0.9 * c["demoted"] and cb["1:20"] < 0.1 * cb["1:21"], (cb, c)
    # every packet demoted, a ping's too: its requests arrive (the IP checksum is fixed) and are
    # answered; the planned bucket is put back
    assert out["ping_received"] == 3 and got["icmp_cs1"] >= 3 and out["restored"] is True, out
    # a TCP packet without payload is never demoted (a VM's ACKs for the BG it receives must not wait
    # in the low-priority queues because its own BG spent its tokens): the SYN arrived as CS0, the
    # data as CS1
    assert out["empty_bucket_transfer"] is True and got["syn_cs0_7002"] >= 60 and got["cs1_7002"] >= 20000, got
    # off: marker gone, BG held by its class at the guarantee; on again; teardown clean
    assert out["off"]["differences"] == [] and out["off"]["marker"] is None
    assert out["off"]["bg"] == int(G_MBPS * 1e6)
    assert out["back_on"] is True
    assert out["clean"] == [] and out["counters_after"] is None
    assert "clsact" not in _ns(a, "tc", "qdisc", "show", "dev", dev).stdout


PAIRS_VM = textwrap.dedent('''
    import json, sys, threading, time
    from hostagent import plan as P
    from hostagent.executor import Executor
    from benchmarks.bg_hol import udp_flood
    dev, state = sys.argv[1], sys.argv[2]
    base = {"host": "a", "interface": dev, "address": "%s", "nic_mbps": %r, "guarantee_mbps": %r,
            "wc_subflows": 1}
    ex = Executor(state_file=state)
    out = {}

    def phase(tag, pair_mbps, secs):
        plan = P.host_plan(P.HostConfig.from_dict({**base, "pair_limits_mbps": {"%s": pair_mbps}}))
        ex.apply(plan)
        pair = next(s for s in plan.steps if isinstance(s, P.BgBucket) and s.dst)
        hose = next(s for s in plan.steps if isinstance(s, P.BgBucket) and not s.dst)
        before = ex.bucket_counters("%s", "%s"), ex.bucket_counters("%s")
        stop = threading.Event()
        t0 = time.monotonic()
        th = threading.Thread(target=udp_flood, args=(("%s", 7001), %r, stop))
        th.start()
        time.sleep(secs)
        stop.set()
        th.join()
        out[tag] = {"differences": ex.differences(plan), "elapsed": time.monotonic() - t0,
                    "pair": [pair.rate_Bps, pair.depth_bytes], "hose": [hose.rate_Bps, hose.depth_bytes],
                    "pair_before": before[0], "hose_before": before[1],
                    "pair_after": ex.bucket_counters("%s", "%s"), "hose_after": ex.bucket_counters("%s")}
        time.sleep(0.5)         # the last packets arrive before the peer's counters are read

    phase("pair_below_hose", %r, 3.0)
    print(json.dumps(out), flush=True)
    sys.stdin.readline()        # the peer's counters are read between the phases
    phase("pair_above_hose", %r, 6.0)
    ex.teardown()
    out["clean"] = ex.clean_differences()
    print(json.dumps(out), flush=True)
''' % (A, NIC_MBPS, G_MBPS, B, A, B, A, B, UDP_MBPS, A, B, A, 0.1, 5.0))


def test_a_pairs_bg_conforms_to_its_bucket_and_then_to_the_hose(vm_and_peer):
    """The pipe model (and LRC) with the marker: BG to a destination with a
    pair bucket is bounded by that bucket when it is the smaller, and by
    the VM's hose when the pair's is larger (the ToR meter polices the
    hose); a changed pair bucket keeps its counters (its tokens are not
    refilled: LRC moves pair rates every round). Each bound is one the
    other bucket alone would break: 0.1 Mb/s x 3 s + depth is about half of
    what the hose lets through in that time, and the hose's 0.5 x 6 s is
    far above what the pair's old rate would."""
    a, b, dev, tmp = vm_and_peer
    assert _ns(b, "nft", "-f", "-", input=COUNTERS).returncode == 0
    peer = subprocess.Popen(["ip", "netns", "exec", b, sys.executable, "-c", PEER], stdout=subprocess.PIPE,
                            text=True)
    vm = None
    try:
        assert peer.stdout.readline().strip() == "ready"
        vm = subprocess.Popen(["ip", "netns", "exec", a, sys.executable, "-c", PAIRS_VM, dev, str(tmp / "ex.json")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=str(cc.SRC.parents[1]))
        first = json.loads(vm.stdout.readline() or "null")
        assert first is not None, vm.stderr.read()
        got1 = _counters(b)
        vm.stdin.write("\n")
        vm.stdin.flush()
        out = json.loads(vm.stdout.readline() or "null")
        assert out is not None, vm.stderr.read()
        got2 = _counters(b)
    finally:
        for p in (vm, peer):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    print(json.dumps({"vm": out, "peer": [got1, got2]}, indent=1))
    lo, hi = out["pair_below_hose"], out["pair_above_hose"]
    assert lo["differences"] == [] and hi["differences"] == []
    # the pair's bucket (0.1 Mb/s) bounds what arrives as BG, not the hose's 0.5
    pair_rate, pair_depth = lo["pair"]
    assert 0 < got1["udp_cs0"] <= pair_rate * lo["elapsed"] + pair_depth + 10_000
    assert lo["pair_after"]["dropped"] > 0
    # a pair's bucket of 5 Mb/s: the hose (0.5) bounds it -- and the pair's new rate is in force: at
    # the old one (0.1) no more than 12.5 kB/s x 6 s + its depth could have arrived
    hose_rate, hose_depth = hi["hose"]
    arrived = got2["udp_cs0"] - got1["udp_cs0"]
    assert 0 < arrived <= hose_rate * hi["elapsed"] + hose_depth + 10_000
    assert arrived > pair_rate * hi["elapsed"] + pair_depth + 10_000
    assert hi["hose_after"]["dropped"] > hi["hose_before"]["dropped"]
    # the pair's bucket was rewritten (0.2 -> 5 Mb/s), not recreated: its counters went on
    assert hi["pair_before"]["conform"] >= lo["pair_after"]["conform"] > 0
    assert out["clean"] == []
