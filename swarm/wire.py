"""Typed wire messages: dataclasses that validate themselves on arrival.

A message is a frozen-ish dataclass deriving from :class:`Message`. ``to_wire`` turns it
into plain msgpack-able values; ``from_wire`` checks every declared field's type (and the
ranges a field declares with ``field(metadata={"min": .., "max": ..})``), ignores unknown
fields sent by newer peers, and raises :class:`WireError` on anything missing or wrong.

Supported field types: ``int``, ``float``, ``str``, ``bool``, ``bytes``, ``list[T]``,
``dict[str, T]``, ``T | None``, ``Any`` and nested ``Message`` subclasses.

Every field is bounded, so every message has a finite decode budget (``swarm.budget``):

- ``max_items`` (``bounded(max_items=..)``): length of a list or dict field, or of a ``str``
  (characters) / ``bytes`` field; defaults :data:`DEFAULT_MAX_ITEMS`, :data:`DEFAULT_MAX_DICT`,
  :data:`DEFAULT_MAX_STR`, :data:`DEFAULT_MAX_BYTES`;
- ``max_len``: length of every string / bytes value *inside* a list or dict field (defaults as
  above); dict keys are strings of at most :data:`MAX_KEY_CHARS` characters;
- floats must be finite (no NaN, no infinity);
- ``Any`` values and the values of unknown fields are bounded by :data:`ANY_LIMITS`, and a map
  carries at most :data:`MAX_UNKNOWN_FIELDS` fields its schema does not name.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any, ClassVar, TypeVar, get_args, get_origin

M = TypeVar("M", bound="Message")

#: Longest list accepted in any field (or nested list) unless the field says otherwise.
DEFAULT_MAX_ITEMS = 65_536
#: Most entries of a dict field unless the field says otherwise.
DEFAULT_MAX_DICT = 1024
#: Longest string (characters) unless the field says otherwise.
DEFAULT_MAX_STR = 1024
#: Longest bytes value unless the field says otherwise (the default frame cap).
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
#: Longest dict key / unknown field name (characters).
MAX_KEY_CHARS = 256
#: Most fields of one map that its schema does not name (tolerated, from newer peers).
MAX_UNKNOWN_FIELDS = 8
#: Bounds on one ``Any`` value, and on all unknown fields' values of one map together:
#: values (containers and scalars), nesting depth below the value, and string/bytes bytes.
ANY_LIMITS = {"objects": 256, "depth": 3, "bytes": 16 * 1024}


class WireError(ValueError):
    """A message that does not match its schema (missing field, wrong type, out of range)."""


def bounded(min: float | None = None, max: float | None = None, max_items: int | None = None,
            max_len: int | None = None) -> Any:
    """Field metadata for range checks: ``x: int = bounded(min=0)`` (required field).
    ``max_items``: length of the list / dict / str / bytes; ``max_len``: of each string or bytes
    value inside a list or dict."""
    meta = {"min": min, "max": max, "max_items": max_items, "max_len": max_len}
    return dataclasses.field(metadata=meta)


def bounded_default(default: Any, min: float | None = None, max: float | None = None,
                    max_items: int | None = None, max_len: int | None = None) -> Any:
    """Like :func:`bounded` but with a default value (optional on the wire); a list or dict
    default is copied for each instance."""
    meta = {"min": min, "max": max, "max_items": max_items, "max_len": max_len}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def max_items_of(meta: Any, kind: type) -> int:
    """Most items of a ``kind`` (list or dict) field with metadata ``meta``."""
    n = (meta or {}).get("max_items")
    return n if n is not None else (DEFAULT_MAX_ITEMS if kind is list else DEFAULT_MAX_DICT)


def max_len_of(meta: Any, kind: type) -> int:
    """Longest ``kind`` (str: characters, bytes) value of a field with metadata ``meta``: its
    ``max_len``, else (a str / bytes field itself) its ``max_items``, else the default."""
    meta = meta or {}
    n = meta.get("max_len")
    if n is None:
        n = meta.get("max_items")
    return n if n is not None else (DEFAULT_MAX_STR if kind is str else DEFAULT_MAX_BYTES)


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
        # mypy takes a dataclass type for an unhashable value (its instances are): it is hashable
        hints = _type_hints(cls)  # type: ignore[arg-type]
        fields = _fields(cls)  # type: ignore[arg-type]
        kwargs: dict[str, Any] = {}
        for f in fields:
            if f.name not in data:
                if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
                    continue
                raise WireError(f"{cls.KIND}: missing field {f.name!r}")
            where = f"{cls.KIND}.{f.name}"
            value = _decode(data[f.name], hints[f.name], where, f.metadata)
            _check_range(value, f.metadata, where)
            kwargs[f.name] = value
        if len(data) > len(kwargs):
            _check_unknown(data, _field_names(cls), cls.KIND)  # type: ignore[arg-type]
        return cls(**kwargs)


@functools.cache
def _fields(cls: type) -> tuple[dataclasses.Field, ...]:
    return dataclasses.fields(cls)


@functools.cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def _check_unknown(data: dict, known: frozenset[str], kind: str) -> None:
    """Unknown fields (a newer peer's) are ignored, but bounded: at most
    :data:`MAX_UNKNOWN_FIELDS`, names of at most :data:`MAX_KEY_CHARS`, values within
    :data:`ANY_LIMITS` together."""
    unknown = [k for k in data if k not in known]
    if len(unknown) > MAX_UNKNOWN_FIELDS:
        raise WireError(f"{kind}: {len(unknown)} unknown fields exceed the limit of {MAX_UNKNOWN_FIELDS}")
    for k in unknown:
        if not isinstance(k, str) or len(k) > MAX_KEY_CHARS:
            raise WireError(f"{kind}: unknown field name {str(k)[:40]!r} is not a short string")
    _check_any([data[k] for k in unknown], f"{kind}.<unknown fields>", extra_depth=1)


def _check_any(value: Any, where: str, extra_depth: int = 0) -> None:
    """Raise unless ``value`` is within :data:`ANY_LIMITS` (and holds finite floats only)."""
    lim = ANY_LIMITS
    objects = size = 0
    todo = [(value, 0)]
    while todo:
        v, depth = todo.pop()
        objects += 1
        if objects > lim["objects"] + extra_depth:
            raise WireError(f"{where}: more than {lim['objects']} values")
        if depth > lim["depth"] + extra_depth:
            raise WireError(f"{where}: nested deeper than {lim['depth']}")
        if isinstance(v, (str, bytes)):
            size += len(v)
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise WireError(f"{where}: non-finite number")
        elif isinstance(v, dict):
            for k, x in v.items():
                todo.append((k, depth + 1))
                todo.append((x, depth + 1))
        elif isinstance(v, (list, tuple)):
            todo.extend((x, depth + 1) for x in v)
        if size > lim["bytes"]:
            raise WireError(f"{where}: more than {lim['bytes']} bytes of strings")


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


def _fast_list(value: list | tuple, item_tp: Any, max_len: int) -> bool:
    """Whether ``value`` is a valid list of plain ``item_tp`` scalars (the common case, checked
    without a per-item call); ``False`` sends it through the item-by-item path for the error."""
    if item_tp is int:
        return all(type(v) is int for v in value)
    if item_tp is float:
        return all(type(v) is float for v in value) and all(map(math.isfinite, value))
    if item_tp is str:
        return all(type(v) is str and len(v) <= max_len for v in value)
    if item_tp is bytes:
        return all(type(v) is bytes and len(v) <= max_len for v in value)
    return False


def _decode(value: Any, tp: Any, where: str, meta: Any = None) -> Any:
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
                return _decode(value, arg, where, meta)
            except WireError as e:
                errors.append(str(e))
        raise WireError("; ".join(errors) or f"{where}: unexpected null")
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise WireError(f"{where}: expected a list, got {type(value).__name__}")
        limit = max_items_of(meta, list)
        if len(value) > limit:
            raise WireError(f"{where}: list of {len(value)} items exceeds the limit of {limit}")
        (item_tp,) = get_args(tp)
        inner = {"max_len": (meta or {}).get("max_len")}
        if item_tp in (int, float, str, bytes) and _fast_list(value, item_tp, max_len_of(inner, item_tp)):
            return list(value)
        return [_decode(v, item_tp, f"{where}[{i}]", inner) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise WireError(f"{where}: expected a map, got {type(value).__name__}")
        limit = max_items_of(meta, dict)
        if len(value) > limit:
            raise WireError(f"{where}: map of {len(value)} entries exceeds the limit of {limit}")
        key_tp, val_tp = get_args(tp)
        inner = {"max_len": (meta or {}).get("max_len")}
        out = {}
        for k, v in value.items():
            if not isinstance(k, key_tp):
                raise WireError(f"{where}: key {str(k)[:40]!r} is not {key_tp.__name__}")
            if len(k) > MAX_KEY_CHARS:
                raise WireError(f"{where}: key of {len(k)} characters exceeds {MAX_KEY_CHARS}")
            out[k] = _decode(v, val_tp, f"{where}[{k!r}]", inner)
        return out
    if isinstance(tp, type) and issubclass(tp, Message):
        return tp.from_wire(value)
    if tp is Any:
        _check_any(value, where)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise WireError(f"{where}: expected a number, got {type(value).__name__}")
        try:
            value = float(value)
        except OverflowError as e:  # an int beyond float's range
            raise WireError(f"{where}: {e}") from e
        if not math.isfinite(value):
            raise WireError(f"{where}: {value} is not allowed (numbers must be finite)")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise WireError(f"{where}: expected an integer, got {type(value).__name__}")
        return value
    if tp in (str, bytes):
        if not isinstance(value, tp):
            raise WireError(f"{where}: expected {tp.__name__}, got {type(value).__name__}")
        limit = max_len_of(meta, tp)
        if len(value) > limit:
            raise WireError(f"{where}: {tp.__name__} of length {len(value)} exceeds the limit of {limit}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise WireError(f"{where}: expected bool, got {type(value).__name__}")
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
