"""The host agent daemon (``bwfabric agent``): one per host -- in Mininet,
one per host network namespace. It receives its configuration from the
controller over the authenticated channel and puts it in force.

Transport: a stream socket (``unix:/path`` -- reachable from the controller's
namespace in Mininet, since the filesystem is shared -- or ``tcp:ADDR:PORT``)
carrying frames of a 4-byte big-endian length and one channel message
(:mod:`hostagent.channel`). Every request gets a signed reply
``{"ok": bool, ...}``.

Message types (controller -> agent):
- ``config``: ``{"generation": G, "version": V, "config": {...} | null}``
  -- the whole desired state: a :class:`hostagent.plan.HostConfig` as a
  JSON object, or null for "remove everything". The agent validates it,
  plans, applies; a bad config changes nothing and the reply names the
  problem; if applying fails half-way the previous configuration is applied
  again. G is the controller's generation: a config of a lower generation
  than the highest this agent has accepted (kept in its state directory,
  so across restarts too) is refused, and so is a lower V within one
  generation -- a stale controller cannot overwrite a newer one's. A bare
  HostConfig object (manual use) counts as generation 0, version 0;
- ``rates``: ``{"generation": G, "factors": {peer: [r̃_i, w_i, B_i]}}``,
  LRC's latest terms for this VM's pairs (the newest wins; a bad one is
  refused whole); the reply carries the pairs open here with their v and
  limits (:mod:`hostagent.lrc`). Every τ_v the agent observes its open
  pairs (conntrack), steps v and puts the limits in force;
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
from hostagent.transport import FrameServer, listen

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
        self.generation_file = state_dir / "generation"
        self.max_generation = _read_int(self.generation_file)
        self.generation: int | None = None     # of the configuration in force
        self.version: int | None = None
        self.rates: dict | None = None
        self.rates_received = 0
        self.lrc = None                      # hostagent.lrc.LrcHost while the config has vm.lrc
        self.lrc_in_force: dict = {}         # the pair limits the kernel has (peer -> PairLimit)
        self.lrc_slots: dict = {}            # their slots, read back after the last full apply
        self.lrc_a_l: float | None = None    # the WC competition level LRC set (combined mode), in force
        self.lrc_seen: dict = {}             # conntrack byte counts at the last round (who sends what)
        self.lrc_repairs = 0
        self.conntrack = None                # hostagent.conntrack.ConntrackReader, opened on first use
        self.conntrack_failed = False
        self.lock = threading.Lock()
        self.stopping = False                # set by shutdown: nothing is put in force after it

    def handle(self, raw: bytes) -> bytes:
        """One request -> one signed reply."""
        with self.lock:
            if self.stopping:
                return self.tx.seal("reply", {"ok": False, "error": "the agent is shutting down"})
            try:
                msg_type, body = self.rx.open(raw)
            except ChannelError as exc:
                self.rejected += 1
                log.warning("rejected a message: %s", exc)
                return self.tx.seal("reply", {"ok": False, "error": f"rejected: {exc}"})
            unsaved = self.rx.guard.persist_error
            if unsaved is not None and msg_type != "status":
                # the replay guard could not be persisted (a full or read-only state dir): nothing that
                # changes the kernel is taken, since a restart could not refuse its replay; status still is
                log.error("%s refused: cannot persist the replay guard: %s", msg_type, unsaved)
                return self.tx.seal("reply", {"ok": False, "error": f"state dir: cannot persist the replay guard "
                                              f"({unsaved}); only status is answered until it can"})
            try:
                reply = self._dispatch(msg_type, body)
            except (PlanError, ExecError, ValueError) as exc:
                log.warning("%s refused: %s", msg_type, exc)
                # the highest generation this agent follows: a stale controller learns it is one
                reply = {"ok": False, "error": str(exc), "max_generation": self.max_generation}
            except Exception as exc:  # noqa: BLE001 - an authenticated bug must not kill the connection
                log.exception("%s failed", msg_type)
                reply = {"ok": False, "error": f"internal error: {type(exc).__name__}: {exc}"}
            return self.tx.seal("reply", reply)

    def plan_for(self, cfg: HostConfig, rcvbuf: int | None, lrc_limits: dict | None = None):
        """The plan of ``cfg`` with the pair slots the kernel has now (and,
        with LRC, the pair limits in force unless others are given)."""
        if cfg.vm.lrc is not None and lrc_limits is None:
            lrc_limits = self.lrc_in_force
        lrc = cfg.vm.lrc is not None
        return host_plan(cfg, rcvbuf, self.executor.pair_slots(cfg.interface), lrc_limits if lrc else None,
                         self.lrc_a_l if lrc else None)

    def _lrc_for(self, cfg: HostConfig):
        """The LRC state ``cfg`` runs with: the current one carried on (v
        kept) when compatible, a new one otherwise, None without LRC."""
        from hostagent.lrc import LrcHost
        pol = cfg.vm.lrc
        if pol is None:
            return None
        cur = self.lrc
        if cur is not None and cur.compatible(cfg.address, cfg.nic_mbps, cfg.guarantee_mbps, pol):
            cur.reconfigure(cfg.guarantee_mbps, pol)
            return cur
        return LrcHost(cfg.address, cfg.nic_mbps, cfg.guarantee_mbps, pol)

    def _put_with_lrc(self, cfg: HostConfig) -> int:
        """put_in_force with the LRC state ``cfg`` asks for; on failure the
        previous LRC state stays."""
        before = self.lrc, self.lrc_in_force, self.lrc_a_l
        self.lrc = self._lrc_for(cfg)
        now = time.monotonic()
        self.lrc_in_force = self.lrc.limits(now) if self.lrc is not None else {}
        self.lrc_a_l = self.lrc.competition(now, cfg.unit_mbps) if self.lrc is not None else None
        try:
            return self.put_in_force(cfg, self.rcvbuf)
        except Exception:
            self.lrc, self.lrc_in_force, self.lrc_a_l = before
            raise

    def _conntrack(self, address: str) -> list:
        """The VM's conntrack entries at a cost that follows the VM's own
        entries, not the table (hostagent.conntrack.VmConntrack: a filtered
        dump, then events and one lookup per entry); the kernel's whole text
        where netlink filtering is not to be had (kernels before 5.8)."""
        from hostagent.conntrack import VmConntrack
        from hostagent.lrc import read_conntrack
        if self.conntrack is not None and self.conntrack.address != address:
            self.conntrack.close()
            self.conntrack = None
        if self.conntrack is None and not self.conntrack_failed:
            try:
                self.conntrack = VmConntrack(address)
            except OSError as exc:
                self.conntrack_failed = True
                log.warning("conntrack over netlink unavailable (%s): reading the whole table", exc)
        if self.conntrack is not None:
            try:
                return self.conntrack.entries()
            except OSError as exc:
                log.warning("conntrack dump failed (%s): reading the whole table this round", exc)
                self.conntrack.close()
                self.conntrack = None
        return [e for e in read_conntrack() if address in (e.saddr, e.daddr)]

    def lrc_round(self, entries=None, now: float | None = None) -> str:
        """One τ_v round: observe the open pairs (conntrack), step v, put the
        limits in force -- the rates only (fast path) when the pairs are the
        same, the whole plan when a pair opened or closed. Returns what it
        did ("idle", "rates", "pairs")."""
        from hostagent.lrc import Timeouts, active_peers
        with self.lock:
            if self.lrc is None or self.config is None or self.degraded is not None or self.stopping:
                return "idle"
            now = time.monotonic() if now is None else now
            lrc = self.lrc
            entries = self._conntrack(self.config.address) if entries is None else entries
            active = active_peers(entries, self.config.address, lrc.policy.peers, lrc.policy.params.pair_idle_s,
                                  Timeouts.read(), self.lrc_seen)
            lrc.observe(active, now)
            lrc.step(now)
            want = lrc.limits(now)
            a_l = lrc.competition(now, self.config.unit_mbps)
            moved_a_l = a_l is not None and (self.lrc_a_l is None or
                                              abs(a_l - self.lrc_a_l) > max(0.02 * self.lrc_a_l, 0.005))
            if moved_a_l:
                from hostagent.plan import BPF_MAP, BpfMapSet
                from hostagent.policy import fixed_point
                self.executor.apply_bpf(BpfMapSet(BPF_MAP, self.config.address, fixed_point(a_l)))
                self.lrc_a_l = a_l
            if set(want) != set(self.lrc_in_force):
                before = self.lrc_in_force
                self.lrc_in_force = want
                try:
                    self.put_in_force(self.config, self.rcvbuf)
                except Exception:
                    self.lrc_in_force = before
                    raise
                return "pairs"
            moved = [p for p in want if not _close(want[p], self.lrc_in_force[p])]
            if not moved:
                return "competition" if moved_a_l else "idle"
            from hostagent.plan import BgBucket, TcClass, marker_plan, tc_plan
            slots = self.lrc_slots or self.executor.pair_slots(self.config.interface)
            steps = [s for s in tc_plan(self.config, slots, want) if isinstance(s, TcClass) and _pair_class(s.classid)]
            buckets = [b for b in marker_plan(self.config, want) if isinstance(b, BgBucket) and b.dst in moved]
            try:
                self.executor.change_rates(steps)
                self.executor.set_buckets(buckets)
            except ExecError as exc:          # a class is not where it was: the whole plan, read back
                log.warning("LRC rates: %s; re-applying the configuration", exc)
                self.lrc_repairs += 1
                self.lrc_in_force = want
                self.put_in_force(self.config, self.rcvbuf)
                return "pairs"
            self.lrc_in_force = want
            return "rates"

    def ese_round(self) -> str:
        """MPTCP-D's extra-subflow elimination: destroy the subflows
        bwf_mptcpd marked for this VM (hostagent.ese)."""
        from hostagent.ese import EseCloser
        with self.lock:
            cfg = None if self.stopping else self.config
        if cfg is None or cfg.mptcp_cc != "mptcp_d":
            return "idle"
        # one closer per VM address: a new one drops the entries it finds (stale), so it is made only
        # when the address changes
        closer = getattr(self, "ese", None)
        if closer is None or getattr(self, "ese_address", None) != str(cfg.address):
            closer, self.ese_address = EseCloser([str(cfg.address)]), str(cfg.address)
            self.ese = closer
        return "closed" if closer.round() else "idle"

    def ese_loop(self, period_s: float = 0.05) -> None:
        from controller.loops import LoopGuard

        guard = self.ese_loops = LoopGuard(log)
        while True:
            time.sleep(guard.backoff("ese", period_s, max_s=5.0))
            guard.run("ese", self.ese_round)

    def lrc_loop(self) -> None:
        from controller.loops import LoopGuard

        guard = self.lrc_loops = LoopGuard(log)
        while True:
            period = self.lrc.policy.params.tau_v_s if self.lrc is not None else 0.5
            time.sleep(guard.backoff("lrc", period, max_s=5.0))
            guard.run("lrc", self.lrc_round)

    def put_in_force(self, cfg: HostConfig, rcvbuf: int | None) -> int:
        """Apply ``cfg``; on failure put the previous configuration back (or,
        with none, remove everything) and check the kernel against it. The
        outcome is one of: the new config in force; the previous one in
        force (ExecError says so); degraded (ExecError says so, status shows
        it, ``config`` is None) -- never a silent mix."""
        previous, previous_buf = self.config, self.rcvbuf
        self.lrc_slots = {}
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
        if cfg.vm.lrc is not None:
            self.lrc_slots = self.executor.pair_slots(cfg.interface)
        return changes

    def _dispatch(self, msg_type: str, body: dict) -> dict:
        if msg_type == "config":
            generation, version, raw = config_envelope(body)
            self._check_generation(generation, version)
            if raw is None:
                self.executor.teardown()
                left = self.executor.clean_differences()
                if left:
                    raise ExecError("removing everything left: " + "; ".join(left[:5]))
                self.config, self.rcvbuf = None, None
                self.lrc, self.lrc_in_force = None, {}
                changes = 0
                log.info("configuration removed (generation %d, version %d)", generation, version)
            else:
                cfg = HostConfig.from_dict(raw)
                if cfg.host != self.host:
                    raise PlanError(f"configuration for host {cfg.host!r} sent to agent {self.host!r}")
                changes = self._put_with_lrc(cfg)
                log.info("configuration in force (generation %d, version %d, %d changes): guarantee %.3g Mb/s, "
                         "%d WC subflows, A_l %.3g", generation, version, changes, cfg.guarantee_mbps,
                         cfg.wc_subflows, cfg.a_l)
            self.generation, self.version = generation, version
            if generation > self.max_generation:
                self.max_generation = generation
                _write_int(self.generation_file, generation)
            return {"ok": True, "changes": changes, "generation": generation, "version": version}
        if msg_type == "rates":
            generation = body.get("generation") if isinstance(body, dict) else None
            if not _count(generation) or not isinstance(body.get("factors"), dict):
                raise PlanError("rates: needs generation (integer) and factors (object)")
            if generation < self.max_generation:
                raise PlanError(f"rates of generation {generation}: this agent follows generation "
                                f"{self.max_generation}")
            now = time.monotonic()
            if self.lrc is not None:
                self.lrc.set_terms(body["factors"], now)       # refused whole (LrcError) if any is bad
            self.rates, self.rates_received = dict(body["factors"]), self.rates_received + 1
            # the pairs open here ride back on the reply: the controller's next round sees them
            return {"ok": True, "pairs": {} if self.lrc is None else self.lrc.report(now)}
        if msg_type == "status":
            return {"ok": True, **self.status()}
        raise PlanError(f"unknown message type {msg_type!r} (config, rates, status)")

    def _check_generation(self, generation: int, version: int) -> None:
        if generation < self.max_generation:
            raise PlanError(f"configuration of generation {generation} refused: a newer controller "
                            f"(generation {self.max_generation}) configures this agent")
        if generation == self.generation and self.version is not None and version < self.version:
            raise PlanError(f"configuration version {version} refused: version {self.version} of the same "
                            "controller is in force")

    def status(self) -> dict:
        """What is true of the kernel now: the configuration this agent
        holds, and where the kernel differs from it (read back)."""
        if self.config is not None:
            differences = self.executor.differences(self.plan_for(self.config, self.rcvbuf))
        else:
            differences = self.executor.clean_differences()
        server = getattr(self, "server", None)
        return {"host": self.host, "rejected": self.rejected, "rcvbuf_bytes": self.rcvbuf,
                "generation": self.generation, "version": self.version, "rates_received": self.rates_received,
                "connections": None if server is None else asdict(server.stats),
                "config": None if self.config is None else self.config.model_dump(mode="json"),
                "class_bytes": {} if self.config is None else self.executor.class_bytes(self.config.interface),
                "lrc": None if self.lrc is None else {"pairs": self.lrc.report(time.monotonic()),
                                                      "terms_received": self.lrc.terms_received,
                                                      "terms_refused": self.lrc.terms_refused,
                                                      "loop": getattr(self, "lrc_loops", None) and
                                                      self.lrc_loops.as_dict().get("lrc")},
                "ese": None if getattr(self, "ese", None) is None else {
                    "closed": len(self.ese.closed), "not_destroyed": self.ese.failed,
                    "loop": getattr(self, "ese_loops", None) and self.ese_loops.as_dict().get("ese")},
                "in_force": not differences and self.degraded is None, "differences": differences,
                "degraded": self.degraded}

    def refresh_buffer(self, ss_text: str, now: float | None = None) -> bool:
        """Eq. 1 from live subflows (:class:`hostagent.observe.BufferSizer`);
        re-applied when it moves by more than 20 %. Returns whether it was."""
        from hostagent.observe import buffer_inputs, parse_ss
        with self.lock:
            if self.config is None or self.stopping:
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

    def shutdown(self, wait_s: float = 30.0) -> None:
        """Remove everything this agent put in force. It waits (up to
        ``wait_s``) for a request or round in progress to finish, and
        none starts after it: an apply racing the teardown would put back
        what it had just removed."""
        held = self.lock.acquire(timeout=wait_s)
        if not held:
            log.error("an operation still holds the agent after %g s; removing what is in force anyway", wait_s)
        try:
            self.stopping = True
            self.executor.teardown()
        finally:
            if held:
                self.lock.release()


def config_envelope(body: dict) -> tuple[int, int, dict | None]:
    """(generation, version, HostConfig object or None) of a config message."""
    if not isinstance(body, dict):
        raise PlanError("a configuration message must be an object")
    if "generation" not in body:
        return 0, 0, body                      # a bare HostConfig: manual use
    unknown = sorted(set(body) - {"generation", "version", "config"})
    if unknown:
        raise PlanError(f"configuration envelope: unknown keys {unknown} (generation, version, config)")
    generation, version, raw = body.get("generation"), body.get("version"), body.get("config")
    if not _count(generation) or not _count(version):
        raise PlanError(f"configuration envelope: generation {generation!r} and version {version!r} must be "
                        "integers in 0..2^63-1")
    if raw is not None and not isinstance(raw, dict):
        raise PlanError("configuration envelope: config must be an object or null")
    return generation, version, raw


def _close(a, b, rel: float = 0.005) -> bool:
    """Two PairLimits within 0.5 % (LRC's limits move a little every τ_v:
    smaller moves are not worth a netlink round trip)."""
    def near(x, y):
        if x is None or y is None:
            return x is y
        return abs(x - y) <= rel * max(abs(x), abs(y), 1e-3)
    return near(a.bg_mbps, b.bg_mbps) and near(a.wc_mbps, b.wc_mbps)


def _pair_class(classid: str) -> bool:
    from hostagent.plan import PAIR_CLASS_BASE, WC_PAIR_CLASS_BASE, in_pair_slots
    return in_pair_slots(classid, PAIR_CLASS_BASE) or in_pair_slots(classid, WC_PAIR_CLASS_BASE)


def _count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**63


def _read_int(path: Path) -> int:
    """A persisted counter: 0 if the file does not exist; a corrupt or
    unreadable one stops the agent by name (read as 0, a stale controller
    would be taken for a new one)."""
    if not path.exists():
        return 0
    try:
        value = int(path.read_text().strip())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: corrupt agent state ({exc}); move it away to start afresh") from None
    if not 0 <= value < 2**63:
        raise ValueError(f"{path}: corrupt agent state ({value} is out of range); move it away to start afresh")
    return value


def _write_int(path: Path, value: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{value}\n")
    tmp.replace(path)


WAKE_S = 0.2        # the main thread's longest sleep: how soon a signal's handler runs


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
    threading.Thread(target=agent.lrc_loop, daemon=True).start()
    threading.Thread(target=agent.ese_loop, daemon=True).start()
    log.info("listening on %s", listen_address)
    # Not done.wait(): a process's signal goes to any of its threads, and
    # Python runs the handler only when the main thread next runs bytecode --
    # which a wait without a timeout never does when the signal landed on a
    # worker (the agent then outlived SIGTERM: issue #32, 2 of 9 agents in one
    # main job). The timeout lets it run within WAKE_S.
    while not done.wait(WAKE_S):
        pass
    log.info("shutting down: removing what this agent put in force")
    if getattr(agent, "server", None) is not None:
        agent.server.stop.set()
        agent.server.close_all()
    server.close()
    if listen_address.startswith("unix:"):
        Path(listen_address[5:]).unlink(missing_ok=True)
    t0 = time.monotonic()
    try:
        agent.shutdown()
    except ExecError as exc:
        log.error("%s", exc)
        return 1
    log.info("removed; exiting (%.2f s)", time.monotonic() - t0)
    return 0
