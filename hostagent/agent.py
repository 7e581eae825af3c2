"""The host agent daemon (``bwfabric agent``): one per host -- in Mininet,
one per host network namespace. It receives its configuration from the
controller over the authenticated channel and puts it in force.

Transport: a stream socket (``unix:/path`` -- reachable from the controller's
namespace in Mininet, since the filesystem is shared -- or ``tcp:ADDR:PORT``)
carrying frames of a 4-byte big-endian length and one channel message
(:mod:`hostagent.channel`). Every request gets a signed reply
``{"ok": bool, ...}``.

Message types (controller -> agent):
- ``config``: a :class:`hostagent.plan.HostConfig` as a JSON object; the
  agent validates it, plans, applies; a bad config changes nothing and the
  reply names the problem; if applying fails half-way the previous
  configuration is applied again;
- ``status``: what is in force, counters, the live Eq. 1 buffer.

Every 2 s the agent recomputes Eq. 1's buffer, B = beta * maxRTT * sum(BW),
with maxRTT the largest live MPTCP subflow RTT (``ss``) of the last 30 s
and sum(BW) the NIC rate, and re-applies the buffer sysctls when B moves by
more than 20 %.

A forged, replayed or malformed message is refused, logged, and answered
with an error (nothing else happens). If the controller goes away, the
agent keeps what is in force. SIGTERM removes everything it put in place.
"""

from __future__ import annotations

import json
import logging
import signal
import socket
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

from hostagent.channel import ChannelError, ReplayGuard, Receiver, Sender
from hostagent.executor import ExecError, Executor
from hostagent.observe import BufferSizer
from hostagent.plan import HostConfig, PlanError, host_plan
from hostagent.transport import FrameServer, connect, listen, recv_frame, send_frame

log = logging.getLogger("bwfabric.agent")


# ---- the agent ------------------------------------------------------------------------------------
class Agent:
    def __init__(self, host: str, key: bytes, state_dir: Path, executor: Executor | None = None):
        state_dir.mkdir(parents=True, exist_ok=True)
        self.host = host
        self.rx = Receiver(key, host, ReplayGuard(state_dir / "last-seq"))
        self.tx = Sender(key, host, direction="a2c")
        self.executor = executor if executor is not None else Executor(state_file=state_dir / "executor.json")
        self.config: HostConfig | None = None
        self.degraded: str | None = None    # set when a failed apply could not be undone
        self.rcvbuf: int | None = None   # Eq. 1's buffer from live subflows (None: not measured yet)
        self.sizer = BufferSizer()
        self.rejected = 0
        self.lock = threading.Lock()

    def handle(self, raw: bytes) -> bytes:
        """One request -> one signed reply."""
        with self.lock:
            try:
                msg_type, body = self.rx.open(raw)
            except ChannelError as exc:
                self.rejected += 1
                log.warning("rejected a message: %s", exc)
                return self.tx.seal("reply", {"ok": False, "error": f"rejected: {exc}"})
            try:
                reply = self._dispatch(msg_type, body)
            except (PlanError, ExecError, ValueError) as exc:
                log.warning("%s refused: %s", msg_type, exc)
                reply = {"ok": False, "error": str(exc)}
            except Exception as exc:  # noqa: BLE001 - an authenticated bug must not kill the connection
                log.exception("%s failed", msg_type)
                reply = {"ok": False, "error": f"internal error: {type(exc).__name__}: {exc}"}
            return self.tx.seal("reply", reply)

    def plan_for(self, cfg: HostConfig, rcvbuf: int | None):
        """The plan of ``cfg`` with the pair slots the kernel has now."""
        return host_plan(cfg, rcvbuf, self.executor.pair_slots(cfg.interface))

    def put_in_force(self, cfg: HostConfig, rcvbuf: int | None) -> int:
        """Apply ``cfg``; on failure put the previous configuration back (or,
        with none, remove everything) and check the kernel against it. The
        outcome is one of: the new config in force; the previous one in
        force (ExecError says so); degraded (ExecError says so, status shows
        it, ``config`` is None) -- never a silent mix."""
        previous, previous_buf = self.config, self.rcvbuf
        try:
            changes = self.executor.apply(self.plan_for(cfg, rcvbuf))
        except Exception as exc:  # noqa: BLE001 - whatever failed, undo it
            what = f"{type(exc).__name__}: {exc}" if not isinstance(exc, ExecError) else str(exc)
            try:
                if previous is not None:
                    self.executor.apply(self.plan_for(previous, previous_buf))
                    left = self.executor.differences(self.plan_for(previous, previous_buf))
                else:
                    self.executor.teardown()
                    left = self.executor.clean_differences()
                if left:
                    raise ExecError("kernel differs after the rollback: " + "; ".join(left[:5]))
            except Exception as again:  # noqa: BLE001
                self.config, self.degraded = None, f"{what}; rollback failed: {again}"
                log.error("DEGRADED: %s", self.degraded)
                raise ExecError(f"applying the configuration failed ({what}) and so did putting the "
                                f"previous state back ({again}): degraded, nothing verified in force") from None
            self.degraded = None
            raise ExecError(f"applying the configuration failed ({what}); "
                            + ("the previous one is in force (verified)" if previous is not None
                               else "nothing is in force (verified)")) from None
        self.config, self.rcvbuf, self.degraded = cfg, rcvbuf, None
        return changes

    def _dispatch(self, msg_type: str, body: dict) -> dict:
        if msg_type == "config":
            cfg = HostConfig.from_dict(body)
            if cfg.host != self.host:
                raise PlanError(f"configuration for host {cfg.host!r} sent to agent {self.host!r}")
            changes = self.put_in_force(cfg, self.rcvbuf)
            log.info("configuration in force (%d changes): guarantee %.3g Mb/s, %d WC subflows, A_l %.3g",
                     changes, cfg.guarantee_mbps, cfg.wc_subflows, cfg.a_l)
            return {"ok": True, "changes": changes}
        if msg_type == "status":
            return {"ok": True, **self.status()}
        raise PlanError(f"unknown message type {msg_type!r} (config, status)")

    def status(self) -> dict:
        """What is true of the kernel now: the configuration this agent
        holds, and where the kernel differs from it (read back)."""
        if self.config is not None:
            differences = self.executor.differences(self.plan_for(self.config, self.rcvbuf))
        else:
            differences = self.executor.clean_differences()
        server = getattr(self, "server", None)
        return {"host": self.host, "rejected": self.rejected, "rcvbuf_bytes": self.rcvbuf,
                "connections": None if server is None else asdict(server.stats),
                "config": None if self.config is None else asdict(self.config),
                "in_force": not differences and self.degraded is None, "differences": differences,
                "degraded": self.degraded}

    def refresh_buffer(self, ss_text: str, now: float | None = None) -> bool:
        """Eq. 1 from live subflows (:class:`hostagent.observe.BufferSizer`);
        re-applied when it moves by more than 20 %. Returns whether it was."""
        from hostagent.observe import buffer_inputs, parse_ss
        with self.lock:
            if self.config is None:
                return False
            rtt_now, total = buffer_inputs(parse_ss(ss_text))
            want = self.sizer.update(time.monotonic() if now is None else now, rtt_now,
                                     self.config.nic_mbps * 1e6, self.config.beta, self.rcvbuf,
                                     floor_rtt_s=self.config.rtt_hint_ms / 1e3)
            if want is None:
                return False
            self.put_in_force(self.config, want)
            log.info("receive/send buffer %d B (Eq. 1: maxRTT %.1f ms, NIC %g Mb/s; measured sum BW %.1f Mb/s)",
                     want, self.sizer.max_rtt() * 1e3, self.config.nic_mbps, total / 1e6)
            return True

    def buffer_loop(self, period_s: float = 2.0) -> None:
        import subprocess

        from controller.loops import LoopGuard

        guard = self.loops = LoopGuard(log)

        def round_():
            out = subprocess.run(["ss", "-tinH"], capture_output=True, text=True, timeout=5).stdout
            self.refresh_buffer(out)

        while True:      # observation must never take the agent down
            time.sleep(guard.backoff("buffer", period_s, max_s=60.0))
            guard.run("buffer", round_)

    def serve(self, server: socket.socket, **limits) -> FrameServer:
        """Serve the channel on ``server`` (see :mod:`hostagent.transport`
        for the limits); returns the server, whose ``stop`` ends it."""
        self.server = FrameServer(self.handle, **limits)
        self.server.serve(server)
        return self.server

    def shutdown(self) -> None:
        self.executor.teardown()


