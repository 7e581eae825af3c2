"""Many host agents in one process, for the controller-side benchmarks that
need more agents than a machine holds processes (issue #34 §3: rate
factors to 1000 agents; one agent process takes ~40 MB).

Each is the real daemon's request path -- :class:`hostagent.agent.Agent`
with its channel (keys, signatures, the persisted replay guard) and its
frame server on a unix socket of its own -- on a recording executor
(:mod:`bwtesting.executors`): what an agent would do to a kernel is kept,
not done. Serves until SIGTERM.

    python -m benchmarks.agent_host DIR MASTER_KEY_FILE h1 h2 ...
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

from bwcommon.channel import host_key, load_secret
from bwcommon.transport import listen
from bwtesting.executors import RecordingExecutor
from hostagent.agent import Agent


def serve(workdir: Path, master: bytes, hosts: list[str]) -> list:
    """Start one agent per host on ``unix:<workdir>/<host>.sock``; returns
    (agent, listening socket) per host."""
    out = []
    for h in hosts:
        agent = Agent(h, host_key(master, h), workdir / f"state-{h}", executor=RecordingExecutor())
        sock = listen(f"unix:{workdir / (h + '.sock')}")
        threading.Thread(target=agent.serve, args=(sock,), name=f"agent {h}", daemon=True).start()
        out.append((agent, sock))
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    workdir, master = Path(argv[0]), load_secret(argv[1], private=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    served = serve(workdir, master, argv[2:])
    while not done.wait(0.2):
        pass
    for agent, sock in served:
        if getattr(agent, "server", None) is not None:
            agent.server.stop.set()
            agent.server.close_all()
        sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
