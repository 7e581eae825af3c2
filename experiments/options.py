"""Experiment options: declared as dataclass fields, given as KEY=VALUE
strings, converted and checked by the same schema library as bwfabric's
configuration (pydantic, on the dataclass itself): unknown keys, values of
the wrong type, NaN and Infinity are refused naming them; then the
dataclass's own ``check()`` judges what the values mean together."""

from __future__ import annotations

import dataclasses
import typing
from typing import TypeVar

from pydantic import ConfigDict, ValidationError, create_model

T = TypeVar("T")
_NONE = ("none", "")


class OptionError(ValueError):
    pass


def _is_tuple(kind) -> bool:
    return typing.get_origin(kind) is tuple


def _optional(kind) -> bool:
    return type(None) in typing.get_args(kind)


def _model(cls):
    """The dataclass's fields as a pydantic model (types and defaults; the
    model only converts and checks types, the dataclass stays the options)."""
    hints = typing.get_type_hints(cls)
    fields = {}
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else ...)
        fields[f.name] = (hints[f.name], default)
    return create_model(cls.__name__ + "Options", __config__=ConfigDict(allow_inf_nan=False, extra="forbid"),
                        **fields)


def parse_options(cls: type[T], items: list[str]) -> T:
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    values: dict[str, object] = {}
    raw_of: dict[str, str] = {}
    for item in items:
        if "=" not in item:
            raise OptionError(f"option {item!r}: expected KEY=VALUE")
        key, raw = item.split("=", 1)
        key, raw = key.strip().replace("-", "_"), raw.strip()
        if key not in fields:
            raise OptionError(f"unknown option {key!r}; valid: {', '.join(sorted(fields))}")
        raw_of[key] = raw
        if _optional(hints[key]) and raw.lower() in _NONE:
            values[key] = None
        elif _is_tuple(hints[key]):
            values[key] = [part for part in raw.split(",") if part]
        else:
            values[key] = raw
    try:
        given = _model(cls).model_validate(values)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        key = str(err["loc"][0]) if err["loc"] else "?"
        raise OptionError(f"option {key}={raw_of.get(key, '')!r}: {err['msg']}") from None
    obj = cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in given.model_dump().items() if k in values})
    check = getattr(obj, "check", None)
    if check is not None:
        check()
    return obj
