"""The configuration in force in a controller process, its generation and
version, and who is told when it changes (reload on SIGHUP, the API).

A change is checked whole before anything happens (:mod:`controller.config`:
schema, names, admission control); a refused change leaves everything as
it was and is counted (``load_errors``, like Faucet's
``faucet_config_load_error``). An accepted one bumps ``version`` and is
handed to every listener with the old configuration, so each applies only
the difference (switch rules, agent configurations).

Some keys only take effect at start (the fabric, the OpenFlow listener,
the routing app, the API listener): a change to them is refused by name,
with nothing changed, and needs a restart.

``generation`` is fixed for the life of the process and greater than any
earlier process's (nanoseconds of wall-clock time at start): agents refuse
configurations of a lower generation, so a stale controller cannot
overwrite what a newer one pushed (as OpenFlow's generation_id does for
controller roles).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from controller import config
from controller.config import ConfigError, Loaded
from bwcommon.loops import LoopGuard

log = logging.getLogger("bwfabric.runtime")
Listener = Callable[[Loaded, Loaded], None]
RESTART_ONLY = ("controller.openflow", "controller.ha", "controller.link_damping", "controller.routing", "controller.prio_queues", "controller.log_level",
                "controller.state_file", "api.listen", "api.state_file", "fabric")


def restart_only_changes(old: Loaded, new: Loaded) -> list[str]:
    problems = []
    if old.topology.to_dict() != new.topology.to_dict():
        problems.append("fabric.topology: the fabric changed; restart the controller to take a new fabric")
    a, b = old.cfg.model_dump(mode="json"), new.cfg.model_dump(mode="json")
    for key in RESTART_ONLY:
        if key == "fabric":
            continue
        section, _, name = key.partition(".")
        if (a.get(section) or {}).get(name) != (b.get(section) or {}).get(name):
            problems.append(f"{key}: takes effect at start only; restart the controller to change it")
    return problems


class Runtime:
    def __init__(self, loaded: Loaded, generation: int | None = None):
        self.loaded = loaded
        self.generation = generation if generation is not None else time.time_ns()
        # controller.ha: "single" (no election), "leader" or "standby"; a standby writes nothing to
        # switches or agents. ``leader_generation``: the current leader's, as this process last saw it
        self.role = "single"
        self.leader_generation: int | None = None
        self.leader_name: str | None = None
        self.role_listeners: list[Callable[[str, int | None], None]] = []
        self.version = 1
        self.lock = threading.RLock()
        self.listeners: list[tuple[str, Listener]] = []
        self.guard = LoopGuard(log)
        self.load_errors = 0          # refused changes since start
        self.last_error: str | None = None
        self.last_error_current = False   # the latest change was refused
        self.changed_at = time.time()
        # what of the API's persisted changes this process started without (controller.config.load)
        self.overlay_set_aside = loaded.set_aside.describe() if loaded.set_aside is not None else None
        config.set_active(loaded)

    def leading(self) -> bool:
        return self.role != "standby"

    def on_role(self, fn: Callable[[str, int | None], None]) -> None:
        """``fn(role, generation)`` at every role change (controller.ha)."""
        with self.lock:
            self.role_listeners.append(fn)

    def set_role(self, role: str, generation: int | None, leader: str | None = None) -> None:
        """The election's verdict: as leader this process takes the
        election's generation (agents and switches refuse lower ones); as a
        standby it remembers the leader's."""
        if role not in ("leader", "standby"):
            raise ValueError(f"role {role!r} must be leader or standby")
        with self.lock:
            self.role = role
            if role == "leader":
                self.generation = generation
            self.leader_generation = generation
            self.leader_name = leader
            listeners = list(self.role_listeners)
        for fn in listeners:
            self.guard.run("role_change", fn, role, generation)

    def subscribe(self, name: str, fn: Listener) -> None:
        with self.lock:
            self.listeners.append((name, fn))

    def apply(self, new: Loaded, source: str) -> dict:
        """Put an already checked configuration in force; returns what changed."""
        with self.lock:
            problems = restart_only_changes(self.loaded, new)
            if problems:
                self._refused(source, problems)
            old = self.loaded
            if new.digest == old.digest:
                self.last_error_current = False
                return {"changed": False, "version": self.version, "digest": new.digest}
            self.last_error_current = False
            self.loaded, self.version, self.changed_at = new, self.version + 1, time.time()
            config.set_active(new)
            failed = []
            for name, fn in self.listeners:
                ok, _ = self.guard.run(f"apply:{name}", fn, old, new)
                if not ok:
                    failed.append(name)
            log.info("configuration %s in force (version %d, from %s)%s", new.digest, self.version, source,
                     f"; listeners failed: {', '.join(failed)}" if failed else "")
            return {"changed": True, "version": self.version, "digest": new.digest, "listeners_failed": failed}

    def _refused(self, source: str, problems: list[str]):
        self.load_errors += 1
        self.last_error_current = True
        self.last_error = "; ".join(problems)
        log.error("%s refused, nothing changed:\n  %s", source, "\n  ".join(problems))
        raise ConfigError(problems)

    def reload(self) -> dict:
        """Read the configuration file again (SIGHUP, POST /v1/reload)."""
        with self.lock:
            if self.loaded.path is None:
                self._refused("reload", ["the configuration was not read from a file"])
            try:
                new = config.load(self.loaded.path)
            except ConfigError as exc:
                self._refused(f"reload of {self.loaded.path}", exc.problems)
            return self.apply(new, f"reload of {self.loaded.path}")

    def change(self, mutate: Callable[[Loaded], dict], persist: Callable[[dict], None], source: str) -> dict:
        """One linearizable change of the API's overlay: under the lock every
        change and reload takes, ``mutate`` reads the configuration in force
        and returns the new overlay (or raises to refuse); the result is
        checked whole, ``persist``-ed, and only then put in force. A reload
        or another change cannot come between the read and the write, so no
        accepted change is lost or reverted, and what runs is what a restart
        loads from the file and the persisted overlay."""
        with self.lock:
            loaded = self.loaded
            overlay = mutate(loaded)
            new = self.propose(loaded.raw, overlay, source)
            persist(overlay)
            return self.apply(new, source)

    def propose(self, data: dict, overlay: dict | None, source: str) -> Loaded:
        """Check a proposed configuration (the API's); raises ConfigError."""
        try:
            new = config.from_data(data, overlay=overlay, path=self.loaded.path)
        except ConfigError as exc:
            self._refused(source, exc.problems)
        problems = restart_only_changes(self.loaded, new)
        if problems:
            self._refused(source, problems)
        return new


