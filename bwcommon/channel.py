"""The controller <-> host agent channel: authenticated, replay-protected
messages (pure; the socket transport is in :mod:`bwcommon.transport`).

Every message is one JSON object::

    {"v": 1, "host": "h1", "seq": 1763791234567890123, "ts": 1763791234.56,
     "type": "config", "body": {...}, "mac": "<hex HMAC-SHA256>"}

- ``mac`` is HMAC-SHA256 under the host's key over the canonical JSON
  (sorted keys, no spaces) of every other field. Each host has its own key,
  derived from the controller's master secret as HMAC(master, "bwfabric
  agent key " + host): the controller needs one secret, a host holds only
  its own key, and a host's key does not open any other host's channel.
- Direction: each direction signs with its own subkey (controller->agent
  ``c2a``, agent->controller ``a2c``), so an agent's reply can never be
  reflected back to it as a command.
- Replay: ``seq`` must be strictly greater than the last one accepted from
  that direction (the sender uses ``max(time_ns, last + 1)``, so restarts
  keep it increasing), and ``ts`` within ``max_skew_s`` of the receiver's
  clock. A receiver persists its last accepted ``seq`` (see
  :class:`ReplayGuard`), so a captured message cannot be replayed after the
  agent restarts either.
- Anything wrong -- not JSON, missing fields, wrong host, bad MAC, old seq,
  stale ts -- raises :class:`ChannelError` naming the problem; nothing in the
  message is acted on.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bwcommon.validate import finite_number, strict_json

VERSION = 1
KEY_LABEL = b"bwfabric agent key "
FIELDS = ("v", "host", "seq", "ts", "type", "body")
DEFAULT_MAX_SKEW_S = 30.0


_HEX64 = re.compile(r"[0-9a-f]{64}")


class ChannelError(ValueError):
    pass


def host_key(master: bytes, host: str) -> bytes:
    if len(master) < 16:
        raise ChannelError("the master secret must be at least 16 bytes")
    return hmac.new(master, KEY_LABEL + host.encode(), hashlib.sha256).digest()


def load_secret(path: str | Path, private: bool = False) -> bytes:
    """A key file: hex text (as written by ``bwfabric agent-key``). With
    ``private``, a file that others may read or write is refused."""
    path = Path(path)
    if private:
        mode = path.stat().st_mode
        if mode & 0o077:
            raise ChannelError(f"{path}: mode {mode & 0o777:o} lets others read or change the key; "
                               f"chmod 600 {path}")
    try:
        key = bytes.fromhex(path.read_bytes().decode("ascii").strip())  # pragma: no mutate (codec names: any case)
    except ValueError:  # UnicodeDecodeError is a ValueError too
        raise ChannelError(f"{path}: not a hex key") from None
    if len(key) < 16:
        raise ChannelError(f"{path}: key too short ({len(key)} bytes, need >= 16)")
    return key


DIRECTIONS = ("c2a", "a2c")


def write_secret(path: str | Path, text: str) -> None:
    """Create a secret file readable by its owner only from the first byte
    on (O_EXCL: an existing file is never reused, so nothing written before
    keeps other permissions)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def direction_key(key: bytes, direction: str) -> bytes:
    if direction not in DIRECTIONS:
        raise ChannelError(f"direction {direction!r} must be one of {DIRECTIONS}")
    return hmac.new(key, b"bwfabric direction " + direction.encode(), hashlib.sha256).digest()


def _canonical(fields: dict[str, Any]) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def _mac(key: bytes, fields: dict[str, Any]) -> str:
    return hmac.new(key, _canonical(fields), hashlib.sha256).hexdigest()


@dataclass
class Sender:
    """Signs messages for one host's channel, with increasing seq."""
    key: bytes
    host: str
    direction: str = "c2a"
    last_seq: int = 0
    clock: Any = time.time
    clock_ns: Any = None            # default: time.time_ns with the real clock, else the given clock in ns

    def seal(self, msg_type: str, body: dict[str, Any]) -> bytes:
        # (not mutated: time.time_ns() and int(time.time() * 1e9) differ below a float's precision only)
        ns = self.clock_ns() if self.clock_ns is not None else (
            time.time_ns() if self.clock is time.time else int(self.clock() * 1e9))  # pragma: no mutate
        self.last_seq = max(ns, self.last_seq + 1)
        fields = {"v": VERSION, "host": self.host, "seq": self.last_seq, "ts": self.clock(),
                  "type": msg_type, "body": body}
        return _canonical({**fields, "mac": _mac(direction_key(self.key, self.direction), fields)})


