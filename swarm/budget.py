"""Decode budgets: what one frame may cost *before* msgpack builds a single Python object.

A frame's byte cap does not bound what decoding it costs: one msgpack byte (``0x80``) is an
empty map, a 64-byte Python dict plus an 8-byte slot, so 60 MiB of it decode to gigabytes, and a
2 KB zstd body inflates to those 60 MiB. A :class:`Budget` bounds a frame in the units that
matter, and :func:`scan` checks the msgpack bytes against it with a small iterative walk over
type bytes and lengths (no objects built), so :func:`swarm.framing.decode_body` can reject a
frame before ``msgpack.unpackb`` runs.

Budgets are derived from the message classes (:func:`budget_for`): every field's type and bounds
(``swarm.wire``: ``max_items`` of lists, dicts, strings and bytes; ``max_len`` of the strings and
bytes inside them; the defaults :data:`swarm.wire.DEFAULT_MAX_ITEMS` ... for fields that say
nothing), plus the allowance for unknown fields of a newer peer (:data:`swarm.wire.MAX_UNKNOWN_FIELDS`
per map, values bounded together by :data:`swarm.wire.ANY_LIMITS`). A recursive type (a broadcast
``Subtree``) is unrolled :data:`RECURSION_LEVELS` levels. Whatever the schema allows is then
clamped by :data:`CAPS` (and the frame's byte cap): a ``Hello`` decodes to at most a few thousand
objects, a rollout push or a chunk reply to what its schema allows up to the caps.

Memory: each msgpack value is costed with :data:`COST` (CPython 3.12 sizes, rounded up:
containers, their slots, ints, floats, strings at 4 bytes a character, bytes), and the sum is
bounded by ``Budget.max_memory``. ``bytes`` values are costed by their header only: their
contents are the frame's own bytes, already capped, so the decoded objects of an accepted frame
take at most ``max_memory`` plus the frame's length (the test ``tests/swarm/test_wire_budget.py`` checks the model against
``tracemalloc`` on attack shapes).
"""

from __future__ import annotations

import dataclasses
import struct
import types
import typing
from dataclasses import dataclass
from typing import Any, get_args, get_origin

from swarm.errors import MAX_ERROR_CHARS, FrameError


class BudgetExceeded(FrameError):
    """A frame whose msgpack would cost more than its budget allows (rejected unbuilt)."""


class TruncatedBody(FrameError):
    """msgpack bytes that end inside a value (a prefix of a longer body does too)."""


def scan_prefix(data: bytes, budget: Budget) -> None:
    """Check the first bytes of a body that is still being inflated: raise as :func:`scan`
    would, except that running out of bytes is fine. Lets a bomb be refused after its first
    megabyte instead of after its whole inflation."""
    try:
        scan(data, budget)
    except TruncatedBody:
        pass


@dataclass(frozen=True)
class Budget:
    """Upper bounds on one decoded frame. Lengths in bytes (strings: UTF-8 bytes) or items."""

    #: msgpack bytes (after decompression).
    max_bytes: int
    #: msgpack values, containers and scalars alike (a map entry is two: key and value).
    max_objects: int
    #: maps + arrays.
    max_containers: int
    #: Nesting depth (a scalar at top level is depth 0, a map of scalars 1).
    max_depth: int
    max_str: int
    max_bin: int
    #: Elements of one array / entries of one map.
    max_array: int
    max_map: int
    #: Estimated Python memory of the decoded objects (see :data:`COST`), bytes.
    max_memory: int

    def clamp(self, other: "Budget") -> "Budget":
        """Field-wise minimum of two budgets."""
        return Budget(*(min(a, b) for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))

    def with_max_bytes(self, max_bytes: int) -> "Budget":
        """This budget under a frame cap of ``max_bytes`` (its strings and bytes too)."""
        big = 1 << 62
        return self.clamp(Budget(max_bytes, big, big, big, max_bytes, max_bytes, big, big, big))


