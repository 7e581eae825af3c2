"""Active/standby controllers: a leader election on etcd (issue #34 section 5).

Every controller of a pair (or more) runs one :class:`Election` against the
same etcd key. The leader is the one whose *create-if-absent* of the key
succeeded under a lease it keeps alive; the others are standbys and poll the
key. When the leader dies, its lease expires in etcd (``ttl_s``) and the key
with it; the first standby to create it again leads.

The leader's **generation** is ``GENERATION_BASE + the key's create
revision``. etcd's revisions only grow, so every new leader's generation is
above every earlier one's -- whatever the controllers' clocks say -- and
above every generation a controller without an election uses (its start
time in ns, < 2^62): switches (OpenFlow's ``generation_id`` with the MASTER
role) and agents (their persisted maximum) refuse a stale leader that comes
back.

A leader that cannot renew its lease steps down *before* etcd can let the
lease expire (at ``last renewal + ttl - margin`` by its own clock): two
leaders never overlap by the leases' account, and if they ever did, the
switches keep only the higher generation as MASTER.

This module holds no OpenFlow and no HTTP of its own: the etcd client is
passed in (``etcd3gw.Etcd3Client`` in production, the tests use a real etcd
process), and what a role change means is the caller's ``on_change``:
``on_change(role, generation)`` -- as leader, its own generation; as a
standby, the leader's as last read (None: unknown), again whenever a new
leader is seen.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

GENERATION_BASE = 1 << 62
LEADER, STANDBY = "leader", "standby"

log = logging.getLogger("bwfabric.ha")


def validate(key: Any, node: Any, ttl_s: Any, poll_s: Any) -> None:
    """Refuse bad settings by name (the configuration checks them too)."""
    if not isinstance(key, str) or not key.startswith("/") or len(key) > 256:
        raise ValueError(f"election key {key!r} must be an absolute etcd key (/...), at most 256 characters")
    if not isinstance(node, str) or not node or len(node) > 128:
        raise ValueError(f"node name {node!r} must be a non-empty string of at most 128 characters")
    for name, v, lo, hi in (("ttl_s", ttl_s, 1, 60), ("poll_s", poll_s, 0.05, 10)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:   # NaN fails the range
            raise ValueError(f"{name} {v!r} must be a number in [{lo}, {hi}]")


class Election:
    """One controller's side of the election. ``step()`` runs one round and
    returns the seconds to wait before the next; ``run()`` loops."""

    def __init__(self, client, key: str, node: str, ttl_s: float = 2.0, poll_s: float = 0.2,
                 on_change: Callable[[str, int | None], None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        validate(key, node, ttl_s, poll_s)
        self.client, self.key, self.node = client, key, node
        self.ttl_s, self.poll_s = float(ttl_s), float(poll_s)
        self.on_change = on_change or (lambda role, generation: None)
        self.clock = clock
        self.role = STANDBY
        self.generation: int | None = None     # ours, while we lead
        self.leader: str | None = None         # whom the key names (as last read)
        self.leader_generation: int | None = None   # the leader's generation (ours while we lead)
        self.lease = None
        self.granted_ttl = self.ttl_s
        self.renewed_at: float | None = None
        self.errors = 0                        # rounds where etcd did not answer
        self.changes = 0
        self.stopped = False

    # ---- one round ----------------------------------------------------------------
    def step(self) -> float:
        if self.role == LEADER:
            return self._renew()
        return self._try_to_lead()

    def _renew(self) -> float:
        now = self.clock()
        try:
            left = self.lease.refresh()
            if not isinstance(left, (int, float)) or left <= 0:
                raise RuntimeError(f"the lease is gone (ttl {left!r})")
            self.renewed_at = now
        except Exception as exc:   # noqa: BLE001 - any failure to renew is the same failure
            self.errors += 1
            if now - self.renewed_at >= self.granted_ttl - self._margin():
                self._set(STANDBY, None, f"could not renew the lease for {now - self.renewed_at:.2f} s ({exc})")
                self.lease = None
                return self.poll_s
            return min(self.poll_s, self.granted_ttl / 6)
        return self.granted_ttl / 3

    def _margin(self) -> float:
        return max(0.5, self.granted_ttl / 3)

    def _try_to_lead(self) -> float:
        try:
            got = self.client.get(self.key, metadata=True)
            if got:
                value, meta = got[0]
                self.leader = value.decode() if isinstance(value, bytes) else str(value)
                seen = GENERATION_BASE + int(meta.get("create_revision", 0))
                if seen != self.leader_generation:      # a standby follows the leader's generation
                    self.leader_generation = seen
                    self.on_change(STANDBY, seen)
                return self.poll_s
            lease = self.client.lease(int(round(self.ttl_s)))
            t0 = self.clock()
            if not self.client.create(self.key, self.node, lease=lease):
                try:
                    lease.revoke()
                except Exception:   # noqa: BLE001 - it expires by itself
                    pass
                return self.poll_s
            got = self.client.get(self.key, metadata=True)
            meta = got[0][1] if got else {}
            revision = int(meta.get("create_revision", 0))
            value = got[0][0] if got else b""
            if revision <= 0 or (value.decode() if isinstance(value, bytes) else str(value)) != self.node:
                raise RuntimeError(f"the key was created but reads back {got!r}")
            self.lease, self.renewed_at = lease, t0
            self.granted_ttl = float(int(round(self.ttl_s)))   # what was asked (etcd's TTL call says what is *left*)
            self.leader = self.node
            self.leader_generation = GENERATION_BASE + revision
            self._set(LEADER, GENERATION_BASE + revision, f"key created at revision {revision}")
            return self.granted_ttl / 3
        except Exception as exc:   # noqa: BLE001 - etcd unreachable: stay a standby, try again
            self.errors += 1
            log.debug("election round failed: %s", exc)
            return self.poll_s

    def _set(self, role: str, generation: int | None, why: str) -> None:
        self.role, self.generation = role, generation
        self.changes += 1
        log.warning("%s is now the %s%s: %s", self.node, role,
                    f" (generation {generation})" if generation is not None else "", why)
        self.on_change(role, generation)

    # ---- the loop and a clean exit --------------------------------------------------------
    def run(self, sleep: Callable[[float], None] = time.sleep) -> None:
        while not self.stopped:
            try:
                wait = self.step()
            except Exception as exc:   # noqa: BLE001 - a round never ends the loop
                self.errors += 1
                log.exception("election round raised: %s", exc)
                wait = self.poll_s
            sleep(wait)

    def resign(self) -> None:
        """Step down at once and let a standby take over without waiting for
        the lease to expire (a clean shutdown)."""
        self.stopped = True
        if self.role == LEADER and self.lease is not None:
            try:
                self.lease.revoke()
            except Exception:   # noqa: BLE001 - then it expires
                pass
            self._set(STANDBY, None, "resigned")

    def state(self) -> dict:
        return {"node": self.node, "role": self.role, "generation": self.generation, "leader": self.leader,
                "leader_generation": self.leader_generation,
                "key": self.key, "ttl_s": self.granted_ttl, "errors": self.errors, "changes": self.changes}
