"""Pinned BPF maps read and written with the bpf(2) system call.

Why by hand: the agent touches a handful of pinned hash maps (pacing
ceilings, A_l, BG buckets) every LRC round and at every status read-back.
``bpftool`` costs a process each time (~5 ms of CPU from a Python agent;
16 agents of 32 VMs spent most of their CPU there, docs/results.md), and
no maintained Python library offers map access without a toolchain (bcc
compiles at import, libbpf has no Python binding, pyroute2 has no maps).
The system call's map commands are a small, stable ABI (include/uapi/
linux/bpf.h: BPF_OBJ_GET, BPF_MAP_LOOKUP_ELEM, _UPDATE_ELEM, _DELETE_ELEM,
_GET_NEXT_KEY, BPF_OBJ_GET_INFO_BY_FD), used here and nowhere else.

File descriptors of the maps are kept open per pinned path: a map that
was pinned anew (the loader replaced it) is noticed by the pin's inode
and opened again.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import threading
from pathlib import Path

SYS_BPF = {"x86_64": 321, "aarch64": 280}.get(platform.machine())
BPF_MAP_LOOKUP_ELEM, BPF_MAP_UPDATE_ELEM, BPF_MAP_DELETE_ELEM, BPF_MAP_GET_NEXT_KEY = 1, 2, 3, 4
BPF_OBJ_GET, BPF_OBJ_GET_INFO_BY_FD = 7, 15
BPF_ANY = 0
ATTR_SIZE = 128           # the kernel zero-checks the tail of what it does not know


class BpfMapError(OSError):
    pass


class _MapInfo(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint32), ("id", ctypes.c_uint32), ("key_size", ctypes.c_uint32),
                ("value_size", ctypes.c_uint32), ("max_entries", ctypes.c_uint32), ("map_flags", ctypes.c_uint32),
                ("name", ctypes.c_char * 16)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _bpf(cmd: int, attr: ctypes.Array) -> int:
    if SYS_BPF is None:
        raise BpfMapError(errno.ENOSYS, f"bpf(2): no system call number known for {platform.machine()}")
    res = _libc.syscall(ctypes.c_long(SYS_BPF), ctypes.c_int(cmd), attr, ctypes.c_uint(ATTR_SIZE))
    if res < 0:
        err = ctypes.get_errno()
        raise BpfMapError(err, os.strerror(err))
    return res


def _attr(*words: tuple[str, int]) -> ctypes.Array:
    """A zeroed bpf_attr with ``(format, value)`` fields packed in order
    (``I``: u32, ``Q``: u64, natural alignment)."""
    buf = (ctypes.c_uint8 * ATTR_SIZE)()
    off = 0
    for fmt, value in words:
        size = 4 if fmt == "I" else 8
        off = (off + size - 1) // size * size
        ctypes.memmove(ctypes.addressof(buf) + off, value.to_bytes(size, "little"), size)
        off += size
    return buf


class PinnedMap:
    """One pinned map, open: lookup, update, delete by key bytes."""

    def __init__(self, path: Path):
        self.path = Path(path)
        name = ctypes.create_string_buffer(str(self.path).encode())
        self.fd = _bpf(BPF_OBJ_GET, _attr(("Q", ctypes.addressof(name)), ("I", 0), ("I", 0)))
        self.inode = os.stat(self.path).st_ino
        info = _MapInfo()
        try:
            _bpf(BPF_OBJ_GET_INFO_BY_FD, _attr(("I", self.fd), ("I", ctypes.sizeof(info)),
                                               ("Q", ctypes.addressof(info))))
        except OSError:
            os.close(self.fd)
            raise
        self.key_size, self.value_size = info.key_size, info.value_size

    def _key(self, key: bytes) -> ctypes.Array:
        if len(key) != self.key_size:
            raise BpfMapError(errno.EINVAL, f"{self.path}: key of {len(key)} bytes, the map's are {self.key_size}")
        return ctypes.create_string_buffer(bytes(key), self.key_size)

    def lookup(self, key: bytes) -> bytes | None:
        k, v = self._key(key), ctypes.create_string_buffer(self.value_size)
        try:
            _bpf(BPF_MAP_LOOKUP_ELEM, _attr(("I", self.fd), ("I", 0), ("Q", ctypes.addressof(k)),
                                            ("Q", ctypes.addressof(v))))
        except BpfMapError as exc:
            if exc.errno == errno.ENOENT:
                return None
            raise
        return v.raw

    def update(self, key: bytes, value: bytes) -> None:
        if len(value) != self.value_size:
            raise BpfMapError(errno.EINVAL, f"{self.path}: value of {len(value)} bytes, the map's are "
                                            f"{self.value_size}")
        k, v = self._key(key), ctypes.create_string_buffer(bytes(value), self.value_size)
        _bpf(BPF_MAP_UPDATE_ELEM, _attr(("I", self.fd), ("I", 0), ("Q", ctypes.addressof(k)),
                                        ("Q", ctypes.addressof(v)), ("Q", BPF_ANY)))

    def delete(self, key: bytes) -> bool:
        """False: there was no such entry."""
        k = self._key(key)
        try:
            _bpf(BPF_MAP_DELETE_ELEM, _attr(("I", self.fd), ("I", 0), ("Q", ctypes.addressof(k))))
        except BpfMapError as exc:
            if exc.errno == errno.ENOENT:
                return False
            raise
        return True

    def keys(self) -> list[bytes]:
        """Every key, as the kernel walks them now (a hash map's walk starts
        over if the key it stood on was deleted meanwhile: a key may come
        twice, none that stayed is missed)."""
        out: list[bytes] = []
        cur = None
        nxt = ctypes.create_string_buffer(self.key_size)
        for _ in range(1 << 20):           # a walk longer than any map we own is a bug, not a loop
            k = 0 if cur is None else ctypes.addressof(cur)
            try:
                _bpf(BPF_MAP_GET_NEXT_KEY, _attr(("I", self.fd), ("I", 0), ("Q", k), ("Q", ctypes.addressof(nxt))))
            except BpfMapError as exc:
                if exc.errno == errno.ENOENT:
                    return out
                raise
            out.append(nxt.raw)
            cur = ctypes.create_string_buffer(nxt.raw, self.key_size)
        raise BpfMapError(errno.E2BIG, f"{self.path}: more than 2^20 keys")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Maps:
    """Open pinned maps by path, reopened when the pin was replaced."""

    def __init__(self):
        self._open: dict[Path, PinnedMap] = {}
        self._lock = threading.Lock()

    def get(self, path: Path) -> PinnedMap | None:
        """The map pinned at ``path`` (None: nothing pinned there)."""
        path = Path(path)
        try:
            inode = os.stat(path).st_ino
        except FileNotFoundError:
            return None
        with self._lock:
            m = self._open.get(path)
            if m is not None and m.inode == inode:
                return m
            if m is not None:
                m.close()
            m = self._open[path] = PinnedMap(path)
            return m

    def close(self) -> None:
        with self._lock:
            for m in self._open.values():
                m.close()
            self._open.clear()


class _ProgInfo(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint32), ("id", ctypes.c_uint32)]


def prog_id(path: Path) -> int:
    """The id of the program pinned at ``path`` (FileNotFoundError: none)."""
    if not Path(path).exists():
        raise FileNotFoundError(str(path))
    name = ctypes.create_string_buffer(str(path).encode())
    fd = _bpf(BPF_OBJ_GET, _attr(("Q", ctypes.addressof(name)), ("I", 0), ("I", 0)))
    try:
        info = _ProgInfo()
        _bpf(BPF_OBJ_GET_INFO_BY_FD, _attr(("I", fd), ("I", ctypes.sizeof(info)), ("Q", ctypes.addressof(info))))
        return info.id
    finally:
        os.close(fd)
