"""Flow-size workload client and server, run inside emulated hosts.

    python -m experiments.flowgen server --port 7000 --out rx.json [--mptcp]
    python -m experiments.flowgen client --plan plan.json --t0 EPOCH --deadline S --out flows.jsonl
    python -m experiments.flowgen storm --dst IP --rate N --duration S   (many one-packet UDP flows)
    python -m experiments.flowgen bulk --dst IP --port P --duration S [--conns N] [--mptcp] [--rate MBPS]

A flow is one TCP (or MPTCP) connection: an 8-byte size header, then that
many bytes; the server answers one byte when all have arrived, and the client
logs the completion time (connect to answer). The server counts received bytes
in 10 ms slots (receiver-side goodput) and writes them on SIGTERM. Flows not
done at the deadline are logged as incomplete with the bytes they had sent.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import struct
import sys
import threading
import time

IPPROTO_MPTCP = 262
SLOT_S = 0.01  # receiver byte-count resolution (s)
CHUNK = 64 * 1024


def _socket(mptcp: bool) -> socket.socket:
    return socket.socket(socket.AF_INET, socket.SOCK_STREAM, IPPROTO_MPTCP if mptcp else 0)


def serve(port: int, out: str, mptcp: bool) -> None:
    t0 = time.time()
    slots: dict[int, int] = {}
    lock = threading.Lock()
    flows_done = [0]

    def dump(*_):
        with lock:
            n = max(slots, default=-1) + 1
            data = {"t0": t0, "slot_s": SLOT_S, "bytes": [slots.get(i, 0) for i in range(n)],
                    "flows_done": flows_done[0]}
        with open(out, "w") as f:
            json.dump(data, f)
        sys.exit(0)

    signal.signal(signal.SIGTERM, dump)
    srv = _socket(mptcp)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(256)

    def handle(conn: socket.socket) -> None:
        with conn:
            hdr = b""
            while len(hdr) < 8:
                chunk = conn.recv(8 - len(hdr))
                if not chunk:
                    return
                hdr += chunk
            (size,) = struct.unpack("!Q", hdr)
            got = 0
            while got < size:
                chunk = conn.recv(min(CHUNK, size - got))
                if not chunk:
                    return
                got += len(chunk)
                slot = int((time.time() - t0) / SLOT_S)
                with lock:
                    slots[slot] = slots.get(slot, 0) + len(chunk)
            conn.sendall(b"\x01")
            with lock:
                flows_done[0] += 1

    while True:
        conn, _ = srv.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


def client(plan_file: str, t0: float, deadline: float, out: str, mptcp: bool) -> None:
    plan = json.load(open(plan_file))
    payload = b"\0" * CHUNK
    lock = threading.Lock()
    log = open(out, "w", buffering=1)
    state: dict[int, dict] = {}

    def run_flow(i: int, flow: dict) -> None:
        rec = {"id": flow["id"], "dst": flow["dst"], "size": flow["size"], "start": None,
               "fct": None, "sent": 0, "complete": False}
        state[i] = rec
        try:
            s = _socket(mptcp)
            s.settimeout(max(1.0, t0 + deadline - time.time()))
            rec["start"] = time.time() - t0
            s.connect((flow["ip"], flow["port"]))
            s.sendall(struct.pack("!Q", flow["size"]))
            left = flow["size"]
            while left > 0:
                n = s.send(payload[:min(CHUNK, left)])
                left -= n
                rec["sent"] += n
            if s.recv(1) == b"\x01":
                rec["fct"] = time.time() - t0 - rec["start"]
                rec["complete"] = True
            s.close()
        except OSError as exc:
            rec["error"] = str(exc)
        log_once(rec)

    def log_once(rec: dict) -> None:
        with lock:
            if not rec.get("logged"):
                rec["logged"] = True
                log.write(json.dumps({k: v for k, v in rec.items() if k != "logged"}) + "\n")

    threads = []
    for i, flow in enumerate(plan):
        delay = t0 + flow["start_s"] - time.time()
        if delay > 0:
            time.sleep(delay)
        th = threading.Thread(target=run_flow, args=(i, flow), daemon=True)
        th.start()
        threads.append(th)
    end = t0 + deadline
    for th in threads:
        th.join(max(0.0, end - time.time()))
    for rec in list(state.values()):
        log_once(rec)
    with lock:
        log.close()
    # threads still blocked in send() must not keep the process alive
    os._exit(0)


def storm(dst: str, rate: float, duration: float, port_base: int = 20000, ports: int = 40000) -> int:
    """Many tiny UDP flows: one datagram to each of a rotating range of
    destination ports, ``rate`` new 5-tuples per second (a flow-table and
    polling load for the controller, not a bandwidth one). Returns the count."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sent, t0 = 0, time.monotonic()
    while True:
        now = time.monotonic() - t0
        if now >= duration:
            return sent
        due = int(now * rate)
        while sent < due:
            try:
                s.sendto(b"x", (dst, port_base + sent % ports))
            except OSError:
                pass  # ICMP unreachable reported on a later send: not our concern
            sent += 1
        time.sleep(0.002)


