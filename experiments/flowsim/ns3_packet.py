"""The packet-level side of the simulator's second check (issue #34 §1 (b)):
one run of ns-3 (PyPI ``ns3``), read from a JSON spec, results to JSON.

    V/bin/python experiments/flowsim/ns3_packet.py SPEC.json OUT.json

It runs in ns-3's own venv (docs/platform.md: ``ns3`` has no place in the
roles' venvs), so it imports nothing of bwfabric and nothing outside the
standard library and ``ns``: ``experiments/flowsim/ns3check.py`` writes the
spec from the product's own routing and the flow-level simulator's own
workload, and reads the result.

The spec (every key required; ``ns3check.spec`` builds it):

- ``hosts``, ``switches``: node names; ``links``: ``[u, v, bits/s]``,
  full duplex point-to-point;
- ``routes``: ``{switch: {host: next hop}}`` -- static host routes, the
  placements the product's ``single_path`` app installs (a host sends
  everything to its one switch);
- ``flows``: ``[src host, dst host, start s, bytes]``: one TCP connection
  each (BulkSend to its own PacketSink port);
- ``marks``: ``[t0, t1]``: payload bytes delivered between them are
  reported (the aggregate throughput window); ``end_s``: when the run stops;
- ``link_delay_us``; ``queue_packets``: each port's buffer, a queue disc
  over a one-packet device queue (so the queue disc holds the whole queue
  and counts its drops); ``ecn_k``: 0 -- a drop-tail FIFO; K > 0 -- RED
  marking ECN above K packets (DCTCP's switch: MinTh = MaxTh = K, no early
  drop); ``mss`` (the links' MTU is 52 bytes more), ``tcp`` (an ``ns3::Tcp*`` congestion control; ECN
  is on for every socket when ``ecn_k`` > 0), ``min_rto_ms``,
  ``delack_ms``, ``init_cwnd``, ``buf_bytes``.

The result: per flow (spec order) ``fct_s`` (last payload packet received
minus the flow's start; ``null`` if not all bytes arrived by ``end_s``) and
``rx_bytes``; ``window_bytes`` (delivered between the marks); ``link_bytes``
(per link of the spec, ``[u -> v, v -> u]``: bytes the ports sent, headers
included); ``drops``
and ``marks`` (packets, over every port); ``wall_s``. A lost SYN or SYN-ACK
is sent again after Linux's 1 s (ns-3's own default is 3 s).
"""

from __future__ import annotations

import json
import math
import sys
import time

KEYS = ("hosts", "switches", "links", "routes", "flows", "marks", "end_s", "link_delay_us", "queue_packets", "ecn_k",
        "mss", "tcp", "min_rto_ms", "delack_ms", "init_cwnd", "buf_bytes")
FIRST_PORT = 1024
LINUX_SYN_RTO_S = 1.0             # TCP_TIMEOUT_INIT: a lost SYN or SYN-ACK is sent again after 1 s (ns-3: 3 s)
IP_TCP_HEADERS = 52                # IPv4 20, TCP 20, timestamps 12: the links' MTU is the MSS + these
STEP_S = 0.05                      # progress and the marks' sampling


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def check(spec: dict) -> None:
    missing = [k for k in KEYS if k not in spec]
    if missing:
        raise ValueError(f"spec: missing {', '.join(missing)}")
    for key in ("end_s", "link_delay_us", "queue_packets", "mss", "min_rto_ms", "delack_ms", "init_cwnd", "buf_bytes"):
        if not _positive(spec[key]):
            raise ValueError(f"spec: {key} {spec[key]!r} must be a finite number > 0")
    if not (isinstance(spec["ecn_k"], int) and 0 <= spec["ecn_k"] < spec["queue_packets"]):
        raise ValueError(f"spec: ecn_k {spec['ecn_k']!r}: 0 or a threshold below queue_packets")
    marks = spec["marks"]
    if not (isinstance(marks, list) and len(marks) == 2 and all(_positive(m) or m == 0 for m in marks)
            and marks[0] < marks[1] <= spec["end_s"]):
        raise ValueError(f"spec: marks {marks!r}: two times 0 <= t0 < t1 <= end_s")
    names = set(spec["hosts"]) | set(spec["switches"])
    for u, v, bps in spec["links"]:
        if u not in names or v not in names or not _positive(bps):
            raise ValueError(f"spec: link {u}-{v} at {bps}")
    for sw, table in spec["routes"].items():
        for dst, hop in table.items():
            if sw not in spec["switches"] or dst not in spec["hosts"] or hop not in names:
                raise ValueError(f"spec: route at {sw} to {dst} via {hop}")
    per_dst = {}
    for src, dst, start, size in spec["flows"]:
        if src not in spec["hosts"] or dst not in spec["hosts"] or src == dst:
            raise ValueError(f"spec: flow {src} -> {dst}")
        if not (0 <= start < spec["end_s"]) or not size >= 1:
            raise ValueError(f"spec: flow {src} -> {dst} at {start} s of {size} bytes")
        per_dst[dst] = per_dst.get(dst, 0) + 1
    if per_dst and max(per_dst.values()) > 65535 - FIRST_PORT:
        raise ValueError("spec: more connections into one host than ports")


