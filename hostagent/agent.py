"""The host agent daemon (``bwfabric agent``): one per host -- in Mininet,
one per host network namespace. It receives its configuration from the
controller over the authenticated channel and puts it in force, for each
of the host's VMs (:class:`Vm`): a host that is its own VM (the VM is the
host's own namespace), or several VMs, each in a network namespace of its
own behind the host's NIC (issue #32 §4; :mod:`hostagent.netns`).

Transport: a stream socket (``unix:/path`` -- reachable from the controller's
namespace in Mininet, since the filesystem is shared -- or ``tcp:ADDR:PORT``)
carrying frames of a 4-byte big-endian length and one channel message
(:mod:`bwcommon.channel`). Every request gets a signed reply
``{"ok": bool, ...}``.

Message types (controller -> agent):
- ``config``: ``{"generation": G, "version": V, "config": {...} | null}``
  -- the whole desired state: a :class:`hostagent.plan.HostConfig` as a
  JSON object (a host that is its own VM), ``{"vms": {name: HostConfig}}``
  (each with ``vm_id`` = name and its ``netns``; VMs left out are
  removed), or null for "remove everything". Each VM is put in force or
  rolled back on its own; a VM that failed is named in the reply, and G/V
  are taken only when every VM is in force. The agent validates it,
  plans, applies; a bad config changes nothing and the reply names the
  problem; if applying fails half-way the previous configuration is applied
  again. G is the controller's generation: a config of a lower generation
  than the highest this agent has accepted (kept in its state directory,
  so across restarts too) is refused, and so is a lower V within one
  generation -- a stale controller cannot overwrite a newer one's. A bare
  HostConfig object (manual use) counts as generation 0, version 0;
- ``rates``: ``{"generation": G, "factors": {peer: [r̃_i, w_i, B_i]}}``,
  LRC's latest terms for this VM's pairs (the newest wins; a bad one is
  refused whole), or ``{"generation": G, "vms": {name: factors}}`` for a
  host of several VMs; the reply carries the pairs open here with their v
  and limits (``pairs`` for the one VM, ``vms`` per VM; :mod:`hostagent.lrc`). Every τ_v the agent observes its open
  pairs (conntrack), steps v and puts the limits in force;
- ``status``: what is in force (per VM under ``vms``; a host that is its
  own VM's fields also at the top), counters, the live Eq. 1 buffer.

Every 2 s the agent recomputes Eq. 1's buffer, B = beta * maxRTT * sum(BW),
with maxRTT the largest live MPTCP subflow RTT (``ss``) of the last 30 s
and sum(BW) the NIC rate, and re-applies the buffer sysctls when B moves by
more than 20 %.

A forged, replayed or malformed message is refused, logged, and answered
with an error (nothing else happens). If the controller goes away, the
agent keeps what is in force. SIGTERM removes everything it put in place.
"""

from __future__ import annotations

import functools
import json
import logging
import shutil
import signal
import socket
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

from bwcommon.channel import ChannelError, ReplayGuard, Receiver, Sender
from bwcommon.loops import LoopGuard
from hostagent.executor import ExecError, Executor
from hostagent.observe import BufferSizer
from hostagent.plan import HostConfig, PlanError, host_plan
from bwcommon.transport import FrameServer, listen

log = logging.getLogger("bwfabric.agent")


