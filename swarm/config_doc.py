"""A config's reference, written from its sections (:mod:`swarm.config`): every field with its
``#:`` doc, type, bounds, default and the CLI flag that sets it.

- :func:`annotated_toml`: a resolved config as TOML, each field preceded by its doc and default
  as comments (what ``swarm-learner config`` and ``swarm-node config`` print; a valid config
  file as it stands).
- :func:`markdown_reference`: the same as Markdown tables, one per section (``docs/config.md``
  is generated from it).
"""

from __future__ import annotations

import dataclasses
import textwrap
import typing
from pathlib import Path
from typing import Mapping, get_args, get_origin

from swarm.config import Rule, Section, bounds_of, field_docs, toml_value

WIDTH = 100


@dataclasses.dataclass(frozen=True)
class FieldRow:
    """One field of a section as the reference shows it."""

    name: str
    type: str
    bounds: str
    #: The default as TOML (or as the field's ``shown`` text, for a default that depends on the machine).
    default: str
    doc: str
    flag: str


def _is_section(tp: object) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def type_name(tp: object) -> str:
    """``int``, ``list[str]``, ``"tree" | "star"`` (a Literal's choices), ``path``."""
    if get_origin(tp) is typing.Literal:
        return " | ".join(f'"{a}"' if isinstance(a, str) else repr(a) for a in get_args(tp))
    if tp is Path:
        return "path"
    if isinstance(tp, type) and not get_args(tp):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _default(f: dataclasses.Field) -> object:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def rows(cls: type, flags: Mapping[str, str] | None = None, prefix: str = "") -> list[FieldRow]:
    """The plain (non-section) fields of dataclass ``cls``; ``flags``: dotted path -> CLI flag."""
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    out = []
    for f in dataclasses.fields(cls):
        if _is_section(hints[f.name]):
            continue
        b = bounds_of(f)
        default = b.shown if b is not None and b.shown else _value(_default(f))
        out.append(FieldRow(f.name, type_name(hints[f.name]), b.describe() if b is not None else "", default,
                            docs.get(f.name, ""), (flags or {}).get(prefix + f.name, "")))
    return out


def sections(cls: type) -> list[tuple[str, type, str]]:
    """``(name, class, doc)`` of each section field of ``cls``: the doc is the ``#:`` comment on
    the field, else the section class's docstring."""
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    out = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if _is_section(tp):
            out.append((f.name, tp, docs.get(f.name) or class_doc(tp)))
    return out


def class_doc(cls: type) -> str:
    """The class's own docstring on one line ("" for the one ``dataclass`` writes)."""
    doc = cls.__doc__ or ""
    if doc.startswith(f"{cls.__name__}("):
        return ""
    return " ".join(doc.split())


def _comment(text: str) -> list[str]:
    return textwrap.wrap(text, WIDTH - 2, initial_indent="# ", subsequent_indent="# ") if text else []


def _value(v: object) -> str:
    return toml_value(str(v) if isinstance(v, Path) else v)


def annotated_toml(cfg: object, flags: Mapping[str, str] | None = None) -> str:
    """``cfg`` as TOML with each field's doc, bounds, default and flag as comments."""
    cls = type(cfg)
    lines: list[str] = []

    def fields_of(owner: object, section_cls: type, prefix: str) -> None:
        for row in rows(section_cls, flags, prefix):
            value = getattr(owner, row.name)
            if value is None:
                continue
            lines.extend(_comment(row.doc))
            notes = [f"default {row.default}"] + ([row.bounds] if row.bounds else []) + \
                ([f"flag {row.flag}"] if row.flag else [])
            lines.append(f"# ({'; '.join(notes)})")
            lines.append(f"{row.name} = {_value(value)}")
            lines.append("")

    fields_of(cfg, cls, "")
    for name, section_cls, doc in sections(cls):
        lines.append(f"[{name}]")
        lines.extend(_comment(doc))
        lines.append("")
        fields_of(getattr(cfg, name), section_cls, f"{name}.")
    return "\n".join(lines).rstrip() + "\n"


def _md(text: str) -> str:
    return text.replace("``", "`").replace("|", "\\|")


def _table(cls: type, flags: Mapping[str, str] | None, prefix: str) -> list[str]:
    out = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for row in rows(cls, flags, prefix):
        kind = row.type + (f", {row.bounds}" if row.bounds else "")
        flag = f" Flag: `{row.flag}`." if row.flag else ""
        out.append(f"| `{row.name}` | {_md(kind)} | `{_md(row.default)}` | {_md(row.doc)}{flag} |")
    out += _rules(cls)
    return out


def _rules(cls: type) -> list[str]:
    said: tuple[Rule, ...] = cls.rules if issubclass(cls, Section) else ()
    return [f"\nRule: `{r.field}` {_md(r.message)}." for r in said if r.message]


def markdown_reference(cls: type, flags: Mapping[str, str] | None = None, heading: str = "###") -> str:
    """The reference of config ``cls`` in Markdown: its plain fields in one table, then one
    heading and table per section (``[name]``)."""
    out: list[str] = []
    if rows(cls):
        out += _table(cls, flags, "") + [""]
    else:
        out += [line.lstrip("\n") for line in _rules(cls)] + [""]
    for name, section_cls, doc in sections(cls):
        out += [f"{heading} `[{name}]`", ""] + ([_md(doc), ""] if doc else [])
        out += _table(section_cls, flags, f"{name}.") + [""]
    return "\n".join(out).strip() + "\n"