def run(spec: dict, progress=None) -> dict:
    from ns import ns                                        # 12 s: after the spec is known good

    check(spec)
    ns.RngSeedManager.SetSeed(1)
    cfg = ns.Config.SetDefault
    cfg("ns3::TcpL4Protocol::SocketType", ns.TypeIdValue(ns.TypeId.LookupByName(f"ns3::{spec['tcp']}")))
    cfg("ns3::TcpSocket::SegmentSize", ns.UintegerValue(spec["mss"]))
    cfg("ns3::TcpSocket::InitialCwnd", ns.UintegerValue(spec["init_cwnd"]))
    cfg("ns3::TcpSocket::SndBufSize", ns.UintegerValue(spec["buf_bytes"]))
    cfg("ns3::TcpSocket::RcvBufSize", ns.UintegerValue(spec["buf_bytes"]))
    cfg("ns3::TcpSocket::DelAckTimeout", ns.TimeValue(ns.MilliSeconds(spec["delack_ms"])))
    cfg("ns3::TcpSocketBase::MinRto", ns.TimeValue(ns.MilliSeconds(spec["min_rto_ms"])))
    cfg("ns3::TcpSocket::ConnTimeout", ns.TimeValue(ns.Seconds(LINUX_SYN_RTO_S)))
    ecn_k = spec["ecn_k"]
    if ecn_k:
        cfg("ns3::TcpSocketBase::UseEcn", ns.StringValue("On"))
        for key, value in (("UseEcn", ns.BooleanValue(True)), ("UseHardDrop", ns.BooleanValue(False)),
                           ("QW", ns.DoubleValue(1.0)), ("MinTh", ns.DoubleValue(ecn_k)),
                           ("MaxTh", ns.DoubleValue(ecn_k)),
                           ("MaxSize", ns.QueueSizeValue(ns.QueueSize(f"{spec['queue_packets']}p")))):
            cfg(f"ns3::RedQueueDisc::{key}", value)

    names = list(spec["hosts"]) + list(spec["switches"])
    nodes = ns.NodeContainer()
    nodes.Create(len(names))
    node = {n: nodes.Get(i) for i, n in enumerate(names)}
    ns.InternetStackHelper().Install(nodes)
    p2p = ns.PointToPointHelper()
    p2p.SetChannelAttribute("Delay", ns.TimeValue(ns.MicroSeconds(spec["link_delay_us"])))
    p2p.SetDeviceAttribute("Mtu", ns.UintegerValue(spec["mss"] + IP_TCP_HEADERS))
    p2p.SetQueue("ns3::DropTailQueue<Packet>", "MaxSize", ns.QueueSizeValue(ns.QueueSize("1p")))
    addr = ns.Ipv4AddressHelper()
    addr.SetBase(ns.Ipv4Address("10.0.0.0"), ns.Ipv4Mask("255.255.255.252"))
    tch = ns.TrafficControlHelper()
    if ecn_k:
        tch.SetRootQueueDisc("ns3::RedQueueDisc")
    else:
        tch.SetRootQueueDisc("ns3::FifoQueueDisc", "MaxSize",
                             ns.QueueSizeValue(ns.QueueSize(f"{spec['queue_packets']}p")))
    devices, qdiscs = [], []
    iface: dict[tuple[str, str], int] = {}                   # (node, neighbour) -> interface index
    address: dict[tuple[str, str], str] = {}                 # (node, neighbour) -> node's address on that link
    for u, v, bps in spec["links"]:
        p2p.SetDeviceAttribute("DataRate", ns.DataRateValue(ns.DataRate(int(bps))))
        devs = p2p.Install(node[u], node[v])
        devices += [devs.Get(0), devs.Get(1)]
        qd = tch.Install(devs)
        qdiscs += [qd.Get(0), qd.Get(1)]
        ifs = addr.Assign(devs)
        addr.NewNetwork()
        for i, (a, b) in enumerate(((u, v), (v, u))):
            ipv4 = node[a].GetObject[ns.Ipv4]()
            iface[(a, b)] = ipv4.GetInterfaceForDevice(devs.Get(i))
            address[(a, b)] = str(ifs.GetAddress(i))
    host_ip, host_tor = {}, {}
    for h in spec["hosts"]:
        (tor,) = [b for (a, b) in iface if a == h]
        host_ip[h], host_tor[h] = address[(h, tor)], tor
    static = ns.Ipv4StaticRoutingHelper()
    for h, tor in host_tor.items():
        sr = static.GetStaticRouting(node[h].GetObject[ns.Ipv4]())
        sr.SetDefaultRoute(ns.Ipv4Address(address[(tor, h)]), iface[(h, tor)])
    for sw, table in spec["routes"].items():
        sr = static.GetStaticRouting(node[sw].GetObject[ns.Ipv4]())
        for dst, hop in table.items():
            sr.AddHostRouteTo(ns.Ipv4Address(host_ip[dst]), ns.Ipv4Address(address[(hop, sw)]), iface[(sw, hop)])

    sinks, next_port, keys = [], {}, {}
    for i, (src, dst, start, size) in enumerate(spec["flows"]):
        port = next_port.get(dst, FIRST_PORT)
        next_port[dst] = port + 1
        keys[(host_ip[dst], port)] = i
        sink_app = ns.PacketSinkHelper("ns3::TcpSocketFactory",
                                       ns.InetSocketAddress(ns.Ipv4Address.GetAny(), port).ConvertTo())
        apps = sink_app.Install(node[dst])
        apps.Start(ns.Seconds(0))
        sinks.append(ns.DynamicCast[ns.PacketSink](apps.Get(0)))
        bulk = ns.BulkSendHelper("ns3::TcpSocketFactory",
                                 ns.InetSocketAddress(ns.Ipv4Address(host_ip[dst]), port).ConvertTo())
        bulk.SetAttribute("MaxBytes", ns.UintegerValue(int(size)))
        bulk.SetAttribute("SendSize", ns.UintegerValue(65536))
        sent = bulk.Install(node[src])
        sent.Start(ns.Seconds(float(start)))

    hosts = ns.NodeContainer()
    for h in spec["hosts"]:
        hosts.Add(node[h])
    fm_helper = ns.FlowMonitorHelper()
    monitor = fm_helper.Install(hosts)

    t0 = time.perf_counter()
    marks, at_mark = list(spec["marks"]), []
    now, end = 0.0, float(spec["end_s"])
    while now < end:
        nxt = min([end, now + STEP_S] + [m for m in marks if m > now + 1e-12])
        ns.Simulator.Stop(ns.Seconds(nxt - now))
        ns.Simulator.Run()
        now = nxt
        if marks and abs(now - marks[0]) < 1e-12:
            marks.pop(0)
            at_mark.append(sum(s.GetTotalRx() for s in sinks))
        if progress:
            progress(now, end, time.perf_counter() - t0)
    wall = time.perf_counter() - t0

    rx = [int(s.GetTotalRx()) for s in sinks]
    queues = [ns.DynamicCast[ns.PointToPointNetDevice](d).GetQueue() for d in devices]
    link_bytes = [[int(queues[2 * i].GetTotalReceivedBytes()), int(queues[2 * i + 1].GetTotalReceivedBytes())]
                  for i in range(len(spec["links"]))]
    drops = marks = 0
    for qd in qdiscs:
        st = qd.GetStats()
        drops += st.nTotalDroppedPackets
        marks += st.nTotalMarkedPackets
    fct = [None] * len(sinks)
    classifier = ns.DynamicCast[ns.Ipv4FlowClassifier](fm_helper.GetClassifier())
    for item in monitor.GetFlowStats():
        t = classifier.FindFlow(item.first)
        i = keys.get((str(t.destinationAddress), int(t.destinationPort)))
        if i is None:                                          # the ACKs' direction
            continue
        src, dst, start, size = spec["flows"][i]
        if rx[i] >= size:
            fct[i] = item.second.timeLastRxPacket.GetSeconds() - float(start)
    ns.Simulator.Destroy()
    return {"fct_s": fct, "rx_bytes": rx, "window_bytes": (at_mark[1] - at_mark[0]) if len(at_mark) == 2 else None,
            "drops": int(drops), "marks": int(marks), "link_bytes": link_bytes, "wall_s": wall}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    spec = json.loads(open(argv[0]).read())
    try:
        check(spec)
    except ValueError as exc:
        print(f"ns3_packet: {exc}", file=sys.stderr)
        return 2

    def progress(now, end, wall):
        print(f"ns-3: {now:.2f} of {end:.2f} simulated s, {wall:.0f} s", file=sys.stderr, flush=True)

    out = run(spec, progress)
    with open(argv[1], "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