# ---- one VM ---------------------------------------------------------------------------------------
class Vm:
    """What the agent keeps for one VM: its configuration in force, its
    executor (the VM's own kernel objects: tc on its interface, its
    namespace's sysctls, MPTCP endpoints, nftables tables; and its entries
    in the machine's BPF maps), Eq. 1's buffer, LRC's and ESE's state.
    Every method runs in the VM's network namespace (the caller enters it:
    :meth:`Agent.inside`) under the agent's lock."""

    def __init__(self, name: str, executor, netns: str | None = None):
        self.name, self.executor, self.netns = name, executor, netns
        self.config: HostConfig | None = None
        self.degraded: str | None = None    # set when a failed apply could not be undone
        self.rcvbuf: int | None = None      # Eq. 1's buffer from live subflows (None: not measured yet)
        self.sizer = BufferSizer()
        self.lrc = None                      # hostagent.lrc.LrcHost while the config has vm.lrc
        self.lrc_in_force: dict = {}         # the pair limits the kernel has (peer -> PairLimit)
        self.lrc_slots: dict | None = None   # their slots, read back after the last full apply (None: unread)
        self.lrc_a_l: float | None = None    # the WC competition level LRC set (combined mode), in force
        self.lrc_seen: dict = {}             # conntrack byte counts at the last round (who sends what)
        self.lrc_repairs = 0
        self.lrc_pairs_fast = 0       # pairs opened/closed by their buckets alone (_pairs_fast)
        self.conntrack = None                # hostagent.conntrack.VmConntrack, opened on first use
        self.conntrack_failed = False
        self.ese = None
        self.ese_address: str | None = None

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
        if cur is not None and cur.compatible(cfg.address, cfg.nic_mbps, pol):
            cur.reconfigure(cfg.guarantee_mbps, pol)
            return cur
        return LrcHost(cfg.address, cfg.nic_mbps, cfg.guarantee_mbps, pol)

    def put_with_lrc(self, cfg: HostConfig) -> int:
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

    def put_in_force(self, cfg: HostConfig, rcvbuf: int | None) -> int:
        """Apply ``cfg``; on failure put the previous configuration back (or,
        with none, remove everything) and check the kernel against it. The
        outcome is one of: the new config in force; the previous one in
        force (ExecError says so); degraded (ExecError says so, status shows
        it, ``config`` is None) -- never a silent mix."""
        previous, previous_buf = self.config, self.rcvbuf
        self.lrc_slots = None
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
                log.error("DEGRADED (%s): %s", self.name, self.degraded)
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

    def remove(self) -> None:
        """Remove everything in force for this VM, checked."""
        self.executor.teardown()
        left = self.executor.clean_differences()
        if left:
            raise ExecError("removing everything left: " + "; ".join(left[:5]))
        self.config, self.rcvbuf, self.degraded = None, None, None
        self.lrc, self.lrc_in_force, self.lrc_a_l = None, {}, None
        if self.conntrack is not None:
            self.conntrack.close()
            self.conntrack = None

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
        if self.lrc is None or self.config is None or self.degraded is not None:
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
            from bwcommon.policy import fixed_point
            self.executor.apply_bpf(BpfMapSet(BPF_MAP, self.config.address, fixed_point(a_l)))
            self.lrc_a_l = a_l
        if set(want) != set(self.lrc_in_force):
            if self._buckets_only(want) and self._pairs_fast(want):
                return "pairs"
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
        slots = self.lrc_slots if self.lrc_slots is not None else self.executor.pair_slots(self.config.interface)
        steps = [s for s in tc_plan(self.config, slots, want) if isinstance(s, TcClass) and _pair_class(s.classid)]
        buckets = [b for b in marker_plan(self.config, want) if isinstance(b, BgBucket) and b.dst in moved]
        try:
            self.executor.change_rates(steps)
            self.executor.set_buckets(buckets)
        except ExecError as exc:          # a class is not where it was: the whole plan, read back
            log.warning("LRC rates (%s): %s; re-applying the configuration", self.name, exc)
            self.lrc_repairs += 1
            self.lrc_in_force = want
            self.put_in_force(self.config, self.rcvbuf)
            return "pairs"
        self.lrc_in_force = want
        return "rates"

    def _buckets_only(self, want: dict) -> bool:
        """Whether this VM's pairs are bwf_mark buckets and nothing else (the
        marker on, no pair with a WC ceiling of its own, now or before): then
        a pair that opens or closes changes a bucket, never the HTB tree."""
        from hostagent.plan import marking
        return marking(self.config) and all(lim.wc_mbps is None
                                             for lim in (*want.values(), *self.lrc_in_force.values()))

    def _pairs_fast(self, want: dict) -> bool:
        """The pairs that opened or moved get their buckets, the closed ones
        lose theirs (Executor.set_buckets) -- not the whole plan applied and
        read back (~0.4 s of tool runs a VM, every time one of its web
        flows opened a pair: most of what 16 agents of 32 VMs cost the
        emulation's two cores). False: a bucket was not where the last
        apply put it; the caller applies the whole plan."""
        from hostagent.plan import BgBucket, marker_plan
        before = self.lrc_in_force
        changed = [d for d in want if d not in before or not _close(want[d], before[d])]
        closed = sorted(set(before) - set(want))
        buckets = [b for b in marker_plan(self.config, want) if isinstance(b, BgBucket) and b.dst in changed]
        try:
            self.executor.set_buckets(buckets, remove=[(self.config.address, d) for d in closed])
        except ExecError as exc:
            log.warning("LRC pairs (%s): %s; re-applying the configuration", self.name, exc)
            self.lrc_repairs += 1
            return False
        self.lrc_in_force = want
        self.lrc_pairs_fast += 1
        return True

    def refresh_buffer(self, ss_text: str, now: float | None = None) -> bool:
        """Eq. 1 from live subflows (:class:`hostagent.observe.BufferSizer`);
        re-applied when it moves by more than 20 %. Returns whether it was."""
        from hostagent.observe import buffer_inputs, parse_ss
        if self.config is None:
            return False
        rtt_now, total = buffer_inputs(parse_ss(ss_text))
        want = self.sizer.update(time.monotonic() if now is None else now, rtt_now,
                                 self.config.nic_mbps * 1e6, self.config.beta, self.rcvbuf,
                                 floor_rtt_s=self.config.rtt_hint_ms / 1e3)
        if want is None:
            return False
        self.put_in_force(self.config, want)
        log.info("%s: receive/send buffer %d B (Eq. 1: maxRTT %.1f ms, NIC %g Mb/s; measured sum BW %.1f Mb/s)",
                 self.name, want, self.sizer.max_rtt() * 1e3, self.config.nic_mbps, total / 1e6)
        return True

    def ese_closer(self, cfg: HostConfig):
        """MPTCP-D's closer for this VM's address: one per address (a new one
        drops the entries it finds, stale), so made only when it changes."""
        from hostagent.ese import EseCloser
        if self.ese is None or self.ese_address != str(cfg.address):
            self.ese, self.ese_address = EseCloser([str(cfg.address)]), str(cfg.address)
        return self.ese

    def status(self, lrc_loop=None, ese_loop=None) -> dict:
        """What is true of the kernel now for this VM (read back)."""
        if self.config is not None:
            differences = self.executor.differences(self.plan_for(self.config, self.rcvbuf))
        else:
            differences = self.executor.clean_differences()
        return {"netns": self.netns, "rcvbuf_bytes": self.rcvbuf,
                # (not mutated: the models hold JSON types only, so any dump mode gives the same)
                "config": None if self.config is None else self.config.model_dump(mode="json"),  # pragma: no mutate
                "class_bytes": {} if self.config is None else self.executor.class_bytes(self.config.interface),
                "lrc": None if self.lrc is None else {"pairs": self.lrc.report(time.monotonic()),
                                                      "terms_received": self.lrc.terms_received,
                                                      "terms_refused": self.lrc.terms_refused,
                                                      "loop": lrc_loop},
                "ese": None if self.ese is None else {"closed": len(self.ese.closed),
                                                      "not_destroyed": self.ese.failed, "loop": ese_loop},
                "in_force": not differences and self.degraded is None, "differences": differences,
                "degraded": self.degraded}