#: Estimated CPython memory (bytes) per decoded value; rounded up from ``sys.getsizeof``
#: on CPython 3.12 (dict: 64 empty, about 26-48 per entry; list: 56 + 8 per slot, 64 as tracemalloc sees it; str: 49 +
#: 1..4 per character; bytes: 33 + 1 per byte; int 28-36; float 24). Small ints (fixints
#: 0..127), None, True, False and the empty string are shared objects and cost nothing beyond
#: their slot.
COST = {"map": 184, "map_entry": 72, "array": 64, "slot": 8, "int": 36, "float": 24,
        "str": 80, "str_byte": 4, "bin": 40}

#: Frame-wide caps applied to every budget (whatever a schema allows).
CAPS = Budget(max_bytes=256 * 1024 * 1024, max_objects=2_000_000, max_containers=250_000, max_depth=48,
              max_str=1 << 20, max_bin=256 * 1024 * 1024, max_array=2_000_000, max_map=200_000,
              max_memory=128 * 1024 * 1024)
#: A recursive message type is unrolled this many levels when its budget is derived.
RECURSION_LEVELS = 12


# ---------------------------------------------------------------------------- the pre-scan

_U16 = struct.Struct(">H").unpack_from
_U32 = struct.Struct(">I").unpack_from
#: Type bytes whose value is a fixed-size scalar: type byte -> (bytes after it, memory cost).
_FIXED: dict[int, tuple[int, int]] = {
    0xC0: (0, 0), 0xC2: (0, 0), 0xC3: (0, 0),  # nil, false, true
    0xCA: (4, COST["float"]), 0xCB: (8, COST["float"]),  # float32, float64
    0xCC: (1, COST["int"]), 0xCD: (2, COST["int"]), 0xCE: (4, COST["int"]), 0xCF: (8, COST["int"]),
    0xD0: (1, COST["int"]), 0xD1: (2, COST["int"]), 0xD2: (4, COST["int"]), 0xD3: (8, COST["int"]),
}


def _number_run(data: bytes, i: int, ln: int, n: int) -> tuple[int, int, int]:
    """Skip the leading numbers (at most ``ln``) of an array's items starting at ``data[i]``:
    ``(next index, numbers skipped, their memory)``. Arrays of one number type are checked
    with one strided slice; mixed ones (small and large token ids) item by item."""
    c_int, c_float = COST["int"], COST["float"]
    end = i + 9 * ln
    if end <= n and data[i:end:9].count(0xCB) == ln:
        return end, ln, c_float * ln
    end = i + 3 * ln
    if end <= n and data[i:end:3].count(0xCD) == ln:
        return end, ln, c_int * ln
    end = i + ln
    if end <= n and data[i:end].isascii():
        return end, ln, 0
    k = cost = 0
    while k < ln and i < n:
        b = data[i]
        if b <= 0x7F:
            i += 1
        elif b == 0xCD:
            i += 3
            cost += c_int
        elif b == 0xCB:
            i += 9
            cost += c_float
        elif b == 0xCC:
            i += 2
            cost += c_int
        elif b == 0xCE:
            i += 5
            cost += c_int
        else:
            break
        k += 1
    return i, k, cost