WAIT_LOG_S = 0.1    # bulk: send() calls that took this long are listed (--waits)


def bulk(dst: str, port: int, duration: float, conns: int, mptcp: bool, rate_mbps: float | None = None,
         waits_path: str | None = None) -> int:
    """``conns`` parallel connections sending as fast as they can (or each
    at ``rate_mbps``, paced by the application in 5 ms steps) for
    ``duration`` seconds (or until SIGTERM); returns the bytes sent. At the
    end each connection is reset (SO_LINGER 0): what is still in its send
    buffer is dropped, so the load stops when the generator does (a plain
    close would keep sending megabytes of buffered data at WC rates).

    ``waits_path``: every send() call that took ``WAIT_LOG_S`` or more --
    when it began (Unix time), how long, whether it timed out -- is written
    there as JSON at the end: while the sender sleeps in send(), its
    connection gets no new data and BG can run dry (a full send buffer, or a
    wake-up that came late)."""
    sent = [0] * conns
    waits: list[dict] = []
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def one(i: int) -> None:
        s = _socket(mptcp)
        s.connect((dst, port))
        s.sendall(struct.pack("!Q", 1 << 60))
        payload = b"\0" * CHUNK
        s.settimeout(1.0)
        t0 = time.monotonic()
        while not stop.is_set():
            if rate_mbps:
                ahead = sent[i] * 8 / (rate_mbps * 1e6) - (time.monotonic() - t0)
                if ahead > 0:
                    stop.wait(min(ahead, 0.005))
                    continue
            t_call, timed_out = time.time(), False
            try:
                sent[i] += s.send(payload)
            except socket.timeout:
                timed_out = True
            except OSError:
                return
            took = time.time() - t_call
            if timed_out or took >= WAIT_LOG_S:
                waits.append({"conn": i, "t": round(t_call, 4), "s": round(took, 4), "timeout": timed_out})
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(conns)]
    for t in threads:
        t.start()
    stop.wait(duration)
    stop.set()
    for t in threads:
        t.join(3)
    if waits_path:
        with open(waits_path, "w") as fh:
            json.dump(sorted(waits, key=lambda w: w["t"]), fh)
    return sum(sent)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="flowgen")
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("server")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--mptcp", action="store_true")
    c = sub.add_parser("client")
    c.add_argument("--plan", required=True)
    c.add_argument("--t0", type=float, required=True)
    c.add_argument("--deadline", type=float, required=True, help="seconds after t0")
    c.add_argument("--out", required=True)
    c.add_argument("--mptcp", action="store_true")
    st = sub.add_parser("storm")
    st.add_argument("--dst", required=True)
    st.add_argument("--rate", type=float, required=True, help="new UDP 5-tuples per second")
    st.add_argument("--duration", type=float, required=True)
    bk = sub.add_parser("bulk")
    bk.add_argument("--dst", required=True)
    bk.add_argument("--port", type=int, required=True)
    bk.add_argument("--duration", type=float, required=True)
    bk.add_argument("--conns", type=int, default=1)
    bk.add_argument("--mptcp", action="store_true")
    bk.add_argument("--rate", type=float, default=None, help="Mb/s per connection (default: as fast as it can)")
    bk.add_argument("--waits", default=None, help=f"write the send() calls that took >= {WAIT_LOG_S} s here (JSON)")
    args = p.parse_args(argv)
    if args.mode == "bulk":
        if args.rate is not None and args.rate <= 0:
            p.error(f"--rate {args.rate}: must be positive")
        print(bulk(args.dst, args.port, args.duration, args.conns, args.mptcp, args.rate, args.waits))
    elif args.mode == "storm":
        print(storm(args.dst, args.rate, args.duration))
    elif args.mode == "server":
        serve(args.port, args.out, args.mptcp)
    else:
        client(args.plan, args.t0, args.deadline, args.out, args.mptcp)


if __name__ == "__main__":
    main()
