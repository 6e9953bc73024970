"""Typed wire messages: dataclasses that validate themselves on arrival.

A message is a frozen-ish dataclass deriving from :class:`Message`. ``to_wire`` turns it
into plain msgpack-able values; ``from_wire`` checks every declared field's type (and the
ranges a field declares with ``field(metadata={"min": .., "max": ..})``), ignores unknown
fields sent by newer peers, and raises :class:`WireError` on anything missing or wrong.

Supported field types: ``int``, ``float``, ``str``, ``bool``, ``bytes``, ``list[T]``,
``dict[str, T]``, ``T | None`` and nested ``Message`` subclasses.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any, ClassVar, TypeVar, get_args, get_origin

M = TypeVar("M", bound="Message")

#: Longest list / dict accepted in any single field unless the field says otherwise.
DEFAULT_MAX_ITEMS = 1_000_000


class WireError(ValueError):
    """A message that does not match its schema (missing field, wrong type, out of range)."""


def bounded(min: float | None = None, max: float | None = None, max_items: int | None = None) -> Any:
    """Field metadata for range checks: ``x: int = bounded(min=0)`` (required field)."""
    meta = {"min": min, "max": max, "max_items": max_items}
    return dataclasses.field(metadata=meta)


def bounded_default(default: Any, min: float | None = None, max: float | None = None) -> Any:
    """Like :func:`bounded` but with a default value (optional on the wire)."""
    return dataclasses.field(default=default, metadata={"min": min, "max": max})


class Message:
    """Base class of wire messages. Subclasses are ``@dataclasses.dataclass``."""

    #: Short name used in error messages and logs.
    KIND: ClassVar[str] = "message"

    def to_wire(self) -> dict[str, Any]:
        return {f.name: _encode(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_wire(cls: type[M], data: Any) -> M:
        if not isinstance(data, dict):
            raise WireError(f"{cls.KIND}: expected a map, got {type(data).__name__}")
        hints = _type_hints(cls)
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name not in data:
                if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
                    continue
                raise WireError(f"{cls.KIND}: missing field {f.name!r}")
            where = f"{cls.KIND}.{f.name}"
            value = _decode(data[f.name], hints[f.name], where)
            _check_range(value, f.metadata, where)
            kwargs[f.name] = value
        return cls(**kwargs)


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    """``typing.get_type_hints`` once per message class (it re-evaluates every annotation
    string on each call, which dominated decoding small frequent messages)."""
    return typing.get_type_hints(cls)


def _encode(value: Any) -> Any:
    if isinstance(value, Message):
        return value.to_wire()
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    return value


def _decode(value: Any, tp: Any, where: str) -> Any:
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _decode(value, arg, where)
            except WireError as e:
                errors.append(str(e))
        raise WireError("; ".join(errors) or f"{where}: unexpected null")
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise WireError(f"{where}: expected a list, got {type(value).__name__}")
        if len(value) > DEFAULT_MAX_ITEMS:
            raise WireError(f"{where}: list of {len(value)} items is too long")
        (item_tp,) = get_args(tp)
        return [_decode(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise WireError(f"{where}: expected a map, got {type(value).__name__}")
        key_tp, val_tp = get_args(tp)
        out = {}
        for k, v in value.items():
            if not isinstance(k, key_tp):
                raise WireError(f"{where}: key {k!r} is not {key_tp.__name__}")
            out[k] = _decode(v, val_tp, f"{where}[{k!r}]")
        return out
    if isinstance(tp, type) and issubclass(tp, Message):
        return tp.from_wire(value)
    if tp is Any:
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise WireError(f"{where}: expected a number, got {type(value).__name__}")
        value = float(value)
        if math.isnan(value):
            raise WireError(f"{where}: NaN is not allowed")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise WireError(f"{where}: expected an integer, got {type(value).__name__}")
        return value
    if tp in (str, bool, bytes):
        if not isinstance(value, tp):
            raise WireError(f"{where}: expected {tp.__name__}, got {type(value).__name__}")
        return value
    raise TypeError(f"{where}: unsupported field type {tp!r}")  # a schema bug, not bad input


def _check_range(value: Any, meta: Any, where: str) -> None:
    if not meta or value is None:
        return
    lo, hi, max_items = meta.get("min"), meta.get("max"), meta.get("max_items")
    if max_items is not None and hasattr(value, "__len__") and len(value) > max_items:
        raise WireError(f"{where}: {len(value)} items exceeds the limit of {max_items}")
    if isinstance(value, (int, float)):
        if lo is not None and value < lo:
            raise WireError(f"{where}: {value} is below the minimum {lo}")
        if hi is not None and value > hi:
            raise WireError(f"{where}: {value} is above the maximum {hi}")
