"""What LRC's view of the open pairs costs the agent, against the size of
the host's conntrack table (issue #31 §3). Run as root:

    .venv/bin/python -m benchmarks.conntrack_cost [--foreign 0,10000,100000] [--rounds 20]

In a namespace of its own: 8 entries of the VM's address (the tenant's
pairs) and N foreign entries (another address's UDP flows, held by a
10-minute UDP timeout). Per read, the CPU time (this process: user +
system, which includes the kernel's walk of the table done for us) of

- ``text``: the kernel's whole table as text (``/proc/net/nf_conntrack``),
  what the agent read before;
- ``dump``: one kernel-filtered netlink dump per direction (saddr, daddr);
- ``events``: what the agent reads now (``hostagent.conntrack.VmConntrack``):
  the events since the last read and one lookup per VM entry, with a
  filtered dump every 60 s (its cost spread over the rounds is shown).

and the share of a core each costs at tau_v = 50 ms (LRC's default).
The budget the agent states (docs/lrc.md): its conntrack read under 5 %
of a core at tau_v = 50 ms whatever the size of the table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    import json, socket, subprocess, sys, time
    from hostagent.conntrack import RESYNC_S, ConntrackReader, VmConntrack
    from hostagent.lrc import read_conntrack
    n, rounds = int(sys.argv[1]), int(sys.argv[2])
    for cmd in (["add", "table", "ip", "t"], ["add", "chain", "ip", "t", "o",
                "{ type filter hook output priority 0; }"], ["add", "rule", "ip", "t", "o", "ct", "state", "new", "counter"]):
        subprocess.run(["nft", *cmd], check=True)
    open("/proc/sys/net/netfilter/nf_conntrack_udp_timeout", "w").write("600")
    subprocess.run(["ip", "addr", "add", "10.9.0.2/24", "dev", "ag0"], check=True)
    subprocess.run(["ip", "addr", "add", "10.8.0.1/16", "dev", "ag1"], check=True)
    vm = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    vm.bind(("10.9.0.1", 0))
    for i in range(8):
        vm.sendto(b"x", ("10.9.0.%d" % (100 + i), 5000))
    other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    other.bind(("10.9.0.2", 0))
    for i in range(n):
        other.sendto(b"x", ("10.8.0.%d" % (2 + i // 60000), 1024 + i % 60000))   # few neighbours, many ports
    total = len(read_conntrack())

    def cpu(fn):
        fn()
        c = time.process_time()
        for _ in range(rounds):
            got = fn()
        return (time.process_time() - c) / rounds, len(got)
    text_s, text_n = cpu(lambda: [e for e in read_conntrack() if "10.9.0.1" in (e.saddr, e.daddr)])
    reader = ConntrackReader()
    dump_s, dump_n = cpu(lambda: reader.entries_of("10.9.0.1"))
    ct = VmConntrack("10.9.0.1")
    ct.entries()
    events_s, events_n = cpu(ct.entries)
    print(json.dumps({"foreign": n, "table": total, "vm_entries": [text_n, dump_n, events_n],
                      "text_ms": text_s * 1e3, "dump_ms": dump_s * 1e3, "events_ms": events_s * 1e3,
                      "resync_ms_per_round": dump_s * 1e3 * 0.05 / RESYNC_S}))
''')


def measure(foreign: int, rounds: int) -> dict:
    from benchmarks.agent_faults import make_netns
    ns = make_netns()
    try:
        res = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", SCRIPT, str(foreign), str(rounds)],
                             capture_output=True, text=True, timeout=600)
        if res.returncode != 0:
            raise RuntimeError(res.stderr)
        return json.loads(res.stdout)
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--foreign", default="0,10000,100000")
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args(argv)
    tau_v = 0.05
    print(f"{'foreign':>8} {'table':>7} {'VM':>3} | {'text ms':>8} {'core':>6} | {'dump ms':>8} {'core':>6} | "
          f"{'events ms':>9} {'+resync':>8} {'core':>6}")
    for n in (int(x) for x in args.foreign.split(",")):
        r = measure(n, args.rounds)
        ev = r["events_ms"] + r["resync_ms_per_round"]
        print(f"{r['foreign']:>8} {r['table']:>7} {r['vm_entries'][2]:>3} | {r['text_ms']:>8.2f} "
              f"{r['text_ms'] / 1e3 / tau_v:>6.1%} | {r['dump_ms']:>8.2f} {r['dump_ms'] / 1e3 / tau_v:>6.1%} | "
              f"{r['events_ms']:>9.2f} {r['resync_ms_per_round']:>8.3f} {ev / 1e3 / tau_v:>6.1%}")
        assert r["vm_entries"][0] == r["vm_entries"][1] == r["vm_entries"][2] == 8, r
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
