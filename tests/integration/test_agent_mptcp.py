"""The host agent end to end on two real network namespaces: the controller
side configures both agents over the authenticated channel (forged and
replayed messages refused); an MPTCP connection then has one BG subflow
(ToS 0x00, Reno, limited to the guarantee by HTB) and one WC subflow (ToS
0x20, the bwf_wc BPF congestion control, counted as K=1 for its VM),
verified by nftables packet counters, ss and the BPF maps."""

import re
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from bwcommon.contract import bg_burst_bytes

from hostagent import cc
from hostagent import plan as P
from hostagent.plan import BG_PACE_AFTER_BYTES as PACE_AFTER
from bwcommon.agentclient import AgentClient
from hostagent.executor import Executor
from bwcommon.channel import Sender, host_key, write_secret

pytestmark = pytest.mark.root
REPO = Path(__file__).resolve().parents[2]
MASTER = bytes(range(1, 33))
IPS = {"a": "10.9.1.1", "b": "10.9.1.2"}
SERVER = textwrap.dedent('''
    import socket, sys
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 5001)); s.listen(4)
    print("ready", flush=True)
    c, _ = s.accept(); n = 0
    while True:
        b = c.recv(1 << 16)
        if not b: break
        n += len(b)
    print(n, flush=True)
''')
CLIENT = textwrap.dedent('''
    import socket, sys, time
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262)
    s.connect((sys.argv[1], 5001)); end = time.time() + float(sys.argv[2]); buf = b"x" * 65536
    while time.time() < end: s.sendall(buf)
    s.close()
''')
COUNTERS = textwrap.dedent('''
    table ip bwftest {
      chain post {
        type filter hook postrouting priority 100; policy accept;
        tcp dport 5001 ip dscp cs0 counter
        tcp dport 5001 ip dscp != cs0 counter
        tcp dport 10101 ip dscp cs1 counter
        tcp dport 10101 ip dscp != cs1 counter
      }
      chain pre {
        type filter hook prerouting priority -300; policy accept;
        tcp sport 10101 ip dscp cs0 counter
        tcp sport 10101 ip dscp != cs0 counter
      }
    }
''')


def ns(name, *cmd, **kw):
    return subprocess.run(["ip", "netns", "exec", name, *cmd], capture_output=True, text=True, **kw)


@pytest.fixture
def pair(tmp_path):
    tag = uuid.uuid4().hex[:5]
    names = {h: f"bwfa-{h}-{tag}" for h in IPS}
    procs = []
    loaded_before = cc.cc_registered()
    for n in names.values():
        subprocess.run(["ip", "netns", "add", n], check=True)
    try:
        subprocess.run(["ip", "link", "add", f"va{tag}", "netns", names["a"], "type", "veth", "peer", "name",
                        f"vb{tag}", "netns", names["b"]], check=True)
        for h, dev in (("a", f"va{tag}"), ("b", f"vb{tag}")):
            for cmd in (["ip", "addr", "add", f"{IPS[h]}/24", "dev", dev], ["ip", "link", "set", dev, "up"],
                        ["ip", "link", "set", "lo", "up"], ["ethtool", "-K", dev, "tso", "off", "gso", "off"]):
                assert ns(names[h], *cmd).returncode == 0, cmd
        cc.load()
        for h in IPS:
            write_secret(tmp_path / f"{h}.key", host_key(MASTER, h).hex())
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", names[h], sys.executable, "-m", "bwfabric.cli", "agent", "--host", h,
                 "--key-file", str(tmp_path / f"{h}.key"), "--listen", f"unix:{tmp_path}/{h}.sock",
                 "--state-dir", str(tmp_path / f"state-{h}")], cwd=REPO, stderr=open(tmp_path / f"{h}.log", "w")))
        for h in IPS:
            deadline = time.time() + 10
            while not (tmp_path / f"{h}.sock").exists():
                assert time.time() < deadline, (tmp_path / f"{h}.log").read_text()
                time.sleep(0.1)
        yield names, tag, tmp_path
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)
        for n in names.values():
            subprocess.run(["ip", "netns", "del", n])
        if not loaded_before:
            cc.unload()