# ---- the agent ------------------------------------------------------------------------------------
class Agent:
    """The channel's end and the host's VMs (:class:`Vm`, by name). A host
    whose one VM is the host itself (its own namespace) has one VM named
    after the host; a host of several VMs has one per VM, each in its
    network namespace. The lock serialises requests, rounds and shutdown."""

    def __init__(self, host: str, key: bytes, state_dir: Path, executor: Executor | None = None,
                 executor_factory=None, enter=None):
        from hostagent import netns as _netns
        state_dir.mkdir(parents=True, exist_ok=True)
        self.host = host
        self.state_dir = state_dir
        self.rx = Receiver(key, host, ReplayGuard(state_dir / "last-seq"))
        self.tx = Sender(key, host, direction="a2c")
        # the host's own namespace's executor (its one VM, or nothing); VMs in namespaces of their own get
        # theirs from the factory, their state files under vms/<name>/
        self.executor = executor if executor is not None else Executor(state_file=state_dir / "executor.json")
        self.executor_factory = executor_factory or self._executor_for
        self.inside = enter or _netns.entered
        self.vms: dict[str, Vm] = {}
        self.nic_in_force: tuple[str, float] | None = None     # (NIC, Mb/s) with BG before WC (VMs in netns)
        self.rejected = 0
        self.generation_file = state_dir / "generation"
        self.max_generation = _read_int(self.generation_file)
        self.generation: int | None = None     # of the configuration in force
        self.version: int | None = None
        self.rates: dict | None = None
        self.rates_received = 0
        self.lock = threading.Lock()
        self.stopping = False                # set by shutdown: nothing is put in force after it
        self.halt = threading.Event()        # set by shutdown: the rounds' loops end
        # the rounds' failures, per loop and VM ("lrc NAME"; bwcommon.loops)
        self.lrc_loops, self.ese_loops, self.buffer_loops = LoopGuard(log), LoopGuard(log), LoopGuard(log)
        self._remembered()

    # ---- the VMs -------------------------------------------------------------------------------
    def _vm_dir(self, name: str) -> Path:
        return self.state_dir / "vms" / name.replace("/", "~")      # '~' is in no VM name

    def _executor_for(self, name: str, netns: str | None):
        kw = {"bpf_pin_dir": self.executor.bpf_pin_dir} if hasattr(self.executor, "bpf_pin_dir") else {}
        return Executor(state_file=self._vm_dir(name) / "executor.json", **kw)

    def _remembered(self) -> None:
        """VMs an earlier run of this agent configured in namespaces of their
        own (their state directories): kept without a configuration, so
        that the next configuration without them, or SIGTERM, removes what
        they left in force."""
        root = self.state_dir / "vms"
        for meta in sorted(root.glob("*/vm.json")) if root.exists() else []:
            try:
                info = json.loads(meta.read_text())
                name, ns = info["name"], info["netns"]
            except (OSError, ValueError, KeyError, TypeError):
                log.error("%s: unreadable; that VM's leftovers are not removed", meta)
                continue
            self.vms[name] = Vm(name, self.executor_factory(name, ns), ns)

    def _vm(self, cfg: HostConfig) -> Vm:
        name = cfg.vm_name
        vm = self.vms.get(name)
        if vm is not None and vm.netns != cfg.netns:
            raise PlanError(f"VM {name}: its network namespace changed ({vm.netns} -> {cfg.netns}); "
                            "remove it first")
        if vm is None:
            if cfg.netns is None:
                executor = self.executor
            else:
                d = self._vm_dir(name)
                d.mkdir(parents=True, exist_ok=True)
                (d / "vm.json").write_text(json.dumps({"name": name, "netns": cfg.netns}))
                executor = self.executor_factory(name, cfg.netns)
            vm = self.vms[name] = Vm(name, executor, cfg.netns)
        return vm

    def vm(self, name: str | None = None) -> Vm:
        """A VM by name; without one, the host's only VM."""
        if name is not None:
            return self.vms[name]
        if len(self.vms) != 1:
            raise KeyError(f"agent {self.host} has {len(self.vms)} VMs: name one")
        return next(iter(self.vms.values()))

    def _forget(self, vm: Vm) -> None:
        del self.vms[vm.name]
        if vm.netns is not None:
            shutil.rmtree(self._vm_dir(vm.name), ignore_errors=True)

    # ---- requests ------------------------------------------------------------------------------
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

    def put_in_force(self, cfg: HostConfig, rcvbuf: int | None) -> int:
        """Put one VM's configuration in force (:meth:`Vm.put_in_force`)."""
        vm = self._vm(cfg)
        with self.inside(vm.netns):
            return vm.put_in_force(cfg, rcvbuf)

    def _configure(self, desired: dict[str, HostConfig] | None) -> int:
        """Every VM to its configuration in ``desired`` (None: none); VMs not
        in it removed. Each VM is put in force or rolled back on its own;
        one VM's failure is named and the others go on."""
        desired = desired or {}
        errors, changes, own_removed = [], 0, False
        for name, vm in sorted(self.vms.items()):
            if name in desired:
                continue
            try:
                own_removed |= vm.executor is self.executor
                with self.inside(vm.netns):
                    vm.remove()
                self._forget(vm)
            except (ExecError, OSError) as exc:
                errors.append(f"VM {name}: removing it: {exc}")
        for name, cfg in sorted(desired.items()):
            vm = None
            try:
                vm = self._vm(cfg)
                with self.inside(vm.netns):
                    these = vm.put_with_lrc(cfg)
                changes += these
                log.info("%s in force (%d changes): guarantee %.3g Mb/s, %d WC subflows, A_l %.3g", name, these,
                         cfg.guarantee_mbps, cfg.wc_subflows, cfg.a_l)
            except (PlanError, ExecError, OSError) as exc:
                errors.append(f"VM {name}: {exc}" if len(desired) > 1 else str(exc))
                if vm is not None and vm.config is None and vm.degraded is None:
                    self._forget(vm)          # never put in force here: nothing to keep
        if not desired and not self.vms and not own_removed:
            self.executor.teardown()          # what an earlier run left in the host's own namespace
            self.nic_in_force = None
            left = self.executor.clean_differences()
            if left:
                errors.append("removing everything left: " + "; ".join(left[:5]))
        elif desired:
            try:
                changes += self._nic(desired)
            except (ExecError, PlanError) as exc:
                errors.append(f"the host's NIC: {exc}")
        if errors:
            raise ExecError("; ".join(errors))
        return changes

    def _nic(self, desired: dict[str, HostConfig]) -> int:
        """VMs in namespaces of their own share the host's NIC: BG before
        WC there (:func:`hostagent.plan.nic_plan`), so that one VM's WC does
        not queue another's BG; put in force by the host's own executor."""
        nics = {(cfg.nic, cfg.nic_mbps) for cfg in desired.values() if cfg.netns is not None}
        if not nics:
            return 0
        want = next(iter(nics))
        changes = self.executor.apply(_nic_plan(*want))
        self.nic_in_force = want
        return changes

    def _nic_differences(self) -> list[str]:
        if self.nic_in_force is None:
            return []
        return [f"NIC: {d}" for d in self.executor.differences(_nic_plan(*self.nic_in_force))]

    def _dispatch(self, msg_type: str, body: dict) -> dict:
        if msg_type == "config":
            generation, version, desired = config_envelope(body)
            self._check_generation(generation, version)
            if desired is not None:
                for cfg in desired.values():
                    if cfg.host != self.host:
                        raise PlanError(f"configuration for host {cfg.host!r} sent to agent {self.host!r}")
                namespaces = [cfg.netns for cfg in desired.values()]
                shared = sorted({str(n) for n in namespaces if namespaces.count(n) > 1})
                if shared:
                    raise PlanError(f"two VMs in one network namespace ({', '.join(shared)}; None: the agent's)")
                if None in namespaces and len(namespaces) > 1:
                    raise PlanError("a VM in the host's own namespace beside VMs in namespaces of their own: "
                                    "give each a namespace (the host's NIC then carries them all)")
                nics = {(cfg.nic, cfg.nic_mbps) for cfg in desired.values() if cfg.netns is not None}
                if len(nics) > 1:
                    raise PlanError(f"the VMs name different NICs or rates for the host's NIC: {sorted(nics)}")
            changes = self._configure(desired)
            if desired is None:
                log.info("configuration removed (generation %d, version %d)", generation, version)
            else:
                log.info("configuration in force (generation %d, version %d, %d changes, %d VMs)", generation,
                         version, changes, len(desired))
            self.generation, self.version = generation, version
            if generation > self.max_generation:
                self.max_generation = generation
                _write_int(self.generation_file, generation)
            return {"ok": True, "changes": changes, "generation": generation, "version": version}
        if msg_type == "rates":
            # (the channel hands over objects only: bwcommon.channel.Receiver.open)
            generation, per_vm, flat = body.get("generation"), body.get("vms"), body.get("factors")
            if not _count(generation) or not (isinstance(flat, dict) or isinstance(per_vm, dict)):
                raise PlanError("rates: needs generation (integer) and factors (object; or vms: {VM: factors})")
            if generation < self.max_generation:
                raise PlanError(f"rates of generation {generation}: this agent follows generation "
                                f"{self.max_generation}")
            if per_vm is None:              # the flat form: the host's one VM
                if len(self.vms) > 1:
                    raise PlanError(f"rates: this host has {len(self.vms)} VMs; send vms: {{VM: factors}}")
                per_vm = {name: flat for name in self.vms}
            now = time.monotonic()
            errors = []
            for name, factors in sorted(per_vm.items()):
                vm = self.vms.get(name)
                if vm is None:
                    errors.append(f"rates for VM {name!r}, not one of this host's")
                elif vm.lrc is not None:
                    try:
                        vm.lrc.set_terms(factors, now)       # refused whole (LrcError) if any is bad
                    except ValueError as exc:
                        errors.append(f"VM {name}: {exc}" if len(self.vms) > 1 else str(exc))
            if errors:
                raise PlanError("; ".join(errors))
            self.rates, self.rates_received = dict(flat if "vms" not in body else per_vm), self.rates_received + 1
            # the pairs open here ride back on the reply: the controller's next round sees them
            pairs = {vm.name: vm.lrc.report(now) for vm in self.vms.values() if vm.lrc is not None}
            return {"ok": True, "pairs": _sole(pairs, self.vms, {}), "vms": pairs}
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
        """What is true of the kernel now: per VM, the configuration this
        agent holds and where the kernel differs from it (read back). With
        one VM its fields are also at the top (a host that is its own VM)."""
        lrc_loops, ese_loops = self.lrc_loops.as_dict(), self.ese_loops.as_dict()
        vms = {}
        for name, vm in sorted(self.vms.items()):
            try:
                with self.inside(vm.netns):
                    vms[name] = vm.status(lrc_loops.get(f"lrc {name}"), ese_loops.get(f"ese {name}"))
            except OSError as exc:            # e.g. its namespace is gone: said, the others still answered
                vms[name] = {"netns": vm.netns, "config": None, "in_force": False, "differences": [str(exc)],
                             "degraded": None, "rcvbuf_bytes": vm.rcvbuf, "class_bytes": {}, "lrc": None, "ese": None}
        if vms:
            differences = [f"{n}: {d}" if len(vms) > 1 else d for n, v in vms.items() for d in v["differences"]]
            nic = self._nic_differences()
            differences += nic
            in_force = all(v["in_force"] for v in vms.values()) and not nic
        else:
            differences = self.executor.clean_differences()
            in_force = not differences
        server = getattr(self, "server", None)
        sole = next(iter(vms.values())) if len(vms) == 1 else {}
        return {"host": self.host, "rejected": self.rejected, "rcvbuf_bytes": sole.get("rcvbuf_bytes"),
                "generation": self.generation, "version": self.version, "rates_received": self.rates_received,
                "connections": None if server is None else asdict(server.stats),
                "config": sole.get("config"), "class_bytes": sole.get("class_bytes", {}),
                "lrc": sole.get("lrc"), "ese": sole.get("ese"),
                "in_force": in_force, "differences": differences,
                "degraded": sole.get("degraded") if len(vms) <= 1 else
                "; ".join(f"{n}: {v['degraded']}" for n, v in vms.items() if v["degraded"]) or None,
                "vms": vms}

    # ---- the rounds ------------------------------------------------------------------------------
    def _each(self, name: str | None, what):
        """``what(vm)`` for the named VM (or the only one) in its namespace,
        under the lock; "idle" while stopping or without it."""
        with self.lock:
            if self.stopping:
                return "idle"
            vm = self.vms.get(name) if name is not None else (next(iter(self.vms.values()))
                                                              if len(self.vms) == 1 else None)
            if vm is None:
                return "idle"
            with self.inside(vm.netns):
                return what(vm)

    def lrc_round(self, entries=None, now: float | None = None, vm: str | None = None) -> str:
        """One VM's τ_v round (:meth:`Vm.lrc_round`)."""
        return self._each(vm, lambda v: v.lrc_round(entries, now))

    def refresh_buffer(self, ss_text: str, now: float | None = None, vm: str | None = None) -> bool:
        """One VM's Eq. 1 from ``ss`` text (:meth:`Vm.refresh_buffer`)."""
        return self._each(vm, lambda v: v.refresh_buffer(ss_text, now)) is True

    def ese_round(self, vm: str | None = None) -> str:
        """MPTCP-D's extra-subflow elimination: destroy the subflows
        bwf_mptcpd marked for this VM (hostagent.ese)."""
        def one(v: Vm) -> str:
            cfg = v.config
            if cfg is None or cfg.mptcp_cc != "mptcp_d":
                return "idle"
            return "closed" if v.ese_closer(cfg).round() else "idle"
        return self._each(vm, one)

    def _rounds(self, guard, kind: str, period_s, fn) -> None:
        """Until shutdown, every ``period_s()`` seconds: ``fn(name)`` for
        every VM, each guarded on its own (one VM's failing round is
        logged and counted under "KIND NAME", the others go on)."""
        while not self.halt.wait(period_s()):
            for name in sorted(list(self.vms)):
                guard.run(f"{kind} {name}", lambda n=name: fn(n))

    def ese_loop(self, period_s: float = 0.05) -> None:
        self._rounds(self.ese_loops, "ese", lambda: period_s, lambda n: self.ese_round(vm=n))

    def lrc_loop(self) -> None:
        """τ_v rounds at the shortest τ_v among the VMs running LRC (0.5 s without any)."""
        def period() -> float:
            return min((v.lrc.policy.params.tau_v_s for v in list(self.vms.values()) if v.lrc is not None),
                       default=0.5)
        self._rounds(self.lrc_loops, "lrc", period, lambda n: self.lrc_round(vm=n))

    def buffer_loop(self, period_s: float = 2.0) -> None:
        import subprocess

        def one(name: str) -> None:
            vm = self.vms.get(name)
            if vm is None or vm.config is None:
                return
            with self.inside(vm.netns):        # ss sees the namespace it runs in
                # (not mutated: ss's arguments and timeout -- the unit tests' namespace has no MPTCP
                # subflows, so its output reads alike either way; tests/integration reads real ones)
                out = subprocess.run(["ss", "-tinH"], capture_output=True, text=True, timeout=5).stdout  # pragma: no mutate
            self.refresh_buffer(out, vm=name)
        self._rounds(self.buffer_loops, "buffer", lambda: period_s, one)

    def serve(self, server: socket.socket, **limits) -> FrameServer:
        """Serve the channel on ``server`` (see :mod:`bwcommon.transport`
        for the limits); returns the server, whose ``stop`` ends it."""
        self.server = FrameServer(self.handle, **limits)
        self.server.serve(server)
        return self.server

    def shutdown(self, wait_s: float = 30.0) -> None:
        """Remove everything this agent put in force, every VM's. It waits
        (up to ``wait_s``) for a request or round in progress to finish,
        and none starts after it: an apply racing the teardown would put
        back what it had just removed."""
        self.halt.set()
        held = self.lock.acquire(timeout=wait_s)
        if not held:
            log.error("an operation still holds the agent after %g s; removing what is in force anyway", wait_s)
        try:
            self.stopping = True
            errors = []
            for name, vm in sorted(self.vms.items()):
                if vm.executor is self.executor:
                    continue
                try:
                    with self.inside(vm.netns):
                        vm.executor.teardown()
                except (ExecError, OSError) as exc:
                    errors.append(f"VM {name}: {exc}")
            try:
                self.executor.teardown()
            except ExecError as exc:
                errors.append(str(exc))
            if errors:
                raise ExecError("; ".join(errors))
        finally:
            if held:
                self.lock.release()