def scan(data: bytes, budget: Budget) -> int:
    """Walk the msgpack value in ``data`` against ``budget`` without building it.

    Returns the estimated memory of the decoded objects. Raises :class:`BudgetExceeded` when any
    bound is passed (as soon as it is: the walk never costs more than the budget allows) and
    :class:`FrameError` for bytes that are not exactly one msgpack value (truncated, trailing
    bytes, reserved or extension types). Strings are not checked for UTF-8 here (``unpackb``
    does that).
    """
    n = len(data)
    if n > budget.max_bytes:
        raise BudgetExceeded(f"{n} msgpack bytes exceed the budget of {budget.max_bytes}")
    max_objects, max_depth = budget.max_objects, budget.max_depth
    max_str, max_bin, max_array, max_map = budget.max_str, budget.max_bin, budget.max_array, budget.max_map
    max_containers, max_memory = budget.max_containers, budget.max_memory
    c_map, c_entry, c_array, c_slot = COST["map"], COST["map_entry"], COST["array"], COST["slot"]
    c_str, c_str_byte, c_bin, c_int = COST["str"], COST["str_byte"], COST["bin"], COST["int"]
    fixed = _FIXED
    i = 0
    objects = containers = memory = 0
    # remaining values of each open container, innermost last; a map counts keys and values
    stack: list[int] = []
    remaining = 1  # the top-level value
    while True:
        if i >= n:
            raise TruncatedBody("truncated msgpack body")
        b = data[i]
        i += 1
        objects += 1
        if b <= 0x7F:  # positive fixint: a shared small int
            pass
        elif b >= 0xE0:  # negative fixint
            memory += c_int
        elif 0xA0 <= b <= 0xBF or b in (0xD9, 0xDA, 0xDB):  # str
            if b <= 0xBF:
                ln = b & 0x1F
            elif b == 0xD9:
                if i + 1 > n:
                    raise TruncatedBody("truncated msgpack body")
                ln = data[i]
                i += 1
            elif b == 0xDA:
                if i + 2 > n:
                    raise TruncatedBody("truncated msgpack body")
                ln = _U16(data, i)[0]
                i += 2
            else:
                if i + 4 > n:
                    raise TruncatedBody("truncated msgpack body")
                ln = _U32(data, i)[0]
                i += 4
            if ln > max_str:
                raise BudgetExceeded(f"string of {ln} bytes exceeds the budget of {max_str}")
            i += ln
            if ln:
                memory += c_str + c_str_byte * ln
        elif b in fixed:
            extra, cost = fixed[b]
            i += extra
            memory += cost
        elif 0x80 <= b <= 0x9F or b in (0xDC, 0xDD, 0xDE, 0xDF):  # map / array
            if b <= 0x8F:
                ln, is_map = b & 0x0F, True
            elif b <= 0x9F:
                ln, is_map = b & 0x0F, False
            else:
                width = 2 if b in (0xDC, 0xDE) else 4
                if i + width > n:
                    raise TruncatedBody("truncated msgpack body")
                ln = _U16(data, i)[0] if width == 2 else _U32(data, i)[0]
                i += width
                is_map = b >= 0xDE
            containers += 1
            if containers > max_containers:
                raise BudgetExceeded(f"more than {max_containers} maps/arrays")
            if is_map:
                if ln > max_map:
                    raise BudgetExceeded(f"map of {ln} entries exceeds the budget of {max_map}")
                memory += c_map + c_entry * ln
                ln *= 2
            else:
                if ln > max_array:
                    raise BudgetExceeded(f"array of {ln} items exceeds the budget of {max_array}")
                memory += c_array + c_slot * ln
                if ln >= 8:  # token ids, log-probs: skip a leading run of numbers at C speed
                    i, run, cost = _number_run(data, i, ln, n)
                    objects += run
                    memory += cost
                    ln -= run
            if ln > n - i:  # every value takes at least one byte: no allocation for a lie
                raise TruncatedBody("truncated msgpack body")
            if ln:
                stack.append(remaining)
                if len(stack) > max_depth:
                    raise BudgetExceeded(f"nesting deeper than {max_depth}")
                remaining = ln + 1  # decremented below for the value just read
        elif b in (0xC4, 0xC5, 0xC6):  # bin
            width = 1 if b == 0xC4 else 2 if b == 0xC5 else 4
            if i + width > n:
                raise TruncatedBody("truncated msgpack body")
            ln = data[i] if width == 1 else _U16(data, i)[0] if width == 2 else _U32(data, i)[0]
            i += width
            if ln > max_bin:
                raise BudgetExceeded(f"bytes of {ln} exceed the budget of {max_bin}")
            i += ln
            memory += c_bin  # its bytes are the frame's own bytes (no amplification): not counted
        else:  # 0xC1 (never used), ext and fixext types
            raise FrameError(f"msgpack type 0x{b:02x} is not allowed")
        if objects > max_objects:
            raise BudgetExceeded(f"more than {max_objects} msgpack values")
        if memory > max_memory:
            raise BudgetExceeded(f"decoded objects would take over {max_memory} bytes")
        remaining -= 1
        while remaining == 0:
            if not stack:
                if i != n:
                    if i > n:
                        raise TruncatedBody("truncated msgpack body")
                    raise FrameError(f"{n - i} bytes after the msgpack value")
                return memory
            remaining = stack.pop() - 1
        # scalars were skipped by length; a length past the end shows up at the next read


