"""The configuration reference, generated from the settings classes.

``render()`` gives one Markdown table per service: every environment variable a service reads
through its pydantic-settings class, with its type as written in the environment, its default and
the field's description. docs/configuration.md holds the output between ``BEGIN`` and ``END``;
a test keeps the two equal.

    python -m services.config_reference                                 # print it
    python -m services.config_reference --write docs/configuration.md   # update the docs
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, NoDecode

from services.common.settings import BusSettings

BEGIN = "<!-- BEGIN GENERATED: python -m services.config_reference -->"
END = "<!-- END GENERATED -->"


@dataclass(frozen=True)
class Section:
    title: str
    module: str  # holds ``Settings`` (or ``BusSettings`` for the shared section)
    intro: str
    own_only: bool = True  # leave out the fields every bus service shares (their own section)


SECTIONS = (
    Section(
        "Every bus service",
        "services.common.settings",
        "Read by the gateway, encoder, dispatcher, parser and tools services (not the simulated engine).",
    ),
    Section(
        "gateway",
        "services.gateway.settings",
        "The HTTP API (`chorus serve gateway`), plus the settings every bus service reads.",
    ),
    Section(
        "encoder",
        "services.encoder.settings",
        "Items -> Harmony -> prompt token ids (`chorus serve encoder`; `chorus serve worker` reads "
        "these, the dispatcher's and the parser's), plus the settings every bus service reads.",
    ),
    Section(
        "dispatcher",
        "services.dispatcher.settings",
        "Engine workers and every engine call (`chorus serve dispatcher`; `chorus serve worker` "
        "reads these, the encoder's and the parser's), plus the settings every bus service reads.",
    ),
    Section(
        "parser",
        "services.parser.settings",
        "Parse sessions (`chorus serve parser`, scalable; `chorus serve worker` reads these, the "
        "encoder's and the dispatcher's), plus the settings every bus service reads.",
    ),
    Section(
        "tools",
        "services.tools.settings",
        "The MCP client (`chorus serve tools`): which servers it may reach and how hard it "
        "tries, plus the settings every bus service reads.",
    ),
    Section(
        "sim-engine",
        "services.simengine.settings",
        "The SIMULATED engine (`chorus serve sim-engine`; `chorus up` without `--engine`). "
        "Not a bus service: it reads only these.",
        own_only=False,
    ),
)


def settings_class(section: Section) -> type[BaseSettings]:
    module = importlib.import_module(section.module)
    cls = module.BusSettings if section.module == "services.common.settings" else module.Settings
    assert isinstance(cls, type) and issubclass(cls, BaseSettings)
    return cls


def env_names(cls: type[BaseSettings], name: str, field: FieldInfo) -> list[str]:
    """The environment variables a field reads, first the preferred one."""
    choices = getattr(field.validation_alias, "choices", None)
    if choices:
        return [c for c in choices if isinstance(c, str) and c.upper() == c]
    if isinstance(field.validation_alias, str):
        return [field.validation_alias.upper()]
    return [f"{cls.model_config.get('env_prefix', '')}{name}".upper()]


def _type_name(annotation: Any) -> str:
    if get_origin(annotation) is Literal:
        return " / ".join(f"`{a}`" for a in get_args(annotation))
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        inner = _type_name(args[0]) if len(args) == 1 else " or ".join(map(_type_name, args))
        return f"{inner}, optional"
    if get_origin(annotation) is list:
        return f"JSON list of {_type_name(get_args(annotation)[0])}"
    if get_origin(annotation) is dict:
        key, value = get_args(annotation)
        return f"JSON object, {_type_name(key)} -> {_type_name(value)}"
    return f"`{getattr(annotation, '__name__', annotation)}`"


def type_name(field: FieldInfo) -> str:
    if any(isinstance(m, NoDecode) or m is NoDecode for m in field.metadata):
        args = get_args(field.annotation)
        if len(args) == 2:  # a mapping: KEY=VALUE items
            return f"comma-separated KEY=VALUE ({_type_name(args[0])} to {_type_name(args[1])}) or a JSON object"
        return f"comma-separated {_type_name(args[0])}"
    return _type_name(field.annotation)


def _env_value(value: Any) -> str:
    """``value`` as written in the environment."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict) and value and all(isinstance(v, str) for v in value.values()):
        return ",".join(f"{k}={v}" for k, v in value.items())  # as the comma-separated form reads
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def default_text(field: FieldInfo) -> str:
    if field.default_factory is not None:
        first = field.get_default(call_default_factory=True, validated_data={})
        second = field.get_default(call_default_factory=True, validated_data={})
        if first != second:
            return "*generated per process*"
        value = first
    else:
        value = field.default
    if value is None:
        return "*unset*"
    if value in ("", [], {}):
        return "*empty*"
    return f"`{_env_value(value)}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def fields(section: Section) -> list[tuple[str, FieldInfo]]:
    cls = settings_class(section)
    shared = BusSettings.model_fields if section.own_only and cls is not BusSettings else {}
    return [(name, f) for name, f in cls.model_fields.items() if name not in shared]


def table(section: Section) -> str:
    cls = settings_class(section)
    rows = ["| Variable | Type | Default | Description |", "|---|---|---|---|"]
    for name, field in fields(section):
        names = env_names(cls, name, field)
        variable = f"`{names[0]}`" + "".join(f" (or `{n}`)" for n in names[1:])
        if not field.description:
            raise ValueError(f"{section.module}: {name} needs Field(description=...)")
        rows.append(
            f"| {variable} | {_cell(type_name(field))} | {_cell(default_text(field))} | {_cell(field.description)} |"
        )
    return "\n".join(rows)


def shared_names() -> dict[str, list[str]]:
    """Variables more than one service reads, each with its services (one environment, as
    under `chorus up`, gives them all the same value)."""
    readers: dict[str, list[str]] = {}
    for section in SECTIONS:
        cls = settings_class(section)
        for name, field in fields(section):
            readers.setdefault(env_names(cls, name, field)[0], []).append(section.title)
    return {name: titles for name, titles in readers.items() if len(titles) > 1}


def render() -> str:
    """The generated reference (the text between the markers of docs/configuration.md)."""
    parts: list[str] = []
    for section in SECTIONS:
        source = section.module.replace(".", "/") + ".py"
        parts.append(f"### {section.title}\n\n{section.intro} Source: `{source}`.\n\n{table(section)}\n")
    shared = shared_names()
    if shared:
        lines = [f"- `{name}`: {', '.join(titles)}" for name, titles in sorted(shared.items())]
        parts.append(
            "### Read by more than one service\n\nOne environment (`chorus up`) gives "
            "each of these the same value in every service that reads it; set them per "
            "service (per container) where the meanings differ.\n\n" + "\n".join(lines) + "\n"
        )
    return "\n".join(parts)


def splice(document: str, generated: str) -> str:
    """``document`` with the text between its markers replaced by ``generated``."""
    head, begin, rest = document.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"the document has no {BEGIN} ... {END} markers")
    return f"{head}{BEGIN}\n{generated}{END}{tail}"


def generated_part(document: str) -> str:
    """The text between the markers of ``document``."""
    _, _, rest = document.partition(BEGIN)
    return rest.partition(END)[0].removeprefix("\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.config_reference", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument(
        "--write", metavar="PATH", help="replace the generated part of PATH (docs/configuration.md) instead of printing"
    )
    args = parser.parse_args(argv)
    generated = render()
    if args.write:
        path = Path(args.write)
        path.write_text(splice(path.read_text(), generated))
        print(f"updated {path}", file=sys.stderr)
    else:
        sys.stdout.write(generated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
