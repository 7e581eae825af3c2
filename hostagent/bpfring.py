"""Read a pinned BPF ring buffer from Python, through libbpf (libbpf.so.1,
the library bpftool itself is built on): ``bpf_obj_get`` opens the pin,
``ring_buffer__new`` maps it and ``ring_buffer__poll`` hands each record to
a callback. Only the ctypes binding is ours: Debian ships no Python binding
of libbpf (bcc's tables work only with maps bcc loaded itself).

The records of hostagent/bpf/bwf_coupled.bpf.c are parsed here too
(:func:`parse_trace`, :func:`parse_ese`); their layouts must match the C
structs (``struct rec``, ``struct ese_event``)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
from dataclasses import dataclass
from pathlib import Path

_CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_lib = None


class RingError(RuntimeError):
    pass


def _libbpf():
    global _lib
    if _lib is None:
        name = ctypes.util.find_library("bpf") or "libbpf.so.1"
        try:
            lib = ctypes.CDLL(name, use_errno=True)
        except OSError as exc:
            raise RingError(f"libbpf not found ({exc}): apt-get install libbpf1") from None
        lib.bpf_obj_get.argtypes = [ctypes.c_char_p]
        lib.bpf_obj_get.restype = ctypes.c_int
        lib.ring_buffer__new.argtypes = [ctypes.c_int, _CB, ctypes.c_void_p, ctypes.c_void_p]
        lib.ring_buffer__new.restype = ctypes.c_void_p
        lib.ring_buffer__poll.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.ring_buffer__poll.restype = ctypes.c_int
        lib.ring_buffer__consume.argtypes = [ctypes.c_void_p]
        lib.ring_buffer__consume.restype = ctypes.c_int
        lib.ring_buffer__free.argtypes = [ctypes.c_void_p]
        lib.ring_buffer__free.restype = None
        for fn in ("bpf_map_get_next_key", "bpf_map_lookup_elem"):
            getattr(lib, fn).argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
            getattr(lib, fn).restype = ctypes.c_int
        lib.bpf_map_delete_elem.argtypes = [ctypes.c_int, ctypes.c_void_p]
        lib.bpf_map_delete_elem.restype = ctypes.c_int
        _lib = lib
    return _lib


class Ring:
    """A pinned ring buffer; :meth:`poll` returns the records that arrived
    (bytes each), waiting at most ``timeout_ms`` for the first."""

    def __init__(self, pin: Path | str):
        lib = _libbpf()
        self.fd = lib.bpf_obj_get(str(pin).encode())
        if self.fd < 0:
            raise RingError(f"{pin}: {os.strerror(ctypes.get_errno())}")
        self._got: list[bytes] = []

        def on_record(_ctx, data, size):
            self._got.append(ctypes.string_at(data, size))
            return 0
        self._cb = _CB(on_record)        # kept: libbpf calls it after this returns
        self.rb = lib.ring_buffer__new(self.fd, self._cb, None, None)
        if not self.rb:
            os.close(self.fd)
            raise RingError(f"{pin}: ring_buffer__new: {os.strerror(ctypes.get_errno())}")

    def poll(self, timeout_ms: int = 100) -> list[bytes]:
        n = _libbpf().ring_buffer__poll(self.rb, int(timeout_ms))
        if n < 0 and -n != 4:            # EINTR: try again next time
            raise RingError(f"ring_buffer__poll: {os.strerror(-n)}")
        got, self._got = self._got, []
        return got

    def drain(self) -> list[bytes]:
        _libbpf().ring_buffer__consume(self.rb)
        got, self._got = self._got, []
        return got

    def close(self) -> None:
        if self.rb:
            _libbpf().ring_buffer__free(self.rb)
            self.rb = None
            os.close(self.fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class HashMap:
    """A pinned hash map read and emptied entry by entry (bytes keys and
    values of fixed sizes), through libbpf's syscall wrappers."""

    def __init__(self, pin: Path | str, key_size: int, value_size: int):
        self.fd = _libbpf().bpf_obj_get(str(pin).encode())
        if self.fd < 0:
            raise RingError(f"{pin}: {os.strerror(ctypes.get_errno())}")
        self.ks, self.vs = key_size, value_size

    def items(self) -> list[tuple[bytes, bytes]]:
        lib, out = _libbpf(), []
        key, nxt, val = (ctypes.create_string_buffer(self.ks), ctypes.create_string_buffer(self.ks),
                         ctypes.create_string_buffer(self.vs))
        first = True
        for _ in range(1 << 16):
            if lib.bpf_map_get_next_key(self.fd, None if first else key, nxt) != 0:
                break
            first = False
            ctypes.memmove(key, nxt, self.ks)
            if lib.bpf_map_lookup_elem(self.fd, key, val) == 0:
                out.append((key.raw, val.raw))
        return out

    def delete(self, key: bytes) -> bool:
        buf = ctypes.create_string_buffer(key, self.ks)
        return _libbpf().bpf_map_delete_elem(self.fd, buf) == 0

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


# ---- bwf_coupled's records ------------------------------------------------------------------
REC_SAMPLE, REC_INCREASE, REC_LOSS, REC_ESE = 1, 2, 3, 4
F_SLOWSTART, F_OFF, F_NOTLIMITED, F_UNCOUNTED, F_FIRST = 1, 2, 4, 8, 16
MAX_SUB = 9
_HEAD = struct.Struct("<QQ12IQQII")
_SIB = struct.Struct("<4I")
REC_SIZE = _HEAD.size + MAX_SUB * _SIB.size
_ESE = struct.Struct("<4I2H3I")
ESE_KEY = struct.Struct("<2I2H")       # struct ese_key: saddr, daddr (network order), sport, dport
KINDS = {1: "lia", 2: "mptcp_d", 3: "lia_vm"}


@dataclass(frozen=True)
class Sib:
    id: int
    cwnd: int
    srtt8: int          # the subflow's own sRTT x 8, microseconds (0: none yet)
    rtt: int            # its latest sample, microseconds


@dataclass(frozen=True)
class Record:
    ts_ns: int
    conn: int
    type: int
    kind: int
    sub: int
    flags: int
    acked: int
    acked_ca: int
    rtt: int
    srtt8: int
    min_rtt: int
    samples: int
    cwnd_before: int
    cwnd_after: int
    frac_before: int
    frac_after: int
    alpha: int
    sibs: tuple[Sib, ...]


def parse_trace(raw: bytes) -> Record:
    if len(raw) < REC_SIZE:
        raise RingError(f"trace record of {len(raw)} bytes, expected {REC_SIZE}")
    h = _HEAD.unpack_from(raw)
    n = min(h[-1], MAX_SUB)
    sibs = tuple(Sib(*_SIB.unpack_from(raw, _HEAD.size + i * _SIB.size)) for i in range(n))
    return Record(*h[:-1], sibs=sibs)


@dataclass(frozen=True)
class EseEvent:
    token: int
    sub: int
    saddr: str
    daddr: str
    sport: int
    dport: int
    rtt_us: int
    ref_rtt_us: int
    min_rtt_us: int


def parse_ese(raw: bytes) -> EseEvent:
    if len(raw) < _ESE.size:
        raise RingError(f"ESE event of {len(raw)} bytes, expected {_ESE.size}")
    token, sub, saddr, daddr, sport, dport, rtt, ref, mn = _ESE.unpack_from(raw)
    ip = lambda a: ".".join(str(b) for b in a.to_bytes(4, "little"))   # noqa: E731 (network order in a u32)
    return EseEvent(token, sub, ip(saddr), ip(daddr), sport, dport, rtt, ref, mn)
