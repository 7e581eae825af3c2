"""Input checks shared by every boundary (settings, topology files, agent
configs, algorithm inputs): finite numbers and strict JSON.

Python's ``json`` accepts ``NaN``, ``Infinity`` and ``-Infinity`` and turns
them into floats that compare false with everything, so a range check like
``not x > 0`` is the only kind that catches them; ``x < 0`` lets them through.
Everything here refuses them outright and names what was refused.
"""

from __future__ import annotations

import json
import math
import os
import stat
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict

MAX_NESTING = 32   # no bwfabric document is deeper than a handful of levels


def finite_number(x: Any) -> bool:
    """An int or float (not a bool) that is neither NaN nor infinite."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:          # an int too large for a float (JSON allows any number of digits)
        return False


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number bwfabric accepts (non-finite)")


def read_bounded(path: "str | os.PathLike", limit: int, what: str) -> bytes:
    """A regular file's bytes, at most ``limit``; a ValueError naming
    ``what`` for anything else: missing, unreadable, a directory, a FIFO
    (opened without blocking, so it cannot hang us), a device such as
    /dev/zero (never read endlessly), or a file over the limit."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ValueError(f"{what} {path}: cannot read: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise ValueError(f"{what} {path}: {kind}")
        if st.st_size > limit:
            raise ValueError(f"{what} {path}: {st.st_size} bytes, more than {limit}")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 16, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise ValueError(f"{what} {path}: more than {limit} bytes")
        return b"".join(chunks)
    except OSError as exc:
        raise ValueError(f"{what} {path}: cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    """An object whose keys are all different (``json`` keeps the last of
    a repeated key silently; two writers could then disagree on a value)."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def nesting_depth(text: str) -> int:
    """Deepest bracket nesting of a JSON text, strings skipped (cheap and
    bounded: checked before ``json.loads``, whose recursion would otherwise
    raise RecursionError on absurd nesting)."""
    depth = deepest = 0
    in_str = escape = False
    for ch in text:
        if in_str:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def strict_json(raw: str | bytes, what: str, max_depth: int = MAX_NESTING) -> Any:
    """Parse JSON refusing non-UTF-8 bytes, NaN/Infinity and nesting deeper
    than ``max_depth``; every failure is a ValueError naming ``what``."""
    if isinstance(raw, (bytes, bytearray)):
        try:
            raw = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{what}: not UTF-8 text (byte {exc.start})") from None
    if nesting_depth(raw) > max_depth:
        raise ValueError(f"{what}: nested deeper than {max_depth} levels")
    try:
        return json.loads(raw, parse_constant=_refuse_constant, object_pairs_hook=_unique_keys)
    except ValueError as exc:  # JSONDecodeError is a ValueError; so is _refuse_constant's
        raise ValueError(f"{what}: not valid JSON: {exc}") from None
    except RecursionError:
        raise ValueError(f"{what}: nested too deeply") from None


# ---- schema building blocks (pydantic), shared by the configuration and the agent --------------


class StrictModel(BaseModel):
    """Types as declared (no coercion), no unknown keys, no NaN/Infinity,
    immutable; defaults are checked too."""
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True, strict=True, validate_default=True)


def _ip(v: str) -> str:
    import ipaddress
    ipaddress.ip_address(v)
    return v


def _ipv4(v: str) -> str:
    import ipaddress
    ipaddress.IPv4Address(v)
    return v


IPAddress = Annotated[str, AfterValidator(_ip)]       # IPv4 or IPv6, as text
IPv4Address = Annotated[str, AfterValidator(_ipv4)]