@dataclass
class ReplayGuard:
    """The last accepted seq, optionally persisted to ``state_file``."""
    state_file: Path | None = None
    last_seq: int = field(default=0)

    persist_error: str | None = None     # why the last accepted seq could not be written (None: it was)
    clock: Any = time.time

    def __post_init__(self) -> None:
        if self.state_file is not None and Path(self.state_file).exists():
            try:
                self.last_seq = int(Path(self.state_file).read_text().strip() or 0)
            except (ValueError, OSError):
                raise ChannelError(f"{self.state_file}: corrupt replay state") from None
        # A seq ahead of this clock (a signed message from a future clock, persisted) would lock the
        # channel out until the clock catches up -- for a day, a year. Seqs are the sender's clock in ns
        # and a message is refused unless its ts is within the skew, so nothing replayable lies above
        # now + skew: the guard is brought back there.
        ceiling = self.ceiling()
        if self.last_seq > ceiling:
            logging.getLogger("bwfabric.agent").warning(
                "replay state %d is %.0f s ahead of this clock; brought back to now + %g s",
                self.last_seq, (self.last_seq - ceiling) / 1e9, DEFAULT_MAX_SKEW_S)
            self.last_seq = ceiling

    def ceiling(self) -> int:
        return int((self.clock() + DEFAULT_MAX_SKEW_S) * 1e9)

    def accept(self, seq: int) -> None:
        if seq <= self.last_seq:
            raise ChannelError(f"replayed or reordered message: seq {seq} <= last accepted {self.last_seq}")
        self.last_seq = seq
        if self.state_file is not None:
            tmp = Path(f"{self.state_file}.tmp")
            try:
                tmp.write_text(str(seq))
                os.replace(tmp, self.state_file)
                self.persist_error = None
            except OSError as exc:
                self.persist_error = f"{self.state_file}: {exc.strerror or exc}"
                try:
                    tmp.unlink()
                except OSError:
                    pass


@dataclass
class Receiver:
    key: bytes
    host: str
    guard: ReplayGuard = field(default_factory=ReplayGuard)
    direction: str = "c2a"
    max_skew_s: float = DEFAULT_MAX_SKEW_S
    clock: Any = time.time

    def open(self, raw: bytes) -> tuple[str, dict[str, Any]]:
        """Verify and return (type, body), or raise ChannelError. Parsing is
        bounded before the MAC is checked: UTF-8 only, no NaN/Infinity,
        nesting at most MAX_NESTING levels."""
        try:
            msg = strict_json(raw, "message")
        except ValueError as exc:
            raise ChannelError(f"not a JSON message ({exc})") from None
        if not isinstance(msg, dict):
            raise ChannelError("message must be a JSON object")
        missing = [f for f in (*FIELDS, "mac") if f not in msg]
        if missing:
            raise ChannelError(f"message lacks {', '.join(missing)}")
        extra = sorted(set(msg) - set(FIELDS) - {"mac"})
        if extra:
            raise ChannelError(f"unknown message fields {extra}")
        fields = {f: msg[f] for f in FIELDS}
        # compare_digest raises TypeError on non-ASCII str: compare bytes of a hex-only MAC
        if not isinstance(msg["mac"], str) or not _HEX64.fullmatch(msg["mac"]) or not hmac.compare_digest(
                msg["mac"].encode(), _mac(direction_key(self.key, self.direction), fields).encode()):
            raise ChannelError("bad MAC: forged, corrupted, or signed with another host's key")
        if msg["v"] != VERSION:
            raise ChannelError(f"protocol version {msg['v']} not supported (this agent speaks {VERSION})")
        if msg["host"] != self.host:
            raise ChannelError(f"message for host {msg['host']!r}, this is {self.host!r}")
        if isinstance(msg["seq"], bool) or not isinstance(msg["seq"], int) or not 0 < msg["seq"] < 2**63:
            raise ChannelError("seq must be an integer in 1..2^63-1")
        if not finite_number(msg["ts"]):
            raise ChannelError("ts must be a finite number (a NaN would pass any freshness check)")
        if not isinstance(msg["type"], str) or not isinstance(msg["body"], dict):
            raise ChannelError("type must be a string and body an object")
        skew = abs(self.clock() - msg["ts"])
        if skew > self.max_skew_s:
            raise ChannelError(f"stale or future message: clock skew {skew:.1f} s > {self.max_skew_s:g} s")
        if msg["seq"] > (self.clock() + self.max_skew_s) * 1e9:     # seqs are the sender's clock in ns
            raise ChannelError(f"seq {msg['seq']} is ahead of this clock by more than {self.max_skew_s:g} s")
        self.guard.accept(msg["seq"])  # last: only an authentic, fresh message advances the guard
        return msg["type"], msg["body"]
