"""Typed configuration: frozen dataclass sections, checked when built, loaded from TOML with
dotted CLI overrides.

The one convention (``docs/config.md`` is generated from it):

- A section is a frozen dataclass deriving from :class:`Section`, declared once, in a config
  module of the lowest package that reads it; every field has a ``#:`` comment above it (its
  doc, shown by ``swarm-learner config`` / ``swarm-node config`` and in ``docs/config.md``).
- Bounds and checks sit on the field: ``fan_out: int = setting(2, ge=1)``, or
  ``check=fn`` for a value with a shape (an address, a device); rules across fields are
  :class:`Rule` rows in the section's ``rules``. All are checked whenever a section is built
  (loaded, constructed in code, or copied with :func:`dataclasses.replace`), so a bad value
  fails at load with a message naming the field, never later inside the part that reads it.
- Parts take their section whole (no second "Settings" copy of its fields); a value decided at
  run time gives a new config (``dataclasses.replace``), never an assignment.

``load_config(cls, path, overrides)`` reads a TOML file (unknown keys are an error, so a typo
never passes silently) and applies ``section.key=value`` overrides parsed as TOML values
(``train.steps=20``, ``model.name="/path/model.gguf"``). A config path that does not exist as
given but names one of the example configs installed with the package (``configs/arith.toml``,
or just ``arith.toml``) is read from there (:func:`installed_config`).

CLI flags that stand for a field are in :mod:`swarm.config_flags`; the reference printed by
the ``config`` commands is written by :mod:`swarm.config_doc`.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import re
import sysconfig
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Callable, ClassVar, TypeVar, get_args, get_origin, overload

C = TypeVar("C")
T = TypeVar("T")


class ConfigError(ValueError):
    """A config file, override or value that does not match the schema. ``field``: the dotted
    path of the field at fault (relative to the section that raised it; "" when none is)."""

    def __init__(self, message: str, field: str = "", reason: str = "") -> None:
        super().__init__(message)
        self.field, self.reason = field, reason or message

    @classmethod
    def at(cls, field: str, reason: str) -> ConfigError:
        """The error of field ``field``: ``"<field> <reason>"`` (``reason`` starts with a verb, or
        with ``":"`` for a message of its own)."""
        sep = "" if reason.startswith(":") else " "
        return cls(f"{field}{sep}{reason}", field, reason)


# -- declaring and checking sections ---------------------------------------------------------------
_BOUNDS = "echo_swarm_bounds"


@dataclasses.dataclass(frozen=True)
class Bounds:
    """What a field's value must satisfy, and how its default is shown (kept in the field's
    metadata by :func:`setting`)."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    #: Raises ``ValueError`` (its message says why) for a value of the wrong shape; for a list
    #: field it is called on each item.
    check: Callable[[Any], object] | None = None
    #: The default as the reference shows it, when its value depends on the machine (a path).
    shown: str = ""

    def problem(self, value: object) -> str | None:
        """Why ``value`` is out of bounds (``"must be >= 1, got 0"``), or None."""
        items = value if isinstance(value, (list, tuple)) else [value]
        if self.check is not None:
            for item in items:
                try:
                    self.check(item)
                except ValueError as e:
                    return f": {e}"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        if isinstance(value, float) and math.isnan(value):
            return "must be a number, got nan"
        for op, bound, ok in ((">=", self.ge, lambda b: value >= b), (">", self.gt, lambda b: value > b),
                              ("<=", self.le, lambda b: value <= b), ("<", self.lt, lambda b: value < b)):
            if bound is not None and not ok(bound):
                return f"must be {self.describe()}, got {value!r}"
        return None

    def describe(self) -> str:
        """``>= 1``, ``in [0, 1)``, ``> 0``: the bounds as a reader sees them ("" when none)."""
        lo = ("[", self.ge) if self.ge is not None else ("(", self.gt) if self.gt is not None else None
        hi = ("]", self.le) if self.le is not None else (")", self.lt) if self.lt is not None else None
        if lo and hi:
            return f"in {lo[0]}{_num(lo[1])}, {_num(hi[1])}{hi[0]}"
        if lo:
            return f"{'>=' if lo[0] == '[' else '>'} {_num(lo[1])}"
        if hi:
            return f"{'<=' if hi[0] == ']' else '<'} {_num(hi[1])}"
        return ""


