"""Typed configuration helpers: dataclasses loaded from TOML with dotted CLI overrides.

Every config section is a dataclass whose fields carry a ``#:`` comment explaining them.
``load_config(cls, path, overrides)`` reads a TOML file (unknown keys are an error, so a
typo never passes silently), applies ``section.key=value`` overrides parsed as TOML
values (``train.steps=20``, ``model.name="/path/model.gguf"``) and calls the config's
``validate()`` when it has one. A config path that does not exist as given but names one of the
example configs installed with the package (``configs/arith.toml``, or just ``arith.toml``) is
read from there (:func:`installed_config`).

CLI shortcut flags (``--device DEV`` for ``--set train.device=DEV``) are declared once as
:class:`Shortcut` rows naming a field; :func:`add_shortcuts` derives each flag's type, choices
and help from the field (its annotation and its ``#:`` comment), and :func:`shortcut_overrides`
/ :func:`shortcut_values` turn the given flags back into overrides.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import re
import sysconfig
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Callable, TypeVar, get_args, get_origin

C = TypeVar("C")


class ConfigError(ValueError):
    """A config file or override that does not match the schema."""


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
    return cls(**kwargs)


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
        return dict(value)
    if origin is typing.Literal:
        if value not in get_args(tp):
            raise ConfigError(f"{where}: {value!r} is not one of {list(get_args(tp))}")
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (int, float, str, bool) and not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}")
    return value


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
    cfg = from_dict(cls, apply_overrides(data, overrides or []))
    validate = getattr(cfg, "validate", None)
    if callable(validate):
        validate()
    return cfg


def dump_toml(data: dict[str, Any]) -> str:
    """Write a nested dict of scalars/lists as TOML (enough for resolved configs)."""
    lines: list[str] = []
    scalars = {k: v for k, v in data.items() if not isinstance(v, dict)}
    for k, v in scalars.items():
        lines.append(f"{k} = {_toml_value(v)}")
    for k, v in data.items():
        if isinstance(v, dict):
            lines.append(f"\n[{k}]")
            for kk, vv in v.items():
                if vv is None:
                    continue
                lines.append(f"{kk} = {_toml_value(vv)}")
    return "\n".join(lines).lstrip() + "\n"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items() if x is not None) + "}"
    raise ConfigError(f"cannot write {type(v).__name__} to TOML")


# -- field documentation and CLI shortcuts --------------------------------------------------------
_FIELD = re.compile(r"^    (\w+)\s*:")


@functools.lru_cache(maxsize=None)
def field_docs(cls: type) -> dict[str, str]:
    """The ``#:`` comment lines right above each field of dataclass ``cls``, joined into one line."""
    docs: dict[str, str] = {}
    pending: list[str] = []
    for line in inspect.getsource(cls).splitlines()[1:]:
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


@dataclasses.dataclass(frozen=True)
class Shortcut:
    """A CLI flag that stands for ``--set <path>=VALUE`` for one or more config fields."""

    #: The flag, e.g. ``--device``.
    flag: str
    #: Dotted field path(s) the value goes to (e.g. ``train.device``, or ``("task.seed", "train.seed")``).
    paths: str | tuple[str, ...]
    #: A flag without a value that sets the field(s) to this constant (None: the flag takes a value).
    const: Any = None
    #: Further fields set to fixed values whenever the flag is given.
    also: tuple[tuple[str, Any], ...] = ()
    #: Converts the flag's text to the field's value (default: the field's type).
    parse: Callable[[str], Any] | None = None
    #: Placeholder in ``--help``.
    metavar: str | None = None
    #: ``--help`` text of a flag without a value (``const``), which says what giving it does; the
    #: field's own comment describes the field, often the opposite of a ``--no-...`` flag.
    help: str = ""

    @property
    def fields(self) -> tuple[str, ...]:
        return (self.paths,) if isinstance(self.paths, str) else tuple(self.paths)

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


def _help_text(doc: str) -> str:
    return doc.replace("``", "").replace("%", "%%")


def add_shortcuts(parser: Any, cls: type, shortcuts: tuple[Shortcut, ...]) -> None:
    """Add each shortcut to ``parser`` (a parser or an argument group): type, choices and help come
    from the field (its annotation, its ``#:`` comment and its default); not given = the config's value."""
    for sc in shortcuts:
        infos = [field_info(cls, p) for p in sc.fields]
        tp, _doc, default = infos[0]
        doc = " ".join(_help_text(d) for _, d, _ in infos if d)
        where = ", ".join(sc.fields)
        if sc.const is not None:
            if sc.help:
                said = f"{_help_text(sc.help)} "
            elif sc.const is True:  # the field's comment says what turning it on does
                said = f"{doc} "
            else:
                raise ValueError(f"{sc.flag}: a flag that sets {where} = {_toml_value(sc.const)} needs its own help text")
            parser.add_argument(sc.flag, dest=sc.dest, action="store_const", const=sc.const, default=None,
                                help=f"{said}(sets {where} = {_toml_value(sc.const)}; default {_toml_value(default)})")
            continue
        kwargs: dict[str, Any] = {"dest": sc.dest, "default": None, "metavar": sc.metavar}
        if get_origin(tp) in (typing.Union, types.UnionType):
            tp = next(a for a in get_args(tp) if a is not type(None))
        if get_origin(tp) is list:
            kwargs.update(action="append", type=get_args(tp)[0])
        elif get_origin(tp) is typing.Literal:
            choices = list(get_args(tp))
            kwargs.update(choices=choices, type=type(choices[0]))
        else:
            kwargs["type"] = tp
        if sc.parse is not None:
            kwargs["type"] = str
        shown = _toml_value(str(default) if isinstance(default, Path) else default)
        parser.add_argument(sc.flag, help=f"{doc} (sets {where}; default {_help_text(shown)})", **kwargs)


def shortcut_values(args: argparse.Namespace, shortcuts: tuple[Shortcut, ...]) -> dict[str, Any]:
    """``{field path: value}`` of the shortcut flags given on the command line."""
    out: dict[str, Any] = {}
    for sc in shortcuts:
        value = getattr(args, sc.dest, None)
        if value is None:
            continue
        if sc.parse is not None:
            try:
                value = sc.parse(value)
            except ValueError as e:
                raise ConfigError(f"{sc.flag}: {e}") from None
        for path in sc.fields:
            out[path] = value
        out.update(dict(sc.also))
    return out


def shortcut_overrides(args: argparse.Namespace, shortcuts: tuple[Shortcut, ...]) -> list[str]:
    """The given shortcut flags as ``path=value`` overrides (values written as TOML)."""
    return [f"{path}={_toml_value(str(v) if isinstance(v, Path) else v)}"
            for path, v in shortcut_values(args, shortcuts).items()]