def test_agents_put_bg_and_wc_subflows_in_force(pair):
    names, tag, tmp = pair
    clients = {h: AgentClient(f"unix:{tmp}/{h}.sock", h, host_key(MASTER, h)) for h in IPS}
    for h, dev in (("a", f"va{tag}"), ("b", f"vb{tag}")):
        cfg = dict(host=h, interface=dev, address=IPS[h], nic_mbps=100, guarantee_mbps=20, wc_subflows=1,
                   policy="equal")
        reply = clients[h].request("config", cfg)
        assert reply["ok"] and reply["changes"] > 5, reply

    # forged (h b's key for a), replayed, and bad configs are refused and change nothing
    forged = Sender(host_key(MASTER, "b"), "a").seal("config", {"host": "a"})
    assert "bad MAC" in clients["a"].request_raw(forged)["error"]
    captured = clients["a"].tx.seal("status", {})
    assert clients["a"].request_raw(captured)["ok"]
    assert "replayed" in clients["a"].request_raw(captured)["error"]
    bad = clients["a"].request("config", dict(host="a", interface=f"va{tag}", address=IPS["a"], nic_mbps=100,
                                              guarantee_mbps=500))
    assert not bad["ok"] and "guarantee_mbps 500" in bad["error"]
    status = clients["a"].request("status", {})
    assert status["rejected"] == 2 and status["config"]["vm"]["guarantee_mbps"] == 20   # still in force

    assert ns(names["a"], "nft", "-f", "-", input=COUNTERS).returncode == 0
    server = subprocess.Popen(["ip", "netns", "exec", names["b"], sys.executable, "-c", SERVER],
                              stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "ready"
    t_start = time.monotonic()
    client = subprocess.Popen(["ip", "netns", "exec", names["a"], sys.executable, "-c", CLIENT, IPS["b"], "4"])
    time.sleep(2.5)
    ss = ns(names["a"], "ss", "-tmniH", "dst", IPS["b"]).stdout
    kcount = cc.read_map("bwf_kcount").get(IPS["a"])
    more = []                       # a few more readings of the WC subflow (its pacing ceiling, below)
    for _ in range(6):
        time.sleep(0.1)
        more.append(ns(names["a"], "ss", "-tmniH", "dst", IPS["b"]).stdout)
    client.wait(20)
    live = clients["a"].request("status", {})          # Eq. 1 recomputed from the live subflows
    received = int(server.communicate(timeout=20)[0].strip())
    counters = ns(names["a"], "nft", "list", "table", "ip", "bwftest").stdout
    ns(names["a"], "nft", "delete", "table", "ip", "bwftest")
    print(ss, counters, sep="\n")

    sizes = [int(x) for x in re.findall(r"counter packets \d+ bytes (\d+)", counters)]
    bg_ok, bg_bad, wc_ok, wc_bad, wc_acks_bg, wc_acks_other = sizes
    assert bg_ok > 1_000_000 and wc_ok > 1_000_000   # two subflows, both carried data
    assert bg_bad == 0 and wc_bad == 0               # each with its own ToS only
    # ACKs first: what b returns on the WC subflow (its ACKs; it sends no data) left b's marker as BG, so it
    # never waits behind WC data going b's way (b's nftables mark it WC, as every packet of a join)
    assert wc_acks_bg > 0 and wc_acks_other == 0, (wc_acks_bg, wc_acks_other)
    assert "bwf_wc" in ss and "reno" in ss           # the WC subflow runs the BPF CC, the BG one Reno
    # send buffers (skmem tb): WC's follows its window (bwf_sockops: 2 x cwnd x (MSS + 1 KiB), >= 64 KiB), BG keeps
    # the namespace's (Eq. 1's B)
    info = {("wc" if "bwf_wc" in ln else "bg"): ln for ln in ss.splitlines() if "tcp-ulp-mptcp" in ln}
    tb = {k: int(re.search(r"\btb(\d+)", ln).group(1)) for k, ln in info.items()}
    cwnd, mss = (int(re.search(rf"\b{f}:(\d+)", info["wc"]).group(1)) for f in ("cwnd", "mss"))
    # ECN agreed (the agents' default, tcp_ecn=1 on both hosts): bwf_sockops gave the WC subflow bwf_wc_ecn
    # (retransmissions stay ECN-capable)
    assert " bwf_wc_ecn " in info["wc"], info["wc"]
    print(f"send buffers {tb}, WC cwnd {cwnd} x mss {mss}")
    # set from the cwnd of the last RTT sample (ss reads a later one): a multiple of 2 x (MSS + 1 KiB)
    assert tb["wc"] == 65536 or tb["wc"] % (2 * (mss + 1024)) == 0, (tb, cwnd, mss)
    assert tb["wc"] <= 4 * max(32768, cwnd * (mss + 1024)) and tb["wc"] != tb["bg"], (tb, cwnd, mss)
    # WC's pacing rate has a ceiling (bwf_sockops: 4 x the most it may have in flight -- window, flight or slow
    # start's threshold -- per RTT; ss shows rate/ceiling): the bound on what MPTCP's scheduler takes for WC's
    # drain rate -- none before (no "/")
    def wc_pacing(text):
        """(rate, ceiling, 4 x segments per RTT from ss's own figures) of the WC subflow in one reading."""
        line = next((ln for ln in text.splitlines() if "tcp-ulp-mptcp" in ln and "bwf_wc" in ln), None)
        if line is None:
            return None
        pace = re.search(r"pacing_rate (\d+)bps/(\d+)bps", line)
        assert pace, line
        field = {f: re.search(rf"\b{f}:([\d.]+)", line) for f in ("cwnd", "unacked", "ssthresh", "rtt")}
        segs = max(int(field[f].group(1)) for f in ("cwnd", "unacked", "ssthresh") if field[f])
        return int(pace.group(1)), int(pace.group(2)), 4 * segs * mss * 8 / (float(field["rtt"].group(1)) / 1e3)
    readings = [r for r in (wc_pacing(t) for t in [ss, *more]) if r is not None]
    print("WC pacing rate / ceiling / 4 x segments per RTT (Mb/s): " +
          "; ".join(f"{a / 1e6:.1f} / {b / 1e6:.1f} / {c / 1e6:.1f}" for a, b, c in readings))
    # set at an RTT sample, ss reads a later state, and the RTT swings several-fold between samples under load
    # (a suite run read 14.3 ms beside a ceiling set at a fraction of it: 1.29 Gb/s against a bound of 0.54):
    # within 2x of the bound in some reading, and never the runaway (GB/s) the ceiling exists against
    assert readings and all(rate <= ceiling < 10e9 for rate, ceiling, _ in readings), readings
    assert any(ceiling <= 2 * bound for _, ceiling, bound in readings), readings
    # BG paced at its guarantee (bwf_bgpace): what MPTCP's scheduler takes for BG's drain rate
    assert cc.read_map("bwf_bgpace")[IPS["a"]] == round(20e6 / 8 * P.BG_PACE_HEADROOM)
    assert _mbps(info["bg"]) <= 21.0, info["bg"]       # ss -n: plain bps
    # the connection's own send buffer: tcp_wmem[0] = Eq. 1's B, on top of its subflows'
    wmem = ns(names["a"], "sysctl", "-n", "net.ipv4.tcp_wmem").stdout.split()
    assert len(wmem) == 3 and wmem[0] == wmem[2] and int(wmem[0]) >= 128 * 1024, wmem
    assert kcount == 1                               # K: one sending WC subflow for VM a
    assert cc.read_map("bwf_alevel")[IPS["a"]] == 1024     # A_l = 1 (policy equal)
    assert live["rcvbuf_bytes"] is not None and live["rcvbuf_bytes"] >= 128 * 1024, live
    # BG held to its 20 Mb/s guarantee: what left as BG is what bwf_mark's bucket let through (the BG
    # subflow itself runs unpaced for its first MiB, and what the bucket did not hold left as WC)
    # -- a token bucket: at most rate x time + depth since the client started (frame bytes, as it counts them)
    t_all = time.monotonic() - t_start        # until now: the kernel sends what a closed socket still held
    bucket = Executor().bucket_counters(IPS["a"])
    bg_mbps = bucket["conform"] * 8 / 4 / 1e6
    # the hose's bucket is the guarantee (rate and depth as the kernel holds them), it bound (BG offered more:
    # the unpaced first MiB, pacing's 5 % headroom -- the excess left demoted), and no more than it let
    # through left as BG. How much BG then carried is a figure machine load moves: printed, not asserted.
    hose = P.BgBucket(IPS["a"], None, 20_000_000 // 8, bg_burst_bytes(20_000_000 // 8))
    raw = Executor()._bpf_raw(P.BPF_BUCKET_MAP, hose.key())
    assert raw == hose.value(), raw
    assert bucket["demoted"] > 0 and bucket["conform"] > 0, bucket
    assert bucket["conform"] <= 20e6 / 8 * t_all + bg_burst_bytes(20e6 / 8) + 1514, (bg_mbps, t_all, bucket)
    print(f"BG {bg_mbps:.1f} Mb/s, WC {wc_ok * 8 / 4 / 1e6:.1f} Mb/s, received {received * 8 / 4 / 1e6:.1f} Mb/s")


MULTI_SERVER = textwrap.dedent('''
    import socket, sys, threading
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 5001)); s.listen(8)
    print("ready", flush=True)
    total = [0]
    def drain(c):
        while True:
            b = c.recv(1 << 16)
            if not b: break
            total[0] += len(b)
    threads = []
    for _ in range(int(sys.argv[1])):
        c, _ = s.accept(); t = threading.Thread(target=drain, args=(c,)); t.start(); threads.append(t)
    for t in threads: t.join()
    print(total[0], flush=True)
''')


def _mbps(text: str, ceiling: bool = False) -> float:
    """A subflow's pacing rate (Mb/s) as ss prints it: the kernel's current
    one, or (``ceiling``) the ceiling set on the socket (SO_MAX_PACING_RATE,
    after the slash; what bwf_sockops sets -- the current rate also follows
    the subflow's cwnd and RTT, which machine load moves)."""
    m = re.search(r"pacing_rate ([\d.]+)([KMG]?)bps(?:/([\d.]+)([KMG]?)bps)?", text)
    assert m, text
    if ceiling:
        assert m.group(3), text
        return float(m.group(3)) * {"": 1e-6, "K": 1e-3, "M": 1, "G": 1e3}[m.group(4)]
    return float(m.group(1)) * {"": 1e-6, "K": 1e-3, "M": 1, "G": 1e3}[m.group(2)]


def test_bg_subflows_of_one_vm_are_paced_at_their_share(pair):
    """A VM with 3 connections: bwf_sockops counts its 3 BG subflows once
    each has sent a long flow's worth (bwf_bgcount, back to 0 when they
    close; the receiver's never) and paces each at its share of
    the guarantee with a send buffer of about a round trip -- not at the
    whole guarantee with the namespace's megabytes, which let MPTCP park
    data on BG and starve the VM's WC subflows (fig14) -- while the VM's BG
    together still gets its guarantee."""
    names, tag, tmp = pair
    conns, secs, g = 3, 5.0, 20
    for h, dev in (("a", f"va{tag}"), ("b", f"vb{tag}")):
        reply = AgentClient(f"unix:{tmp}/{h}.sock", h, host_key(MASTER, h)).request(
            "config", dict(host=h, interface=dev, address=IPS[h], nic_mbps=100, guarantee_mbps=g, policy="equal"))
        assert reply["ok"], reply
    assert ns(names["a"], "nft", "-f", "-", input=COUNTERS).returncode == 0
    server = subprocess.Popen(["ip", "netns", "exec", names["b"], sys.executable, "-c", MULTI_SERVER, str(conns)],
                              stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "ready"
    clients = [subprocess.Popen(["ip", "netns", "exec", names["a"], sys.executable, "-c", CLIENT, IPS["b"],
                                 str(secs)]) for _ in range(conns)]
    time.sleep(3)
    ss = ns(names["a"], "ss", "-tmniH", "dst", IPS["b"]).stdout
    during = cc.read_map(cc.BGCOUNT_MAP).get(IPS["a"])
    receiver = cc.read_map(cc.BGCOUNT_MAP).get(IPS["b"])
    for c in clients:
        c.wait(20)
    server.communicate(timeout=20)
    deadline = time.time() + 10
    while cc.read_map(cc.BGCOUNT_MAP).get(IPS["a"]) and time.time() < deadline:
        time.sleep(0.2)
    after = cc.read_map(cc.BGCOUNT_MAP).get(IPS["a"])
    counters = ns(names["a"], "nft", "list", "table", "ip", "bwftest").stdout
    ns(names["a"], "nft", "delete", "table", "ip", "bwftest")
    print(ss, counters, sep="\n")

    bg = [ln for ln in ss.splitlines() if "tcp-ulp-mptcp" in ln and "reno" in ln]
    assert len(bg) == conns, ss
    assert during == conns and after == 0, (during, after)
    # the receiving VM's accepted BG subflows send only ACKs: they never share its guarantee (counted,
    # they halved the pacing of a VM that sends one transfer and receives one)
    assert not receiver, receiver
    # BG is paced once a subflow has had BG_PACE_AFTER_BYTES acknowledged (short flows run unpaced)
    acked = [int(re.search(r"bytes_acked:(\d+)", ln).group(1)) for ln in bg]
    bg = [ln for ln, n in zip(bg, acked) if n >= PACE_AFTER]
    assert bg, acked
    paces = [_mbps(ln, ceiling=True) for ln in bg]
    tbs = [int(re.search(r"\btb(\d+)", ln).group(1)) for ln in bg]
    default = int(ns(names["a"], "sysctl", "-n", "net.ipv4.tcp_wmem").stdout.split()[1])
    print(f"BG pacing {paces} Mb/s, send buffers {tbs} (namespace's {default})")
    # each at the whole guarantee before (then x 1.05: 21 Mb/s), and the namespace's buffer
    # (now: those past BG_PACE_AFTER_BYTES, each between its floor g/n and the guarantee, its send buffer a
    # round trip at that rate)
    assert all(g / conns * 0.95 <= p <= g * P.BG_PACE_HEADROOM + 0.1 for p in paces), paces
    assert max(tbs) < default / 2, (tbs, default)
    bg_bytes = int(re.findall(r"counter packets \d+ bytes (\d+)", counters)[0])
    assert bg_bytes * 8 / secs / 1e6 > 0.75 * g, bg_bytes        # the VM's BG still gets its guarantee


def test_a_vm_pairs_bg_is_paced_at_the_pairs_own_limit(pair):
    """Per-pair BG pacing (issue #32 §5): a VM-pair with a BG limit of its
    own (here the pipe model's 4 Mb/s to b, as LRC sets one every round)
    has its BG subflow paced at that limit (bwf_sockops reads
    bwf_mark's pair bucket), not at the VM's whole guarantee (20 Mb/s):
    MPTCP's scheduler takes the pacing rate for what BG drains at. A
    changed limit takes effect on the open connection (read at every
    round trip)."""
    names, tag, tmp = pair
    g, pair_mbps = 20, 4
    clients = {h: AgentClient(f"unix:{tmp}/{h}.sock", h, host_key(MASTER, h)) for h in IPS}

    def configure(mbps):
        for h, dev in (("a", f"va{tag}"), ("b", f"vb{tag}")):
            extra = {"pair_limits_mbps": {IPS["b"]: mbps}} if h == "a" else {}
            reply = clients[h].request("config", dict(host=h, interface=dev, address=IPS[h], nic_mbps=100,
                                                      guarantee_mbps=g, policy="equal", **extra))
            assert reply["ok"], reply
    configure(pair_mbps)
    server = subprocess.Popen(["ip", "netns", "exec", names["b"], sys.executable, "-c", SERVER],
                              stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "ready"
    client = subprocess.Popen(["ip", "netns", "exec", names["a"], sys.executable, "-c", CLIENT, IPS["b"], "8"])
    try:
        def bg_ceiling(acked_at_least):
            deadline = time.time() + 6
            while time.time() < deadline:
                ss = ns(names["a"], "ss", "-tmniH", "dst", IPS["b"]).stdout
                bg = [ln for ln in ss.splitlines() if "tcp-ulp-mptcp" in ln and "reno" in ln]
                acked = [int(m.group(1)) for ln in bg if (m := re.search(r"bytes_acked:(\d+)", ln))]
                if bg and acked and acked[0] >= acked_at_least and "/" in bg[0].split("pacing_rate")[1].split()[0]:
                    return _mbps(bg[0], ceiling=True), acked[0]
                time.sleep(0.2)
            raise AssertionError(ss)
        first, acked = bg_ceiling(PACE_AFTER)
        configure(2 * pair_mbps)                       # the pair's limit doubled (as an LRC round would)
        time.sleep(1.0)
        second, _ = bg_ceiling(acked + 1)
    finally:
        client.wait(20)
        server.communicate(timeout=20)
    print(f"BG pacing ceiling at a pair limit of {pair_mbps}: {first} Mb/s; at {2 * pair_mbps}: {second} Mb/s")
    assert first == pytest.approx(pair_mbps * P.BG_PACE_HEADROOM, rel=0.02), first     # not g = 20
    assert second == pytest.approx(2 * pair_mbps * P.BG_PACE_HEADROOM, rel=0.02), second


PLAIN_SPORT = 40999    # the single-path connection's own source port: its packets counted apart at the receiver
PLAIN_CLIENT = CLIENT.replace("socket.SOCK_STREAM, 262)", "socket.SOCK_STREAM); s.bind(('', %d))" % PLAIN_SPORT)


def test_a_spent_bucket_marks_joined_mptcp_first_subflows_ce_and_not_plain_tcp(pair):
    """A VM whose own UDP spends its BG bucket (a batch VM): an MPTCP
    connection's first subflow, once the connection has its join, finds the
    bucket empty packet after packet, so bwf_mark demotes its data *and* marks it CE
    (OVER_HEAVY): its Reno backs off and the connection's data goes to its
    WC join, under the fair WC control, instead of the whole first subflow
    competing as WC outside it (the main job: 2.0-2.5 Mb/s per batch VM).
    Single-path TCP in the same state is demoted without a mark: it has no
    join to go to. (How the bytes then split between the subflows is a
    figure machine load moves: printed, not asserted.)"""
    from benchmarks.bg_hol import udp_flood
    import threading
    names, tag, tmp = pair
    g = 10
    for h, dev in (("a", f"va{tag}"), ("b", f"vb{tag}")):
        reply = AgentClient(f"unix:{tmp}/{h}.sock", h, host_key(MASTER, h)).request(
            "config", dict(host=h, interface=dev, address=IPS[h], nic_mbps=100, guarantee_mbps=g, wc_subflows=1,
                           policy="equal"))
        assert reply["ok"], reply
    counters = textwrap.dedent(f'''
        table ip bwfce {{
          chain in {{
            type filter hook input priority filter; policy accept;
            ip saddr {IPS["a"]} tcp sport != {PLAIN_SPORT} tcp dport 5001 ip ecn ce counter
            ip saddr {IPS["a"]} tcp sport != {PLAIN_SPORT} tcp dport 5001 ip ecn != ce counter
            ip saddr {IPS["a"]} tcp sport {PLAIN_SPORT} tcp dport 5001 ip ecn ce counter
            ip saddr {IPS["a"]} tcp sport {PLAIN_SPORT} tcp dport 5001 ip ecn {{ ect0, ect1 }} ip dscp != cs0 counter
          }}
        }}
    ''')
    assert ns(names["b"], "nft", "-f", "-", input=counters).returncode == 0
    server = subprocess.Popen(["ip", "netns", "exec", names["b"], sys.executable, "-c", MULTI_SERVER, "2"],
                              stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "ready"
    flood = subprocess.Popen(["ip", "netns", "exec", names["a"], sys.executable, "-c",
                              "import sys, threading, time; sys.path.insert(0, %r)\n"
                              "from benchmarks.bg_hol import udp_flood\n"
                              "stop = threading.Event(); threading.Timer(14, stop.set).start()\n"
                              "udp_flood((%r, 7001), %r, stop)" % (str(REPO), IPS["b"], 3 * g)])
    try:
        time.sleep(1.0)
        mptcp = subprocess.Popen(["ip", "netns", "exec", names["a"], sys.executable, "-c", CLIENT, IPS["b"], "5"])
        time.sleep(4.0)
        ss = ns(names["a"], "ss", "-tmniH", "dst", IPS["b"]).stdout
        mptcp.wait(20)
        # the kernel still sends what the closed connection held -- its subflows' queues and the MPTCP
        # socket's own, which no subflow's Send-Q shows: count once all of both is acknowledged (reading
        # the counters while the MPTCP socket still held data, a late packet was marked after them: 6 KB once)
        def unacked():
            total = 0
            for kind in ("-tnH", "-MnH"):
                out = ns(names["a"], "ss", kind, "dst", IPS["b"])
                assert out.returncode == 0, out.stderr
                total += sum(int(ln.split()[2]) for ln in out.stdout.splitlines()
                             if len(ln.split()) > 2 and ln.split()[2].isdigit())
            return total
        deadline = time.time() + 20
        while unacked():
            assert time.time() < deadline, ns(names["a"], "ss", "-tmniH", "dst", IPS["b"]).stdout
            time.sleep(0.2)
        after_mptcp = Executor().bucket_counters(IPS["a"])
        plain = subprocess.Popen(["ip", "netns", "exec", names["a"], sys.executable, "-c", PLAIN_CLIENT,
                                  IPS["b"], "4"])
        plain.wait(20)
        after_plain = Executor().bucket_counters(IPS["a"])
    finally:
        flood.wait(30)
        try:
            server.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.communicate()
        seen = ns(names["b"], "nft", "list", "table", "ip", "bwfce").stdout
        ns(names["b"], "nft", "delete", "table", "ip", "bwfce")
    print(ss, seen, after_mptcp, after_plain, sep="\n")
    ce_pkts, _, plain_ce, plain_demoted_ect = (int(n) for n in re.findall(r"counter packets (\d+)", seen))
    assert after_mptcp["ce_marked"] > 0 and ce_pkts > 0, (after_mptcp, seen)
    # the single-path connection's own packets, counted at the receiver by its source port: demoted (WC,
    # not BG's cs0) while ECN-capable -- so a mark was possible -- and never CE. (Not the agent's byte
    # count, which is per bucket: the MPTCP connection's last data, held in its msk's own queue that no
    # ss Send-Q shows, was once still going out marked during the plain run -- 88 KB in CI, 2026-11-29.)
    assert plain_demoted_ect > 0, seen
    assert plain_ce == 0, seen
    assert after_plain["demoted"] > after_mptcp["demoted"]