def _num(x: float | None) -> str:
    return repr(x) if not (isinstance(x, float) and x.is_integer()) else repr(int(x))


@overload
def setting(default: T, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
            lt: float | None = None, check: Callable[[Any], object] | None = None, shown: str = "") -> T: ...
@overload
def setting(*, factory: Callable[[], T], ge: float | None = None, gt: float | None = None,
            le: float | None = None, lt: float | None = None, check: Callable[[Any], object] | None = None,
            shown: str = "") -> T: ...


def setting(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING, ge: float | None = None,
            gt: float | None = None, le: float | None = None, lt: float | None = None,
            check: Callable[[Any], object] | None = None, shown: str = "") -> Any:
    """A section field with its default (or ``factory``) and what its value must satisfy: bounds
    (``ge``, ``gt``, ``le``, ``lt``) and/or ``check`` (raises ``ValueError`` saying why).
    ``shown``: the default as the reference shows it, for a default that depends on the machine."""
    meta = {_BOUNDS: Bounds(ge, gt, le, lt, check, shown)}
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True)
class Rule:
    """A rule across the fields of a section: ``test(section)`` must be true, else ``field`` (the
    dotted path, relative to the section, of the field to change) is at fault: ``message``; a
    ``test`` that raises ``ValueError`` gives its own message instead."""

    field: str
    test: Callable[[Any], bool]
    message: str = ""


class Section:
    """Base of every config section (a frozen dataclass): :func:`check_section` runs whenever
    one is built, so no section with a value out of bounds exists."""

    #: Rules across this section's fields, checked after each field's own bounds.
    rules: ClassVar[tuple[Rule, ...]] = ()

    def __post_init__(self) -> None:
        check_section(self)


def bounds_of(f: dataclasses.Field) -> Bounds | None:
    return f.metadata.get(_BOUNDS)


_CHOICES: dict[type, dict[str, tuple[object, ...]]] = {}


def _choices(cls: type) -> dict[str, tuple[object, ...]]:
    """The ``Literal[...]`` fields of dataclass ``cls``: name -> allowed values (read once per class)."""
    if cls not in _CHOICES:
        hints = typing.get_type_hints(cls)
        _CHOICES[cls] = {f.name: get_args(hints[f.name]) for f in dataclasses.fields(cls)
                         if get_origin(hints[f.name]) is typing.Literal}
    return _CHOICES[cls]


def check_section(section: object) -> None:
    """Raise :class:`ConfigError` naming the first field out of bounds (or not one of its
    ``Literal`` choices) or the first broken rule."""
    choices = _choices(type(section))
    for f in dataclasses.fields(section):  # type: ignore[arg-type]
        value = getattr(section, f.name)
        if f.name in choices and value not in choices[f.name]:
            raise ConfigError.at(f.name, f"must be one of {', '.join(map(str, choices[f.name]))}, got {value!r}")
        b = bounds_of(f)
        why = b.problem(value) if b is not None else None
        if why:
            raise ConfigError.at(f.name, why)
    for rule in type(section).rules if isinstance(section, Section) else ():
        try:
            ok = rule.test(section)
        except ValueError as e:
            raise ConfigError.at(rule.field, f": {e}") from None
        if not ok:
            raise ConfigError.at(rule.field, rule.message)


# -- loading -----------------------------------------------------------------------------------------
def from_dict(cls: type[C], data: dict[str, Any], where: str = "") -> C:
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a table, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{where or 'config'}: unknown key(s) {unknown}; known: {sorted(names)}")
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = _coerce(value, hints[name], f"{where}.{name}" if where else name)
    try:
        return cls(**kwargs)
    except ConfigError as e:  # a bound or rule of this section (nested ones are named already)
        if not e.field:
            raise
        raise ConfigError.at(f"{where}.{e.field}" if where else e.field, e.reason) from None


def _coerce(value: Any, tp: Any, where: str) -> Any:
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where)
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        args = [a for a in get_args(tp) if a is not type(None)]
        return _coerce(value, args[0], where)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list")
        (item,) = get_args(tp)
        return [_coerce(v, item, where) for v in value]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table")
        _, item = get_args(tp) or (str, Any)
        return {k: _coerce(v, item, f"{where}.{k}") for k, v in value.items()}
    if origin is typing.Literal:
        if value not in get_args(tp):
            raise ConfigError(f"{where}: {value!r} is not one of {list(get_args(tp))}")
        return value
    if tp is Path and isinstance(value, str):
        return Path(value)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (int, float, str, bool) and not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}")
    return value


