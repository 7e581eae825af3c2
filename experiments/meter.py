"""Rates measured where traffic arrives: per-sender, per-class byte
counters at the receivers (nftables in each receiver's namespace), sampled
and turned into per-interval rates. Shared by the BG/WC experiments and the
main job."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from bwcommon.contract import NFT_DSCP_BG, NFT_DSCP_WC

JOIN_PORT_BASE = 10100   # hostagent.plan.HostConfig.join_port_base's default: WC joins go to these ports
from experiments.fabric import Fabric

SUBFLOWS_AT_S = 4.0   # when the meter counts each sender's subflows (after the joins)


def _meter_rules(ip_of, senders, vms: list[str] = ()) -> str:
    """The counters of one host: what ``senders`` send to the host itself
    (input), and -- a routed hypervisor's -- to its VMs at ``vms``' addresses
    (forward, by destination: the VMs' own traffic out is forwarded too)."""
    rules = []
    for snd in senders:
        ip = ip_of(snd)
        rules += [f'ip saddr {ip} meta l4proto tcp counter comment "tcp-{snd}"',      # all its TCP, any DSCP
                  f'ip saddr {ip} meta l4proto tcp ip dscp {NFT_DSCP_BG} counter comment "bg-{snd}"',
                  f'ip saddr {ip} meta l4proto tcp ip dscp {NFT_DSCP_WC} counter comment "wc-{snd}"',
                  # ...of which WC joins (to the agents' join ports): the rest of WC is demoted first subflows
                  f'ip saddr {ip} tcp dport >= {JOIN_PORT_BASE} ip dscp {NFT_DSCP_WC} counter comment "wcjoin-{snd}"',
                  f'ip saddr {ip} meta l4proto udp counter comment "udp-{snd}"']
    chains = [("input", "")]
    if vms:
        chains.append(("forward", f"ip daddr != {{ {', '.join(sorted(vms))} }} accept\n    "))
    body = "\n    ".join(rules)
    return "table ip bwfmeter {\n" + "".join(
        f"  chain {hook} {{\n    type filter hook {hook} priority filter; policy accept;\n    {first}{body}\n  }}\n"
        for hook, first in chains) + "}\n"


class Meter:
    """Per-sender, per-class byte counters at the receivers, sampled:
    counters ``tcp-<sender>`` (all its TCP), ``bg-<sender>`` (TCP, ToS
    0x00), ``wc-<sender>`` (TCP, ToS 0x20) -- ``wcjoin-<sender>`` the part of
    it on MPTCP joins, the rest is first subflows' BG demoted by the marker
    -- and ``udp-<sender>``, read in each receiver's namespace (nft). What
    ``tcp-`` counts beyond ``bg-`` and ``wc-`` carried another DSCP."""

    def __init__(self, fab: Fabric, receivers: list[str], period_s: float, trace: bool = False,
                 senders: list[str] | tuple[str, ...] = ()):
        self.fab, self.receivers, self.period_s = fab, receivers, period_s
        self.senders = tuple(senders)
        self.subflows_at_s = SUBFLOWS_AT_S
        self.samples: list[tuple[float, dict[str, int], dict[str, float]]] = []
        self.trace: list[dict] | None = [] if trace else None
        self.subflows: dict[str, dict[str, int]] | None = None
        self.connections: dict[str, list[int]] = {}   # sender -> its connections' DATA_ACKs (snd_una), once
        self._stop = threading.Event()
        self.t0 = time.time()
        self._readers: dict[str, subprocess.Popen] = {}
        self._pool: ThreadPoolExecutor | None = None

    def _nft(self, host: str, *args: str, stdin: str | None = None) -> str:
        res = self.fab.run_in(host, "nft", *args, stdin=stdin)
        if res.returncode != 0:
            raise RuntimeError(f"nft on {host}: {res.stderr.strip()}")
        return res.stdout

    @property
    def where(self) -> list[str]:
        """Where the counters live: each receiver's host (a VM's traffic is
        counted as its server forwards it -- one ``nft`` per server, not per
        VM, every sample)."""
        server_of = getattr(self.fab, "server_of", lambda n: n)
        return sorted({server_of(r) for r in self.receivers})

    def start(self) -> "Meter":
        server_of = getattr(self.fab, "server_of", lambda n: n)
        for h in self.where:
            vms = [self.fab.ip(r) for r in self.receivers if r != h and server_of(r) == h]
            rules = _meter_rules(self.fab.ip, self.senders, vms)
            self._nft(h, "-f", "-", stdin="table ip bwfmeter {}\ndelete table ip bwfmeter\n" + rules)
            # one nft per host that stays (``nft -i``: a command per line, a JSON listing per line), each
            # read stamped just before it is asked and just after its answer: the stamps bracket the kernel
            # dump alone. A shell spawning nft per read (fork, exec, library and cache set-up under the
            # stamps) bracketed 10-100+ ms on a loaded machine: every VM's 0.55 s sample read 20 % low at
            # once, the next one as much high
            self._readers[h] = self.fab.popen_in(h, READER, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                 stderr=subprocess.STDOUT, text=True, bufsize=1)
        self._pool = ThreadPoolExecutor(max_workers=len(self.where) or 1)
        self.t0 = time.time()
        threading.Thread(target=self._loop, daemon=True).start()
        return self

    def read(self) -> tuple[dict[str, int], dict[str, float]]:
        """Each counter's bytes, and when it was read (the middle of its
        host's listing, asked to answered, seconds since start): the hosts
        are read at once, and the time one read takes varies with the load."""
        total: dict[str, int] = {}
        when: dict[str, float] = {}

        def one(h: str):
            return _read_from(self._readers[h], h, self.t0)
        # every host at once, each on a thread of its own (its stamps are its own read's): one after
        # another, 16 reads under load took up to 5 s, and the 1 s windows were not 1 s
        got = list(self._pool.map(one, self.where))
        for data, t in got:
            for item in data["nftables"]:
                rule = item.get("rule")
                if not rule or "comment" not in rule:
                    continue
                counter = next(e["counter"] for e in rule["expr"] if "counter" in e)
                total[rule["comment"]] = total.get(rule["comment"], 0) + counter["bytes"]
                when[rule["comment"]] = t
        return total, when

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                sample = (time.time() - self.t0, *self.read())
            except RuntimeError:
                if self._stop.is_set():     # stop() removed the tables while this read ran
                    return
                raise
            self.samples.append(sample)
            if self.subflows is None and self.samples[-1][0] >= self.subflows_at_s:
                self.subflows = self.count_subflows()
            if self.trace is not None:
                self.trace.append({"t": round(time.time() - self.t0, 3), **self.subflow_states()})
            self._stop.wait(self.period_s)

    def _ss(self, host: str) -> tuple[str, str]:
        """``ss -tinH`` (TCP sockets, subflows included) and ``ss -MinH``
        (MPTCP sockets) of one host, in one process."""
        tcp, _, msk = self.fab.run_in(host, "sh", "-c", "ss -tinH; echo ==MSK==; ss -MinH").stdout.partition(
            "==MSK==\n")
        return tcp, msk

    def subflow_states(self) -> dict[str, list[dict]]:
        """Each sender's and receiver's MPTCP subflows as ``ss`` shows them
        (cwnd, RTO, backoff, unacked, lost, windows, rates ...), and each
        host's MPTCP sockets' queues (``<host>.msk``: Recv-Q holds the data
        waiting for an earlier hole at the connection level): what a stalled
        connection looks like."""
        from hostagent.observe import msk_queues, subflow_states
        out: dict[str, list[dict]] = {}
        for host in (*self.senders, *self.receivers):     # one process per host: the trace loads the CPU less
            tcp, msk = self._ss(host)
            out[host], out[host + ".msk"] = subflow_states(tcp), msk_queues(msk)
        return out

    def count_subflows(self) -> dict[str, dict[str, int]]:
        """Per sender: its MPTCP subflows by kind (first = BG, joins = WC),
        from ss, and K as the WC congestion control counts it (its map)."""
        from hostagent import cc
        from hostagent.observe import msk_queues
        out = {}
        k = cc.read_map("bwf_kcount")
        for snd in self.senders:
            tcp, msk = self._ss(snd)
            lines = [ln for ln in tcp.splitlines() if "tcp-ulp-mptcp" in ln]
            out[snd] = {"bg": sum(" flags:M" in ln for ln in lines), "wc": sum(" flags:J" in ln for ln in lines),
                        # joins that agreed on ECN (bwf_sockops gave them bwf_wc_ecn): the rest are
                        # not ECN-capable, and the WC queues' AQM drops their packets instead of marking
                        "wc_ecn": sum(" flags:J" in ln and " bwf_wc_ecn " in ln for ln in lines),
                        "k": k.get(self.fab.ip(snd), 0)}
            # which connection is whose, for ktrace's stalls (data sequence numbers are per connection)
            self.connections[snd] = [m["snd_una"] for m in msk_queues(msk) if "snd_una" in m]
        return out

    def stop(self) -> None:
        self._stop.set()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        for reader in self._readers.values():
            try:
                reader.stdin.close()
            except (BrokenPipeError, ValueError, OSError):
                pass
            try:
                reader.wait(5)
            except subprocess.TimeoutExpired:
                reader.kill()
                reader.wait()
        for h in self.where:
            try:
                self._nft(h, "delete", "table", "ip", "bwfmeter")
            except RuntimeError:
                pass

    def rates(self) -> list[dict]:
        return interval_rates(self.samples)


# the per-host reader: nft in interactive mode, a JSON listing per command line
READER = ["nft", "-j", "-i"]
LIST = "list table ip bwfmeter\n"


def _read_from(reader: subprocess.Popen, host: str, t0: float) -> tuple[dict, float]:
    """Ask a :data:`READER` for the meter's table and read its answer: the
    listing, and the middle of asked-to-answered in seconds since ``t0``."""
    asked = time.time()
    try:
        reader.stdin.write(LIST)
        reader.stdin.flush()
    except (BrokenPipeError, ValueError, OSError) as exc:
        raise RuntimeError(f"nft on {host}: the meter's reader ended ({exc})") from None
    line = reader.stdout.readline()
    answered = time.time()
    if not line:
        raise RuntimeError(f"nft on {host}: the meter's reader ended")
    try:
        listing = json.loads(line)
    except json.JSONDecodeError:
        raise RuntimeError(f"nft on {host}: no listing of table ip bwfmeter ({line[:80]!r})") from None
    if not isinstance(listing, dict) or "nftables" not in listing:
        raise RuntimeError(f"nft on {host}: no listing of table ip bwfmeter ({line[:80]!r})")
    return listing, (asked + answered) / 2 - t0


def interval_rates(samples: list[tuple[float, dict[str, int], dict[str, float]]]) -> list[dict]:
    """Mb/s per counter between consecutive samples (each over the times its
    own counter was read), stamped at the sample's start time."""
    out = []
    for (_, a, ta), (t1, b, tb) in zip(samples, samples[1:]):
        row = {"t": round(t1, 3)}
        for k in b:
            dt = tb[k] - ta.get(k, tb[k])
            row[k] = (b[k] - a.get(k, 0)) * 8 / dt / 1e6 if dt > 0 else 0.0
        out.append(row)
    return out


def window_mean(rates: list[dict], key: str, t_from: float, t_to: float) -> float:
    vals = [r.get(key, 0.0) for r in rates if t_from < r["t"] <= t_to]
    return sum(vals) / len(vals) if vals else 0.0