# ---------------------------------------------------------------------------- schema budgets


@dataclass(frozen=True)
class _Need:
    """Upper bounds of one value of a schema type (the same units as :class:`Budget`)."""

    bytes: int
    objects: int
    containers: int
    depth: int
    str: int = 0
    bin: int = 0
    array: int = 0
    map: int = 0
    memory: int = 0

    def times(self, k: int) -> "_Need":
        return dataclasses.replace(self, bytes=self.bytes * k, objects=self.objects * k,
                                   containers=self.containers * k, memory=self.memory * k)

    def plus(self, o: "_Need") -> "_Need":
        """Both values (sizes add, per-item maxima take the larger)."""
        return _Need(self.bytes + o.bytes, self.objects + o.objects, self.containers + o.containers,
                     max(self.depth, o.depth), max(self.str, o.str), max(self.bin, o.bin),
                     max(self.array, o.array), max(self.map, o.map), self.memory + o.memory)

    def either(self, o: "_Need") -> "_Need":
        """One of the two values (every bound the larger)."""
        return _Need(*(max(a, b) for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(o))))


_HEAD = 5  # largest msgpack header (type byte + 32-bit length)


def _str_need(n_bytes: int) -> _Need:
    return _Need(_HEAD + n_bytes, 1, 0, 0, str=n_bytes, memory=COST["str"] + COST["str_byte"] * n_bytes)


def _bin_need(n_bytes: int) -> _Need:
    return _Need(_HEAD + n_bytes, 1, 0, 0, bin=n_bytes, memory=COST["bin"])


_SCALAR = _Need(9, 1, 0, 0, memory=COST["int"])


def _list_need(item: _Need, n: int) -> _Need:
    return dataclasses.replace(item.times(n), bytes=_HEAD + item.bytes * n, objects=1 + item.objects * n,
                               containers=1 + item.containers * n, depth=1 + item.depth,
                               array=max(item.array, n),
                               memory=COST["array"] + (COST["slot"] + item.memory) * n)


def _map_need(entries: _Need, n: int, extra_bytes: int = 0, extra_objects: int = 0) -> _Need:
    """A map of ``n`` entries whose keys and values together need at most ``entries``."""
    return dataclasses.replace(entries, bytes=_HEAD + entries.bytes + extra_bytes,
                               objects=1 + entries.objects + extra_objects,
                               containers=1 + entries.containers, depth=1 + entries.depth, map=max(entries.map, n),
                               memory=COST["map"] + COST["map_entry"] * n + entries.memory)


def _any_need() -> _Need:
    """A value of type ``Any`` (or of an unknown field): bounded by ``swarm.wire.ANY_LIMITS``."""
    from swarm.wire import ANY_LIMITS

    lim = ANY_LIMITS
    return _Need(bytes=lim["bytes"] + _HEAD * lim["objects"], objects=lim["objects"], containers=lim["objects"],
                 depth=lim["depth"], str=4 * lim["bytes"], bin=lim["bytes"], array=lim["objects"], map=lim["objects"],
                 memory=lim["objects"] * (COST["map"] + COST["map_entry"]) + 4 * lim["bytes"])