def with_values(cfg: C, changes: dict[str, Any]) -> C:
    """A copy of ``cfg`` with the fields at dotted paths set (``{"train.steps": 3}``): each section
    on the way is rebuilt with :func:`dataclasses.replace` (and so checked); ``cfg`` is unchanged."""
    top: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for path, value in changes.items():
        head, _, rest = path.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            top[head] = value
    for head, sub in nested.items():
        top[head] = with_values(getattr(cfg, head), sub)
    return dataclasses.replace(cfg, **top)  # type: ignore[type-var]


def to_dict(cfg: Any) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(cfg).items() if v is not None}


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b=value`` overrides (value parsed as TOML, bare words as strings)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key=value")
        key, raw = item.split("=", 1)
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        node = data
        parts = key.strip().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {p} is not a table")
        node[parts[-1]] = value
    return data


#: Where the wheel installs the example configs (``pyproject.toml``'s data-files), under the prefix.
INSTALLED_CONFIGS = ("share", "echo-swarm", "configs")


def installed_config(path: Path | str) -> Path:
    """``path`` when it exists; else, when it is a bare file name or ``configs/NAME``, the copy of
    that example config installed with the package (``<prefix>/share/echo-swarm/configs/NAME``)
    if there is one; else ``path`` unchanged (the caller reports it missing)."""
    path = Path(path)
    bare = len(path.parts) == 1 or (len(path.parts) == 2 and path.parts[0] == "configs")
    if path.exists() or path.is_absolute() or not bare:
        return path
    installed = Path(sysconfig.get_path("data")).joinpath(*INSTALLED_CONFIGS, path.name)
    return installed if installed.is_file() else path


def load_config(cls: type[C], path: Path | None = None, overrides: list[str] | None = None) -> C:
    data: dict[str, Any] = {}
    if path is not None:
        path = installed_config(path)
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: invalid TOML: {e}") from None
    return from_dict(cls, apply_overrides(data, overrides or []))


def dump_toml(data: dict[str, Any]) -> str:
    """Write a nested dict of scalars/lists as TOML (enough for resolved configs)."""
    lines: list[str] = []
    scalars = {k: v for k, v in data.items() if not isinstance(v, dict)}
    for k, v in scalars.items():
        lines.append(f"{k} = {toml_value(v)}")
    for k, v in data.items():
        if isinstance(v, dict):
            lines.append(f"\n[{k}]")
            for kk, vv in v.items():
                if vv is None:
                    continue
                lines.append(f"{kk} = {toml_value(vv)}")
    return "\n".join(lines).lstrip() + "\n"


def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, Path):
        return toml_value(str(v))
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items() if x is not None) + "}"
    raise ConfigError(f"cannot write {type(v).__name__} to TOML")


# -- field documentation ------------------------------------------------------------------------------
_FIELD = re.compile(r"^    (\w+)\s*:")


@functools.lru_cache(maxsize=None)
def field_docs(cls: type) -> dict[str, str]:
    """The ``#:`` comment lines right above each field of dataclass ``cls`` (or of the base class
    that declares it), joined into one line."""
    docs: dict[str, str] = {}
    for owner in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(owner) or owner is object:
            continue
        pending: list[str] = []
        for line in inspect.getsource(owner).splitlines()[1:]:
            text = line.strip()
            if text.startswith("#:"):
                pending.append(text[2:].strip())
                continue
            m = _FIELD.match(line)
            if m and pending:
                docs[m.group(1)] = " ".join(pending)
            pending = []
    return docs


def field_info(cls: type, path: str) -> tuple[Any, str, Any]:
    """(type, ``#:`` doc, default) of the field at dotted ``path`` of dataclass ``cls``."""
    owner, parts = cls, path.split(".")
    for i, name in enumerate(parts):
        fields = {f.name: f for f in dataclasses.fields(owner)}
        if name not in fields:
            raise KeyError(f"{path}: {owner.__name__} has no field {name!r}")
        tp = typing.get_type_hints(owner)[name]
        if i < len(parts) - 1:
            owner = tp
            continue
        f = fields[name]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        return tp, field_docs(owner).get(name, ""), default
    raise KeyError(path)