def _nic_plan(nic: str, mbps: float):
    """The host NIC's plan (BG before WC) at ``mbps``."""
    from hostagent.plan import Plan, nic_plan, nic_queue_bytes
    return Plan(tuple(nic_plan(nic, mbps * 1e6, nic_queue_bytes(mbps * 1e6))))


def _sole(per_vm: dict, vms: dict, empty):
    """The one VM's entry of ``per_vm`` when the host has one VM (the wire's
    flat form), else ``empty``."""
    return next(iter(per_vm.values())) if len(vms) == 1 and len(per_vm) == 1 else empty


MAX_VMS = 256         # VMs one agent configures


def config_envelope(body: dict) -> tuple[int, int, dict[str, HostConfig] | None]:
    """(generation, version, {VM name: HostConfig} or None) of a config
    message. Its ``config`` is one HostConfig (a host that is its own VM),
    ``{"vms": {name: HostConfig}}`` (a host of several VMs), or null."""
    if not isinstance(body, dict):
        raise PlanError("a configuration message must be an object")
    if "generation" not in body:
        return 0, 0, _desired(body)            # a bare HostConfig: manual use
    unknown = sorted(set(body) - {"generation", "version", "config"})
    if unknown:
        raise PlanError(f"configuration envelope: unknown keys {unknown} (generation, version, config)")
    generation, version, raw = body.get("generation"), body.get("version"), body.get("config")
    if not _count(generation) or not _count(version):
        raise PlanError(f"configuration envelope: generation {generation!r} and version {version!r} must be "
                        "integers in 0..2^63-1")
    if raw is not None and not isinstance(raw, dict):
        raise PlanError("configuration envelope: config must be an object or null")
    return generation, version, None if raw is None else _desired(raw)


