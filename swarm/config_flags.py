"""CLI shortcut flags: ``--device DEV`` for ``--set train.device=DEV``.

They are declared once as :class:`Shortcut` rows naming a field; :func:`add_shortcuts` derives
each flag's type, choices and help from the field (its annotation and its ``#:`` comment), and
:func:`shortcut_overrides` / :func:`shortcut_values` turn the given flags back into overrides.
:func:`flag_error` words a config error in terms of the flag that set the field.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Callable, get_args, get_origin

from swarm.config import ConfigError, field_info, toml_value


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
                raise ValueError(f"{sc.flag}: a flag that sets {where} = {toml_value(sc.const)} needs its own help text")
            parser.add_argument(sc.flag, dest=sc.dest, action="store_const", const=sc.const, default=None,
                                help=f"{said}(sets {where} = {toml_value(sc.const)}; default {toml_value(default)})")
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
        shown = toml_value(str(default) if isinstance(default, Path) else default)
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
    return [f"{path}={toml_value(str(v) if isinstance(v, Path) else v)}"
            for path, v in shortcut_values(args, shortcuts).items()]


def flag_error(error: ConfigError, shortcuts: tuple[Shortcut, ...], prefix: str = "") -> str:
    """``error`` as a command line's user reads it: led by the flag that sets its field, when one
    does (``--bootstrap: '/ip4/...' must end in /p2p/<peer id>``, ``--max-groups must be >= 1,
    got 0``). ``prefix``: the dotted path of the section the shortcuts' paths are relative to
    ("" for a top-level config)."""
    path = error.field[len(prefix):] if prefix and error.field.startswith(prefix) else error.field
    for sc in shortcuts:
        if path and path in sc.fields:
            sep = "" if error.reason.startswith(":") else " "
            return f"{sc.flag}{sep}{error.reason}"
    return str(error)
