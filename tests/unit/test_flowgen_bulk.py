"""flowgen bulk on loopback: the application pacing holds the asked rate,
and the connection is reset at the end (nothing buffered keeps flowing)."""

import socket
import struct
import threading

import pytest

from experiments.flowgen import bulk


def _sink():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    got = {"bytes": 0, "reset": False}

    def run():
        c, _ = srv.accept()
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
        try:
            while True:
                b = c.recv(1 << 16)
                if not b:
                    return
                got["bytes"] += len(b)
        except ConnectionResetError:
            got["reset"] = True
        finally:
            c.close()
            srv.close()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return srv.getsockname()[1], got, t


def test_bulk_paced_rate_and_reset_at_the_end():
    port, got, t = _sink()
    sent = bulk("127.0.0.1", port, duration=1.5, conns=1, mptcp=False, rate_mbps=8.0)
    t.join(5)
    # 8 Mb/s for 1.5 s = 1.5 MB, give or take one 64 KiB chunk and the timer's slack
    assert 1.5e6 * 0.85 < sent < 1.5e6 * 1.15 + 65536, sent
    assert got["reset"]                                   # SO_LINGER 0: RST, not FIN
    assert got["bytes"] <= sent + struct.calcsize("!Q")


def test_bulk_unpaced_is_faster_than_paced():
    port, got, t = _sink()
    sent = bulk("127.0.0.1", port, duration=0.5, conns=1, mptcp=False)
    t.join(5)
    assert sent > 8e6 / 8 * 0.5 * 4, sent                 # loopback: far above the 8 Mb/s pacing
    with pytest.raises(SystemExit):
        from experiments.flowgen import main
        main(["bulk", "--dst", "127.0.0.1", "--port", "1", "--duration", "1", "--rate", "0"])


def test_bulk_lists_the_sends_that_waited(tmp_path):
    """A receiver that stops reading: the sender's send() calls block, and
    each one that took WAIT_LOG_S or more is listed with its time; a reading
    receiver leaves the list empty."""
    import json
    import time
    from experiments.flowgen import WAIT_LOG_S
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    held = []
    threading.Thread(target=lambda: held.append(srv.accept()[0]), daemon=True).start()
    path = tmp_path / "waits.json"
    t0 = time.time()
    bulk("127.0.0.1", srv.getsockname()[1], duration=2.5, conns=1, mptcp=False, waits_path=str(path))
    waits = json.loads(path.read_text())
    assert waits and all(w["s"] >= WAIT_LOG_S and t0 <= w["t"] <= t0 + 4 for w in waits), waits
    assert any(w["timeout"] for w in waits)               # blocked for the socket's whole 1 s timeout
    for c in held:
        c.close()
    srv.close()

    port, got, t = _sink()
    bulk("127.0.0.1", port, duration=0.5, conns=1, mptcp=False, waits_path=str(path))
    t.join(5)
    assert json.loads(path.read_text()) == []