def _desired(raw: dict) -> dict[str, HostConfig]:
    if not isinstance(raw, dict):
        raise PlanError("a configuration must be an object")
    if "vms" not in raw:
        cfg = HostConfig.from_dict(raw)
        return {cfg.vm_name: cfg}
    if set(raw) != {"vms"} or not isinstance(raw["vms"], dict):
        raise PlanError("a configuration of several VMs is {\"vms\": {name: HostConfig}} and nothing else")
    if len(raw["vms"]) > MAX_VMS:
        raise PlanError(f"{len(raw['vms'])} VMs: one agent configures at most {MAX_VMS}")
    out, problems = {}, []
    for name, one in raw["vms"].items():
        try:
            cfg = HostConfig.from_dict(one)
        except PlanError as exc:
            problems.append(f"vms[{name!r}]: {exc}")
            continue
        if cfg.vm_name != name:
            problems.append(f"vms[{name!r}]: its settings name VM {cfg.vm_name!r}")
        out[name] = cfg
    if problems:
        raise PlanError("; ".join(problems))
    return out


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
    # (not mutated: any name of the temporary file writes and renames alike)
    tmp = path.with_suffix(".tmp")  # pragma: no mutate
    tmp.write_text(f"{value}\n")
    tmp.replace(path)


WAKE_S = 0.2        # the main thread's longest sleep: how soon a signal's handler runs