def _type_need(tp: Any, meta: Any, stack: tuple[type, ...]) -> _Need:
    from swarm import wire

    meta = meta or {}
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        needs = [_type_need(a, meta, stack) for a in get_args(tp) if a is not type(None)]
        out = _Need(1, 1, 0, 0)
        for need in needs:
            out = out.either(need)
        return out
    if origin is list:
        (item_tp,) = get_args(tp)
        n = wire.max_items_of(meta, list)
        return _list_need(_type_need(item_tp, {"max_len": meta.get("max_len")}, stack), n)
    if origin is dict:
        _, val_tp = get_args(tp)
        n = wire.max_items_of(meta, dict)
        entry = _str_need(4 * wire.MAX_KEY_CHARS).plus(_type_need(val_tp, {"max_len": meta.get("max_len")}, stack))
        return _map_need(entry.times(n), n)
    if isinstance(tp, type) and issubclass(tp, wire.Message):
        return message_need(tp, stack)
    if tp is Any:
        return _any_need()
    if tp is str:
        return _str_need(4 * wire.max_len_of(meta, str))
    if tp is bytes:
        return _bin_need(wire.max_len_of(meta, bytes))
    if tp in (int, float, bool):
        return _SCALAR
    raise TypeError(f"no budget for field type {tp!r}")


def message_need(cls: type, stack: tuple[type, ...] = ()) -> _Need:
    """Upper bounds of one ``cls`` message on the wire, unknown fields included."""
    from swarm import wire

    if stack.count(cls) >= RECURSION_LEVELS:  # a recursive type, unrolled far enough
        return _Need(1, 1, 0, 0)
    stack = stack + (cls,)
    hints = wire._type_hints(cls)
    entries = _Need(0, 0, 0, 0)
    fields = dataclasses.fields(cls)
    for f in fields:
        entries = entries.plus(_str_need(len(f.name.encode()))).plus(_type_need(hints[f.name], f.metadata, stack))
    unknown = _str_need(4 * wire.MAX_KEY_CHARS).times(wire.MAX_UNKNOWN_FIELDS).plus(_any_need())
    return _map_need(entries.plus(unknown), len(fields) + wire.MAX_UNKNOWN_FIELDS)


def _to_budget(need: _Need) -> Budget:
    return Budget(max_bytes=need.bytes, max_objects=need.objects, max_containers=need.containers,
                  max_depth=need.depth, max_str=need.str, max_bin=need.bin, max_array=need.array,
                  max_map=need.map, max_memory=need.memory).clamp(CAPS)


#: Budgets computed so far: (frame kind, message class) -> budget (a class's never changes).
_BUDGETS: dict[tuple[str, type], Budget] = {}


def budget_for(cls: type) -> Budget:
    """The decode budget of a frame holding one ``cls`` message (its wire dict)."""
    budget = _BUDGETS.get(("message", cls))
    if budget is None:
        budget = _BUDGETS[("message", cls)] = _to_budget(message_need(cls))
    return budget


def envelope_budget(cls: type) -> Budget:
    """The decode budget of a reply envelope: ``{"ok": bool, "body": cls, "error": str}``
    (plus unknown fields)."""
    budget = _BUDGETS.get(("envelope", cls))
    if budget is None:
        budget = _BUDGETS[("envelope", cls)] = _envelope_budget(cls)
    return budget


def _envelope_budget(cls: type) -> Budget:
    from swarm import wire

    body = message_need(cls)
    entries = (_str_need(2).plus(_SCALAR).plus(_str_need(4)).plus(body).plus(_str_need(5))
               .plus(_str_need(4 * MAX_ERROR_CHARS)))
    unknown = _str_need(4 * wire.MAX_KEY_CHARS).times(wire.MAX_UNKNOWN_FIELDS).plus(_any_need())
    return _to_budget(_map_need(entries.plus(unknown), 3 + wire.MAX_UNKNOWN_FIELDS))


#: The budget of a frame read with no schema (a generic value under the caps).
GENERIC = CAPS
