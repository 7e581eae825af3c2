"""The path probe's packet sockets on a real interface: the data segments an
interface sends are counted by (source, destination, destination port);
what it receives, and ACKs, are not."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import threading
import uuid

import pytest

from experiments import pathprobe

pytestmark = pytest.mark.root
ROOT_IP, NS_IP = "10.77.5.1", "10.77.5.2"
SINK = textwrap.dedent('''
    import socket, sys
    srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", int(sys.argv[1]))); srv.listen(1); print("ready", flush=True)
    c, _ = srv.accept()
    while c.recv(1 << 16): pass
''')
SOURCE = textwrap.dedent('''
    import socket, sys, time
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
    end = time.time() + float(sys.argv[3])
    while time.time() < end: s.sendall(b"y" * 8192); time.sleep(0.002)
    s.close()
''')


@pytest.fixture
def link():
    tag = uuid.uuid4().hex[:5]
    ns, out, inner = f"bwpp-{tag}", f"bwppa{tag}", f"bwppb{tag}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "link", "add", out, "type", "veth", "peer", "name", inner, "netns", ns], check=True)
        subprocess.run(["ip", "addr", "add", f"{ROOT_IP}/24", "dev", out], check=True)
        subprocess.run(["ip", "link", "set", out, "up"], check=True)
        for cmd in (["ip", "addr", "add", f"{NS_IP}/24", "dev", inner], ["ip", "link", "set", inner, "up"],
                    ["ip", "link", "set", "lo", "up"]):
            subprocess.run(["ip", "netns", "exec", ns, *cmd], check=True)
        yield ns, out
    finally:
        subprocess.run(["ip", "link", "del", out], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns])


def test_sent_data_is_counted_received_data_is_not(link):
    ns, iface = link
    procs = []
    try:
        # into the namespace (sent by iface) on 5301; out of it (received by iface) on 5302
        sink_in = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", SINK, "5301"],
                                   stdout=subprocess.PIPE, text=True)
        procs.append(sink_in)
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((ROOT_IP, 5302))
        srv.listen(1)
        drained = threading.Thread(target=lambda: [c.recv(1 << 16) for c in [srv.accept()[0]] for _ in iter(
            lambda: c.recv(1 << 16), b"")], daemon=True)
        drained.start()
        assert sink_in.stdout.readline().strip() == "ready"
        procs.append(subprocess.Popen([sys.executable, "-c", SOURCE, NS_IP, "5301", "3"]))
        procs.append(subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", SOURCE, ROOT_IP, "5302", "3"]))
        counts = pathprobe.capture([iface], 1.5)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        srv.close()
    got = counts[iface]
    assert got[(ROOT_IP, NS_IP, 5301)] > 10, got          # the data it sent
    assert (NS_IP, ROOT_IP, 5302) not in got, got          # the data it received
    assert all(key[2] == 5301 for key in got), got         # ACKs (to the sources' ephemeral ports) too small
