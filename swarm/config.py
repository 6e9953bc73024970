"""Typed configuration helpers: dataclasses loaded from TOML with dotted CLI overrides.

Every config section is a dataclass whose fields carry a ``#:`` comment explaining them.
``load_config(cls, path, overrides)`` reads a TOML file (unknown keys are an error, so a
typo never passes silently) and applies ``section.key=value`` overrides parsed as TOML
values (``train.steps=20``, ``model.name="/path/model.gguf"``).
"""

from __future__ import annotations

import dataclasses
import tomllib
import typing
from pathlib import Path
from typing import Any, TypeVar, get_args, get_origin

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
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where)
    origin = get_origin(tp)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType")):
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


def load_config(cls: type[C], path: Path | None = None, overrides: list[str] | None = None) -> C:
    data: dict[str, Any] = {}
    if path is not None:
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
