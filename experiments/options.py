"""Experiment options: declared as dataclass fields, parsed from KEY=VALUE
strings, unknown keys and bad values rejected with a message naming them."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, TypeVar

T = TypeVar("T")


class OptionError(ValueError):
    pass


def _convert(name: str, raw: str, kind: Any) -> Any:
    origin = typing.get_origin(kind)
    try:
        if kind is bool:
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if kind in (int, float, str):
            return kind(raw)
        if origin is tuple:
            inner = typing.get_args(kind)[0]
            return tuple(_convert(name, part, inner) for part in raw.split(",") if part)
        if origin is typing.Union or origin is getattr(__import__("types"), "UnionType", None):
            args = [a for a in typing.get_args(kind) if a is not type(None)]
            if raw.lower() in ("none", ""):
                return None
            return _convert(name, raw, args[0])
    except ValueError:
        raise OptionError(f"option {name}={raw!r}: not a valid {getattr(kind, '__name__', kind)}") from None
    raise OptionError(f"option {name}: unsupported type {kind}")


def parse_options(cls: type[T], items: list[str]) -> T:
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise OptionError(f"option {item!r}: expected KEY=VALUE")
        key, raw = item.split("=", 1)
        key = key.strip().replace("-", "_")
        if key not in fields:
            raise OptionError(f"unknown option {key!r}; valid: {', '.join(sorted(fields))}")
        values[key] = _convert(key, raw.strip(), hints[key])
    obj = cls(**values)
    check = getattr(obj, "check", None)
    if check is not None:
        check()
    return obj
