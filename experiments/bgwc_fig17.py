"""The BG/WC paper's Fig. 17 with the delay line (issue #23 §1): one MPTCP
connection, BG and WC subflows, between two hosts whose agents put BG/WC in
force (HTB, ToS marking, bwf_wc, Eq. 1's buffers); the WC subflow's path
gets +1 ms of RTT every 15 s. The receive-buffer rule (Eq. 1: B >=
beta x max RTT x sum BW, recomputed by the receiver's agent from its live
subflows) should keep WC's rate as its RTT grows; with a small beta the
buffer does not follow and WC's rate falls.

Two delay lines share the link's ends with complementary ToS filters (the
WC ToS, and everything else), so the WC subflow alone has the growing delay
and BG's frames never wait behind it. Upstream MPTCP has neither of the
out-of-tree kernel's answers to a subflow that holds the receive window up
-- opportunistic reinjection of the blocking segment on another subflow
and penalising (halving) the slow subflow's window (multipath-tcp/
mptcp_net-next issues 332 and 345) -- so the buffer is all there is.

    bwfabric experiment bgwc-fig17 [seconds=75] [betas=3,0.5]
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from mininet_topos.delayline.testbed import sh
from experiments.coupled.testbed import SENDER, SINK
from bwcommon.contract import TOS_MASK, TOS_WC
from hostagent import cc
from bwcommon.channel import host_key, write_secret
from bwcommon.agentclient import AgentClient
from mininet_topos.delayline import DelayLine, offloads_off

REPO = Path(__file__).resolve().parents[1]
MASTER = bytes(range(7, 39))
IPS = {"a": "10.78.9.1", "b": "10.78.9.2"}
CLASS_RE = re.compile(r"class htb (\S+) .*?\n\s*Sent (\d+) bytes", re.S)


@dataclass
class Config:
    seconds: float = 75.0
    step_ms: float = 1.0             # RTT added to the WC path...
    every_s: float = 15.0            # ...this often
    base_delay_us: float = 1000.0    # one way, both paths
    nic_mbps: float = 50.0
    guarantee_mbps: float = 10.0
    betas: tuple[float, ...] = (3.0, 0.5)
    sample_s: float = 0.5


def _ns(name: str, *cmd: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", name, *cmd], capture_output=True, text=True, **kw)


@contextlib.contextmanager
def pair(tmp: Path):
    tag = uuid.uuid4().hex[:5]
    a, m, b = f"f17A{tag}", f"f17M{tag}", f"f17B{tag}"
    made, procs = [], []
    try:
        for n in (a, m, b):
            sh("ip", "netns", "add", n)
            made.append(n)
        sh("ip", "link", "add", "a0", "netns", a, "type", "veth", "peer", "name", "xa", "netns", m)
        sh("ip", "link", "add", "b0", "netns", b, "type", "veth", "peer", "name", "xb", "netns", m)
        for n, dev, ip in ((a, "a0", IPS["a"]), (b, "b0", IPS["b"])):
            sh("ip", "-n", n, "addr", "add", f"{ip}/24", "dev", dev)
            sh("ip", "-n", n, "link", "set", "lo", "up")
        for n, dev in ((a, "a0"), (b, "b0"), (m, "xa"), (m, "xb")):
            sh("ip", "-n", n, "link", "set", dev, "up")
            offloads_off(dev, n)
        cc.load()
        for h, n in (("a", a), ("b", b)):
            write_secret(tmp / f"{h}.key", host_key(MASTER, h).hex())
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", n, sys.executable, "-m", "bwfabric.cli", "agent", "--host", h,
                 "--key-file", str(tmp / f"{h}.key"), "--listen", f"unix:{tmp}/{h}.sock",
                 "--state-dir", str(tmp / f"state-{h}")], cwd=REPO, stderr=open(tmp / f"{h}.log", "w")))
        for h in IPS:
            deadline = time.time() + 10
            while not (tmp / f"{h}.sock").exists():
                if time.time() > deadline:
                    raise RuntimeError((tmp / f"{h}.log").read_text()[-2000:])
                time.sleep(0.1)
        yield {"a": a, "m": m, "b": b}
    finally:
        for p in procs:
            p.terminate()
            with contextlib.suppress(Exception):
                p.wait(10)
        for n in made:
            sh("ip", "netns", "del", n, check=False)


def one(cfg: Config, beta: float, tmp: Path) -> dict:
    tmp.mkdir(parents=True, exist_ok=True)
    with pair(tmp) as names:
        clients = {h: AgentClient(f"unix:{tmp}/{h}.sock", h, host_key(MASTER, h)) for h in IPS}
        for h, dev in (("a", "a0"), ("b", "b0")):
            reply = clients[h].request("config", dict(host=h, interface=dev, address=IPS[h], nic_mbps=cfg.nic_mbps,
                                                      guarantee_mbps=cfg.guarantee_mbps, wc_subflows=1,
                                                      policy="equal", beta=beta))
            if not reply.get("ok"):
                raise RuntimeError(f"agent {h}: {reply}")
        wc_tos = (TOS_WC, TOS_MASK)
        lines = [DelayLine("xa", "xb", cfg.base_delay_us, netns=names["m"], not_tos=wc_tos).start(),
                 DelayLine("xa", "xb", cfg.base_delay_us, netns=names["m"], tos=wc_tos,
                           step_us=cfg.step_ms * 1000 / 2, step_every_s=cfg.every_s).start()]
        t0 = time.monotonic()
        # one MPTCP connection (experiments.coupled's sender and sink)
        server = subprocess.Popen(["ip", "netns", "exec", names["b"], sys.executable, "-c", SINK, "1", "0"],
                                  stdout=subprocess.PIPE, text=True)
        server.stdout.readline()
        client = subprocess.Popen(["ip", "netns", "exec", names["a"], sys.executable, "-c", SENDER, IPS["b"],
                                   str(cfg.seconds), "262"], stdout=subprocess.DEVNULL)
        samples, prev = [], None
        while client.poll() is None:
            time.sleep(cfg.sample_s)
            text = _ns(names["a"], "tc", "-s", "class", "show", "dev", "a0").stdout
            sent = {c: int(b) for c, b in CLASS_RE.findall(text)}
            rmem = _ns(names["b"], "cat", "/proc/sys/net/ipv4/tcp_rmem").stdout.split()
            ss = _ns(names["a"], "ss", "-tniH", "dst", IPS["b"]).stdout
            rtts = {("wc" if "bwf_wc" in ln else "bg"): float(r.group(1)) for ln in ss.splitlines()
                    if (r := re.search(r"\brtt:([\d.]+)/", ln)) and "tcp-ulp-mptcp" in ln}
            now = time.monotonic() - t0
            if prev is not None:
                dt = now - prev[0]
                samples.append({"t": round(now, 2),
                                "bg_mbps": (sent.get("1:10", 0) - prev[1].get("1:10", 0)) * 8 / dt / 1e6,
                                "wc_mbps": sum(sent.get(c, 0) - prev[1].get(c, 0) for c in ("1:20", "1:21")) * 8 / dt / 1e6,
                                "rcvbuf": int(rmem[2]) if len(rmem) == 3 else None,
                                "rtt_ms": rtts})
            prev = (now, sent)
        server.communicate(timeout=30)
        stats = [line.stop() for line in lines]
    return {"beta": beta, "samples": samples, "delay_lines": stats}


def summary(res: dict, cfg: Config) -> list[dict]:
    """Per step of the WC path's delay: mean WC and BG rates, the
    receiver's buffer and WC's RTT (first 3 s of each step left out)."""
    out = []
    steps = int(cfg.seconds // cfg.every_s) + 1
    for k in range(steps):
        lo, hi = k * cfg.every_s + 3, (k + 1) * cfg.every_s
        s = [x for x in res["samples"] if lo <= x["t"] < hi]
        if not s:
            continue
        mean = lambda key: sum(x[key] for x in s) / len(s)   # noqa: E731
        wc_rtts = [x["rtt_ms"].get("wc") for x in s if x["rtt_ms"].get("wc")]
        out.append({"extra_rtt_ms": k * cfg.step_ms, "wc_mbps": round(mean("wc_mbps"), 2),
                    "bg_mbps": round(mean("bg_mbps"), 2), "rcvbuf_kb": round(s[-1]["rcvbuf"] / 1024) if
                    s[-1]["rcvbuf"] else None, "wc_rtt_ms": round(sum(wc_rtts) / len(wc_rtts), 2) if wc_rtts else None})
    return out


def run(cfg: Config, out_dir: Path) -> dict:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {}
    for beta in cfg.betas:
        res = one(cfg, beta, out_dir / f"beta-{beta:g}")
        results[f"{beta:g}"] = {"summary": summary(res, cfg), **res}
        print(f"beta {beta:g}:")
        for row in results[f"{beta:g}"]["summary"]:
            print("  ", json.dumps(row))
    (out_dir / "result.json").write_text(json.dumps(results, indent=1))
    _plot(results, out_dir / "figure.png", cfg)
    return results


def _plot(results: dict, path: Path, cfg: Config) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    for beta, r in results.items():
        t = [x["t"] for x in r["samples"]]
        axes[0].plot(t, [x["wc_mbps"] for x in r["samples"]], label=f"WC, beta {beta}")
        axes[0].plot(t, [x["bg_mbps"] for x in r["samples"]], "--", label=f"BG, beta {beta}")
        axes[1].plot(t, [(x["rcvbuf"] or 0) / 1024 for x in r["samples"]], label=f"receive buffer, beta {beta}")
    for k in range(1, int(cfg.seconds // cfg.every_s) + 1):
        for ax in axes:
            ax.axvline(k * cfg.every_s, color="grey", lw=0.5)
    axes[0].set_ylabel("Mb/s")
    axes[1].set_ylabel("tcp_rmem max (KiB)")
    axes[1].set_xlabel(f"s (WC path +{cfg.step_ms:g} ms RTT every {cfg.every_s:g} s)")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