def open_agent(host: str, key_file: str, listen_address: str, state_dir: str,
               bpf_dir: str | None = None) -> tuple[Agent, socket.socket]:
    """The daemon's agent (its executor's state in ``state_dir``, BPF maps
    pinned under ``bpf_dir``) and its listening socket. Raises what is
    wrong by name (OSError, ValueError, ChannelError, ExecError)."""
    from bwcommon.channel import load_secret

    key = load_secret(key_file, private=True)
    executor = Executor(state_file=Path(state_dir) / "executor.json",
                        **({"bpf_pin_dir": Path(bpf_dir)} if bpf_dir else {}))
    return Agent(host, key, Path(state_dir), executor=executor), listen(listen_address)


def main(host: str, key_file: str, listen_address: str, state_dir: str, load_cc: bool = False,
         bpf_dir: str | None = None) -> int:
    """``bwfabric agent``: 2 if it cannot start (said on stderr), else :func:`run`'s."""
    try:
        agent, server = open_agent(host, key_file, listen_address, state_dir, bpf_dir)
    except (OSError, ValueError, ChannelError, ExecError) as exc:
        print(f"bwfabric agent: {exc}", file=sys.stderr)
        return 2
    if load_cc:
        from hostagent import cc
        log.info("BPF side: %s", json.dumps(cc.load()))
    return run(agent, server, listen_address)


def run(agent: Agent, server: socket.socket, listen_address: str) -> int:
    """Serve the channel and run the rounds (daemon threads) until SIGTERM
    or SIGINT; then close the channel, remove the socket file and
    everything the agent put in force. 0, or 1 if removing failed."""
    done = threading.Event()

    def stop(*_):
        done.set()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for loop in (functools.partial(agent.serve, server), agent.buffer_loop, agent.lrc_loop, agent.ese_loop):
        threading.Thread(target=loop, name=f"agent {getattr(loop, 'func', loop).__name__}", daemon=True).start()
    log.info("listening on %s", listen_address)
    # Not done.wait(): a process's signal goes to any of its threads, and
    # Python runs the handler only when the main thread next runs bytecode --
    # which a wait without a timeout never does when the signal landed on a
    # worker (the agent then outlived SIGTERM: issue #32, 2 of 9 agents in one
    # main job). The timeout lets it run within WAKE_S.
    while not done.wait(WAKE_S):  # pragma: no mutate -- which thread a signal lands on is the kernel's choice
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