class AgentClient:
    """The controller's side of one agent's channel."""

    def __init__(self, address: str, host: str, key: bytes, timeout: float = 10.0):
        self.address, self.host, self.timeout = address, host, timeout
        self.tx = Sender(key, host, direction="c2a")
        self.rx = Receiver(key, host, ReplayGuard(), direction="a2c")
        self.sock: socket.socket | None = None

    def request(self, msg_type: str, body: dict) -> dict:
        return self.request_raw(self.tx.seal(msg_type, body))

    def request_raw(self, raw: bytes) -> dict:
        if self.sock is None:
            self.sock = connect(self.address, self.timeout)
        send_frame(self.sock, raw)
        reply = recv_frame(self.sock, self.timeout, self.timeout)
        if reply is None:
            self.close()
            raise ConnectionError(f"agent {self.host} closed the connection")
        _, body = self.rx.open(reply)
        return body

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def main(host: str, key_file: str, listen_address: str, state_dir: str, load_cc: bool = False,
         bpf_dir: str | None = None) -> int:
    from hostagent.channel import load_secret

    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s agent[{host}] %(levelname)s %(message)s")
    try:
        key = load_secret(key_file, private=True)
        executor = Executor(state_file=Path(state_dir) / "executor.json",
                            **({"bpf_pin_dir": Path(bpf_dir)} if bpf_dir else {}))
        agent = Agent(host, key, Path(state_dir), executor=executor)
        server = listen(listen_address)
    except (OSError, ValueError, ChannelError, ExecError) as exc:
        print(f"bwfabric agent: {exc}", file=sys.stderr)
        return 2
    if load_cc:
        from hostagent import cc
        log.info("BPF side: %s", json.dumps(cc.load()))
    done = threading.Event()

    def stop(*_):
        done.set()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    threading.Thread(target=agent.serve, args=(server,), daemon=True).start()
    threading.Thread(target=agent.buffer_loop, daemon=True).start()
    log.info("listening on %s", listen_address)
    done.wait()
    log.info("shutting down: removing what this agent put in force")
    if getattr(agent, "server", None) is not None:
        agent.server.stop.set()
    server.close()
    if listen_address.startswith("unix:"):
        Path(listen_address[5:]).unlink(missing_ok=True)
    try:
        agent.shutdown()
    except ExecError as exc:
        log.error("%s", exc)
        return 1
    return 0