def samples(rt: Runtime):
    """Metrics of the configuration in force (see controller.metrics)."""
    from controller import admission
    loaded = rt.loaded
    yield "bwfabric_config_hash", {"hash": loaded.digest, "file": str(loaded.path or "")}, 1
    yield "bwfabric_config_version", {}, rt.version
    yield "bwfabric_controller_generation", {}, rt.generation
    yield "bwfabric_config_load_errors", {}, rt.load_errors
    yield "bwfabric_config_load_error", {}, 1 if rt.last_error_current else 0
    yield "bwfabric_config_overlay_set_aside", {}, 1 if rt.overlay_set_aside else 0
    for lk in loaded.topology.links:
        for a, b in ((lk.a, lk.b), (lk.b, lk.a)):
            yield "bwfabric_link_capacity_bytes_per_second", {"src": a, "dst": b}, lk.capacity_mbps * 1e6 / 8
    for p in loaded.vms().values():
        yield ("bwfabric_tenant_guarantee_bytes_per_second", {"tenant": p.tenant, "vm": p.name, "host": p.host},
               p.vm.guarantee_mbps * 1e6 / 8)
    for row in admission.headroom(loaded.topology, loaded.guarantees(), loaded.cfg.admission.mu):
        yield ("bwfabric_admission_headroom_bytes_per_second", {"cut": row["cut"]},
               (row["limit_mbps"] - row["crossing_mbps"]) * 1e6 / 8)


_CURRENT: Runtime | None = None


def start(loaded: Loaded, generation: int | None = None) -> Runtime:
    global _CURRENT
    _CURRENT = Runtime(loaded, generation)
    return _CURRENT


def current() -> Runtime | None:
    """The launcher's runtime; None when apps run under ryu-manager (no reload)."""
    return _CURRENT


def stop() -> None:
    global _CURRENT
    _CURRENT = None
    config.set_active(None)
