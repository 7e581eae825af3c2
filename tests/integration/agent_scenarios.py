"""Host-agent scenarios run *inside* a network namespace with ``ag0``
(10.9.0.1/24, veth peer ``ag1``) by test_agent_hardening: each prints one
JSON object of what it saw. Real tc, nftables, MPTCP endpoints, sysctls and
BPF hash maps (in a bpffs of the scenario's own)."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.agent_faults import drop_bpf_maps, make_bpf_maps
from hostagent import plan as P
from hostagent.agent import Agent
from hostagent.executor import ExecError, Executor

# these scenarios exercise the HTB path of per-pair limits (classes in stable slots, moved in place):
# demote_bg off. The marker's pair buckets: test_bg_marker.py and lrc_pairs(marker=True)
BASE = dict(host="ns", interface="ag0", address="10.9.0.1", nic_mbps=100, guarantee_mbps=10, wc_subflows=2,
            join_port_base=10100, demote_bg=False)


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True).stdout


def kernel() -> dict:
    return {"qdisc": sh("tc", "qdisc", "show", "dev", "ag0"), "classes": sh("tc", "class", "show", "dev", "ag0"),
            "filters": sh("tc", "filter", "show", "dev", "ag0"), "nft": sh("nft", "list", "tables"),
            "endpoints": sh("ip", "mptcp", "endpoint", "show"),
            "ecn": Path("/proc/sys/net/ipv4/tcp_ecn").read_text().strip()}


def throttled(dev: str = "ag0") -> int:
    """The device's qdiscs' overlimits and drops, summed: it grows while a
    class is held at its rate (HTB counts an overlimit each time it
    throttles a class; a full leaf drops)."""
    qdiscs = json.loads(sh("tc", "-s", "-j", "qdisc", "show", "dev", dev) or "[]")
    return sum(int(q.get("overlimits", 0)) + int(q.get("drops", 0)) for q in qdiscs)


def agent(tmp: Path, bpf_dir: Path) -> Agent:
    return Agent("ns", secrets.token_bytes(32), tmp / "state",
                 executor=Executor(state_file=tmp / "state" / "executor.json", bpf_pin_dir=bpf_dir))


def apply(a: Agent, **over) -> dict:
    try:
        changes = a.put_in_force(P.HostConfig.from_dict({**BASE, **over}), None)
        return {"ok": True, "changes": changes}
    except ExecError as exc:
        return {"ok": False, "error": str(exc)}


def first_config_fails(tmp: Path) -> dict:
    """A real kernel error on the first config (no BPF maps pinned: the
    last step fails after sysctl, MPTCP, nftables and tc changed)."""
    before = kernel()
    a = agent(tmp, tmp / "no-bpffs")
    reply = apply(a)
    return {"reply": reply, "status": a.status(), "before": before, "after": kernel()}


def failed_apply_then_repair(tmp: Path) -> dict:
    """Config A in force; the BPF maps vanish; config B fails at its last
    step (a real error) and A cannot be put back either; the maps return;
    re-sending A must repair the kernel."""
    bpf = tmp / "bpffs"
    make_bpf_maps(bpf)
    a = agent(tmp, bpf)
    out = {"a": apply(a, guarantee_mbps=10)}
    out["classes_a"] = kernel()["classes"]
    drop_bpf_maps(bpf)
    out["b"] = apply(a, guarantee_mbps=30, ecn=False)
    out["status_after_b"] = a.status()
    out["classes_after_b"] = kernel()["classes"]
    # SIGTERM of a degraded agent, as a restarted process would do it: a new
    # executor from the state file alone removes everything, half-applied included
    fresh = Executor(state_file=tmp / "state" / "executor.json", bpf_pin_dir=bpf)
    fresh.teardown()
    out["clean_after_degraded_teardown"] = fresh.clean_differences()
    out["kernel_after_degraded_teardown"] = kernel()
    make_bpf_maps(bpf)
    out["a_again"] = apply(a, guarantee_mbps=10)
    out["status_after_a_again"] = a.status()
    out["classes_after_a_again"] = kernel()["classes"]
    a.executor.teardown()
    out["clean"] = a.executor.clean_differences()
    drop_bpf_maps(bpf)
    return out


def structural_changes(tmp: Path) -> dict:
    """Hose -> pipe -> one more pair -> one pair less -> hose on a live
    agent; each step in force (read back) with the surviving pairs'
    class ids unchanged."""
    bpf = tmp / "bpffs"
    make_bpf_maps(bpf)
    a = agent(tmp, bpf)
    steps = [{}, {"pair_limits_mbps": {"10.9.0.2": 5, "10.9.0.5": 7}},
             {"pair_limits_mbps": {"10.9.0.2": 5, "10.9.0.3": 3, "10.9.0.5": 7}},
             {"pair_limits_mbps": {"10.9.0.3": 3, "10.9.0.5": 7.5}}, {}]
    out = []
    for over in steps:
        reply = apply(a, **over)
        st = a.status()
        out.append({"reply": reply, "in_force": st["in_force"], "differences": st["differences"],
                    "slots": a.executor.pair_slots("ag0"), "classes": kernel()["classes"]})
    a.executor.teardown()
    drop_bpf_maps(bpf)
    return {"steps": out}


def pair_updates(tmp: Path, n: int = 1000) -> dict:
    """n rate updates of one pair among 64 (LRC's pattern), timed."""
    bpf = tmp / "bpffs"
    make_bpf_maps(bpf)
    a = agent(tmp, bpf)
    pairs = {f"10.9.{1 + i // 250}.{2 + i % 250}": 5.0 for i in range(64)}
    t0 = time.perf_counter()
    first = apply(a, pair_limits_mbps=pairs)
    t_first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(n):
        pairs[f"10.9.1.{2 + i % 64}"] = 1 + (i % 40)
        cfg = P.HostConfig.from_dict({**BASE, "pair_limits_mbps": pairs})
        a.put_in_force(cfg, None)
    dt = time.perf_counter() - t0
    in_force = a.status()["in_force"]
    a.executor.teardown()
    drop_bpf_maps(bpf)
    return {"first": first, "first_s": t_first, "updates": n, "seconds": dt, "in_force": in_force}


def refused_configs_change_nothing(tmp: Path, n: int = 300) -> dict:
    """A config in force; then ``n`` signed but invalid configurations
    (random field values: NaN, Infinity, huge, negative, wrong types,
    unknown keys, another host) through the agent's request handler; the
    kernel, read back, must be exactly as before, and the agent must still
    report the first config in force."""
    import random

    from bwcommon.channel import Sender
    bpf = tmp / "bpffs"
    make_bpf_maps(bpf)
    key = secrets.token_bytes(32)
    a = Agent("ns", key, tmp / "state", executor=Executor(state_file=tmp / "state" / "executor.json",
                                                          bpf_pin_dir=bpf))
    tx = Sender(key, "ns")
    from bwcommon.channel import Receiver, ReplayGuard
    rx = Receiver(key, "ns", ReplayGuard(), direction="a2c")
    first = rx.open(a.handle(tx.seal("config", {**BASE, "pair_limits_mbps": {"10.9.0.2": 5}})))[1]
    before = kernel()
    rng = random.Random(11)
    values = [float("nan"), float("inf"), -float("inf"), 1e308, -1, 0, 2**64, "10", None, True, [], {}, "x" * 300,
              "10.9.0.256", "255.255.255.255", "ag0/../x", "\n", 1e12]
    refused = 0
    for _ in range(n):
        body = {**BASE, "pair_limits_mbps": {"10.9.0.2": 5}}
        for _ in range(rng.randint(1, 3)):
            field = rng.choice([*P.HostConfig.FIELDS, "bogus"])
            body[field] = rng.choice(values)
        if rng.random() < 0.2:
            body["pair_limits_mbps"] = {rng.choice(["10.9.0.3", "x", "10.9.0.300"]): rng.choice(values)}
        try:
            raw = tx.seal("config", body)
        except ValueError:          # NaN cannot even be signed canonically: skip
            continue
        reply = rx.open(a.handle(raw))[1]
        if not reply["ok"]:
            refused += 1
        else:                       # an accidental valid config: put the first back
            rx.open(a.handle(tx.seal("config", {**BASE, "pair_limits_mbps": {"10.9.0.2": 5}})))
    after = kernel()
    st = a.status()
    a.executor.teardown()
    drop_bpf_maps(bpf)
    return {"first": first, "refused": refused, "same": before == after, "in_force": st["in_force"],
            "config_guarantee": st["config"]["vm"]["guarantee_mbps"] if st["config"] else None}


PHASES = [({}, 20.0), ({"pair_limits_mbps": {"10.9.0.2": 8}}, 8.0),
          ({"pair_limits_mbps": {"10.9.0.2": 8, "10.9.0.3": 3}}, 8.0),
          ({"pair_limits_mbps": {"10.9.0.3": 3}}, 20.0), ({}, 20.0),
          ({"pair_limits_mbps": {"10.9.0.2": 6}}, 6.0), ({}, 20.0)]


def under_traffic(tmp: Path, phase_s: float = 2.0, offered_mbps: float = 60.0) -> dict:
    """UDP (BG: ToS 0) to 10.9.0.2 at ``offered_mbps`` while the agent goes
    hose (20 Mb/s) -> pipe -> pair added -> pair removed -> hose ...; prints
    each phase's start (time.time()) and the limit that applies to the
    traffic then. The receiver's side is sampled by the test."""
    import socket
    import threading

    bpf = tmp / "bpffs"
    make_bpf_maps(bpf)
    a = agent(tmp, bpf)
    stop = threading.Event()

    def flood():
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        payload = b"x" * 1400
        gap = 1400 * 8 / (offered_mbps * 1e6)
        nxt = time.perf_counter()
        while not stop.is_set():
            try:
                sock.sendto(payload, ("10.9.0.2", 9))
            except OSError:
                pass
            nxt += gap
            delay = nxt - time.perf_counter()
            if delay > 0:
                time.sleep(delay)

    apply(a, guarantee_mbps=20)   # the hose in force before the traffic starts
    th = threading.Thread(target=flood, daemon=True)
    th.start()
    time.sleep(phase_s)
    phases = []
    for over, limit in PHASES:
        t = time.time()
        reply = apply(a, guarantee_mbps=20, **over)
        phases.append({"t": t, "t_done": time.time(), "limit_mbps": limit, "reply": reply,
                       "in_force": a.status()["in_force"], "throttled_from": throttled()})
        time.sleep(phase_s)
        phases[-1]["throttled_to"] = throttled()       # before the next change may replace a qdisc
    stop.set()
    th.join(2)
    a.executor.teardown()
    drop_bpf_maps(bpf)
    return {"phases": phases, "end": time.time()}


LRC_PEERS = {"10.9.0.2": {"weight": 1.0, "guarantee_mbps": 40}, "10.9.0.3": {"weight": 3.0, "guarantee_mbps": 40}}


def pair_buckets(a: Agent, src: str = "10.9.0.1", dsts=("10.9.0.2", "10.9.0.3")) -> dict[str, float]:
    """bwf_mark's pair buckets of ``src`` as the kernel has them, Mb/s."""
    got = {}
    for dst in dsts:
        raw = a.executor._bpf_raw(P.BPF_BUCKET_MAP, P.BgBucket(src, dst, 0, 0).key())
        if raw is not None:
            got[dst] = round(int.from_bytes(raw[:8], "little") * 8 / 1e6, 3)
    return got


def udp_to(sock, *dsts) -> None:
    """2 x 1400 bytes to each destination: above what counts as sending in one LRC round."""
    for d in dsts:
        for _ in range(2):
            try:
                sock.sendto(b"x" * 1400, (d, 9))
            except OSError:
                pass


def lrc_agent(tmp: Path, bpf: Path, wc: str, marker: bool) -> tuple[Agent, dict]:
    """An agent on a bpffs of its own with one VM (40 Mb/s) running LRC in
    combined mode (``wc``) towards LRC_PEERS; and its first apply."""
    make_bpf_maps(bpf)
    a = agent(tmp, bpf)
    lrc = {"mode": "combined", "wc": wc, "weight": 1.0, "params": {"alpha": 20.0, "pair_idle_s": 1.0},
           "peers": LRC_PEERS}
    cfg = P.HostConfig.from_dict({**BASE, "guarantee_mbps": 40, "wc_subflows": 1, "lrc": lrc, "demote_bg": marker})
    return a, {"apply": a._vm(cfg).put_with_lrc(cfg)}


def lrc_pairs(tmp: Path, marker: bool = False) -> dict:
    """LRC on a live agent: pairs open from real conntrack entries (UDP to
    two peers), the controller's terms raise v, the WC ceilings follow by
    the rates-only path, pairs close when idle; the kernel read back at
    every step. ``marker``: the pairs' BG limits are bwf_mark's buckets
    (read back from its map), else HTB classes."""
    import socket

    from hostagent.executor import read_tc

    bpf = tmp / "bpffs"
    a, out = lrc_agent(tmp, bpf, "ceiling", marker)

    def classes():
        st = read_tc("ag0")
        return {f"{c >> 16:x}:{c & 0xFFFF:x}": round(k.rate_Bps * 8 / 1e6, 3) for c, k in st.classes.items()}

    def buckets():              # bwf_mark's pair buckets as the kernel has them, Mb/s
        return pair_buckets(a)

    def snap(tag, did):
        st = a.status()
        out[tag] = {"did": did, "classes": classes(), "buckets": buckets(), "in_force": st["in_force"],
                    "differences": st["differences"], "pairs": st["lrc"]["pairs"]}

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def poke(*dsts):
        udp_to(sock, *dsts)

    def sending(*dsts):         # the agent compares byte counts between rounds: two rounds with traffic
        poke(*dsts)
        a.lrc_round()
        poke(*dsts)
        return a.lrc_round()

    snap("quiet", a.lrc_round())
    snap("one_pair", sending("10.9.0.2"))
    with a.lock:
        reply = a._dispatch("rates", {"generation": 0, "factors": {"10.9.0.2": [30.0, 2.0, 40.0]}})
    out["rates_reply"] = reply
    poke("10.9.0.2")
    snap("factor", a.lrc_round())
    snap("two_pairs", sending("10.9.0.2", "10.9.0.3"))
    # the rates-only path, timed: the factor moves every round
    times, dids = [], []
    for k in range(100):
        with a.lock:
            a._dispatch("rates", {"generation": 0, "factors": {"10.9.0.2": [20.0 + k % 2 * 10, 2.0, 40.0],
                                                               "10.9.0.3": [20.0, 2.0, 40.0]}})
        poke("10.9.0.2", "10.9.0.3")
        t0 = time.perf_counter()
        dids.append(a.lrc_round())
        times.append(time.perf_counter() - t0)
    snap("after_updates", dids[-1])
    out["update_ms"] = sorted(x * 1e3 for x in times)
    out["repairs"] = a.vm().lrc_repairs
    out["update_did"] = dids
    time.sleep(1.6)                       # no packets for longer than pair_idle_s
    snap("idle", a.lrc_round())
    a.executor.teardown()
    out["clean"] = a.executor.clean_differences()
    drop_bpf_maps(bpf)
    return out


def lrc_pairs_marker(tmp: Path) -> dict:
    return lrc_pairs(tmp, marker=True)


def lrc_pairs_buckets(tmp: Path) -> dict:
    """The main job's LRC (combined, ``wc: competition``, the marker): a
    pair that opens or closes changes its bucket only -- no apply of the
    whole plan, whose tool runs were most of what the agents cost the
    emulation -- and the kernel read back agrees at every step."""
    import socket

    bpf = tmp / "bpffs"
    a, out = lrc_agent(tmp, bpf, "competition", True)
    vm = a.vm()

    def buckets():
        return pair_buckets(a)

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def sending(*dsts):
        for _ in range(2):
            udp_to(sock, *dsts)
            did = a.lrc_round()
        return did

    def snap(tag, did):
        st = a.status()
        out[tag] = {"did": did, "buckets": buckets(), "in_force": st["in_force"], "differences": st["differences"],
                    "fast": vm.lrc_pairs_fast, "changes": a.executor.changes}
    snap("quiet", a.lrc_round())
    snap("one_pair", sending("10.9.0.2"))
    snap("two_pairs", sending("10.9.0.2", "10.9.0.3"))
    time.sleep(1.6)
    snap("idle", a.lrc_round())
    out["repairs"] = vm.lrc_repairs
    a.executor.teardown()
    out["clean"] = a.executor.clean_differences()
    drop_bpf_maps(bpf)
    return out


def strays_removed(tmp: Path) -> dict:
    """Entries another run left in the machine-wide maps under this VM's
    address -- a BG pacing ceiling, a pair bucket -- are deleted when the
    VM is configured (they acted on its sockets: a VM paced at another
    run's 0.26 Mb/s); another address's entries are left alone."""
    bpf = tmp / "bpffs"
    make_bpf_maps(bpf)
    a = agent(tmp, bpf)

    def put(name, key: bytes, value: bytes):
        subprocess.run(["bpftool", "map", "update", "pinned", str(bpf / name), "key", *map(str, key),
                        "value", *map(str, value)], check=True)
    me, other = "10.9.0.1", "10.9.0.5"
    import ipaddress
    put(P.BPF_PACE_MAP, ipaddress.IPv4Address(me).packed, (32812).to_bytes(8, "little"))
    stale = P.BgBucket(me, "10.9.0.7", 1000, 3000)
    foreign = P.BgBucket(other, "10.9.0.7", 1000, 3000)
    for b in (stale, foreign):
        put(P.BPF_BUCKET_MAP, b.key(), b.value())
    out: dict = {"apply": apply(a, pace_bg=False, demote_bg=True)}
    out["pace"] = a.executor._bpf_lookup(P.BPF_PACE_MAP, me)
    out["stale_bucket"] = a.executor._bpf_raw(P.BPF_BUCKET_MAP, stale.key()) is not None
    out["foreign_bucket"] = a.executor._bpf_raw(P.BPF_BUCKET_MAP, foreign.key()) is not None
    st = a.status()
    out["in_force"], out["differences"] = st["in_force"], st["differences"]
    # written after the apply: status says so (it does not trust what it last wrote)
    put(P.BPF_PACE_MAP, ipaddress.IPv4Address(me).packed, (32812).to_bytes(8, "little"))
    st = a.status()
    out["after_write"] = {"in_force": st["in_force"], "differences": st["differences"]}
    a.executor.teardown()
    drop_bpf_maps(bpf)
    return out


def _lrc_classes() -> dict[str, float]:
    from hostagent.executor import read_tc
    st = read_tc("ag0")
    return {f"{c >> 16:x}:{c & 0xFFFF:x}": round(k.rate_Bps * 8 / 1e6, 3) for c, k in st.classes.items()}


def lrc_before_kill(tmp: Path) -> dict:
    """An agent process running LRC (HTB pair classes): one pair open, a
    factor in force (BG 40, WC ceiling 20). Prints what the kernel holds,
    then waits to be SIGKILLed (no teardown, no handler runs: the kernel
    keeps what it held). State and bpffs under ``tmp``, kept for the next."""
    import socket
    a, out = lrc_agent(tmp, tmp / "bpffs", "ceiling", False)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _ in range(2):
        udp_to(sock, "10.9.0.2")
        a.lrc_round()
    with a.lock:
        a._dispatch("rates", {"generation": 0, "factors": {"10.9.0.2": [30.0, 2.0, 40.0]}})
    udp_to(sock, "10.9.0.2")
    out["did"] = a.lrc_round()
    out["classes"] = _lrc_classes()
    out["in_force"] = a.status()["in_force"]
    print(json.dumps(out), flush=True)
    while True:
        time.sleep(60)


def lrc_after_kill(tmp: Path) -> dict:
    """The agent started again on the killed one's state: what the kernel
    holds before any configuration; the controller's push (the same
    configuration) with no factor yet -- the fail-safe: the pair at its
    guarantee, no WC above it --; then a fresh factor."""
    import socket
    out: dict = {"kernel_at_start": _lrc_classes()}
    # the scenario's bpffs was mounted in the killed process's mount namespace (``ip netns exec``
    # gives each its own) and went with it; a host's /sys/fs/bpf keeps its pinned maps: make them again
    make_bpf_maps(tmp / "bpffs")
    a = agent(tmp, tmp / "bpffs")
    st = a.status()
    out["status_at_start"] = {"in_force": st["in_force"], "generation": st.get("generation")}
    lrc = {"mode": "combined", "wc": "ceiling", "weight": 1.0, "params": {"alpha": 20.0, "pair_idle_s": 1.0},
           "peers": LRC_PEERS}
    cfg = P.HostConfig.from_dict({**BASE, "guarantee_mbps": 40, "wc_subflows": 1, "lrc": lrc, "demote_bg": False})
    out["apply"] = a._vm(cfg).put_with_lrc(cfg)
    out["after_push"] = _lrc_classes()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _ in range(2):
        udp_to(sock, "10.9.0.2")
        out["did"] = a.lrc_round()
    out["no_factor_yet"] = _lrc_classes()
    out["no_factor_in_force"] = a.status()["in_force"]
    with a.lock:
        a._dispatch("rates", {"generation": 0, "factors": {"10.9.0.2": [30.0, 2.0, 40.0]}})
    udp_to(sock, "10.9.0.2")
    a.lrc_round()
    out["fresh_factor"] = _lrc_classes()
    a.executor.teardown()
    out["clean"] = a.executor.clean_differences()
    drop_bpf_maps(tmp / "bpffs")
    return out


SCENARIOS = {f.__name__: f for f in (first_config_fails, failed_apply_then_repair, structural_changes,
                                     pair_updates, under_traffic, refused_configs_change_nothing, lrc_pairs,
                                     lrc_pairs_marker, lrc_pairs_buckets, strays_removed, lrc_before_kill,
                                     lrc_after_kill)}

if __name__ == "__main__":
    if len(sys.argv) > 2:                      # a directory the caller keeps (a scenario in two processes)
        print(json.dumps(SCENARIOS[sys.argv[1]](Path(sys.argv[2]))))
    else:
        with tempfile.TemporaryDirectory() as d:
            print(json.dumps(SCENARIOS[sys.argv[1]](Path(d))))
