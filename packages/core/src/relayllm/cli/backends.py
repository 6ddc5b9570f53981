"""``relayllm backends``: the installed adapters, their versions and their options."""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Sequence
from typing import Any

import click
from pydantic_core import PydanticUndefined

from relayllm import versions
from relayllm.backend import KNOWN_ADAPTERS, BackendOrigin
from relayllm.cli.common import handle_errors, warn_unsupported_versions


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.argument("names", nargs=-1, metavar="[NAME]...")
@handle_errors
def backends(as_json, names):
    """List installed backends (from the 'relayllm' entry points): the distribution and
    version that provides each, whether its engine package is installed, its tasks, and its
    options with types and defaults. Give NAMEs to show only those.

    \b
    Examples:
      relayllm backends
      relayllm backends vllm --json
    """
    from relayllm.plugin.manager import get_registry

    registry = get_registry()
    warn_unsupported_versions()
    for name in names:
        registry.get(name)  # unknown name: lists installed ones and the pip command
    found = [describe(b, registry.origin(b.name)) for b in registry if not names or b.name in names]
    found.sort(key=lambda b: b["name"])
    refused = {n: why for n, why in registry.refused().items() if not names or n in names}
    if as_json:
        click.echo(json.dumps(found, indent=2, default=str))
        return
    for why in refused.values():
        click.echo(f"refused: {why}", err=True)
    if not found and not refused:
        adapters = "; ".join(f"{name}: pip install {hint}" for name, hint in KNOWN_ADAPTERS.items())
        click.echo(f"no backends installed; install an adapter ({adapters})")
    for item in found:
        click.echo(_text(item))


def describe(backend: Any, origin: BackendOrigin | None) -> dict[str, Any]:
    missing = backend.missing_requirements()
    options = []
    for key, field in backend.Options.model_fields.items():
        options.append(
            {
                "name": key,
                "type": _type_name(field.annotation, field.metadata),
                "required": field.is_required(),
                "default": None if field.is_required() else _default(field),
                "description": field.description or "",
            }
        )
    return {
        "name": backend.name,
        "plugin": origin.plugin if origin else None,
        "distribution": origin.distribution if origin else None,
        "version": origin.version if origin else None,
        "origin": None if origin and origin.distribution else backend.__module__,
        "tasks": sorted(backend.tasks),
        "supported_versions": [
            {"distribution": d, "supported": p, "installed": versions.installed(d)}
            for d, p in backend.supported_versions.items()
        ],
        "engine_installed": not missing,
        "missing": missing,
        "install_hint": backend.install_hint if missing else None,
        "contract_version": backend.contract_version or 1,  # none declared: contract 1
        "options": options,
    }


def _default(field: Any) -> Any:
    if field.default is not PydanticUndefined:
        value = field.default
    elif field.default_factory is not None:
        value = field.default_factory()
    else:
        return None
    return value.model_dump(mode="json") if hasattr(value, "model_dump") else value


def _type_name(annotation: Any, metadata: Sequence[Any] = ()) -> str:
    """A type as a user writes it in YAML terms: ``int (> 0) | None``, ``Literal['a', 'b']``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0], args[1:])
    if origin in (typing.Union, types.UnionType):
        text = " | ".join(_type_name(a) for a in args)
    elif origin is typing.Literal:
        text = f"Literal[{', '.join(repr(a) for a in args)}]"
    elif origin is not None:
        text = f"{getattr(origin, '__name__', origin)}[{', '.join(_type_name(a) for a in args)}]"
    elif annotation is type(None):
        text = "None"
    elif isinstance(annotation, type):
        text = annotation.__name__
    else:
        text = str(annotation).replace("typing.", "")
    bounds = [
        f"{op} {getattr(m, name)}"
        for m in metadata
        for name, op in _BOUNDS.items()
        if hasattr(m, name)
    ]
    return f"{text} ({', '.join(bounds)})" if bounds else text


_BOUNDS = {
    "gt": ">",
    "ge": ">=",
    "lt": "<",
    "le": "<=",
    "min_length": "length >=",
    "max_length": "length <=",
}


def _text(item: dict[str, Any]) -> str:
    source = (
        f"{item['distribution']} {item['version']}"
        if item["distribution"]
        else f"{item['origin']} (in code)"
    )
    engine = (
        "installed"
        if item["engine_installed"]
        else (
            f"NOT installed (missing {', '.join(item['missing'])}"
            + (f"; {item['install_hint']})" if item["install_hint"] else ")")
        )
    )
    lines = [
        f"{item['name']}  ({source})",
        f"  tasks: {', '.join(item['tasks'])}",
        f"  adapter contract: {item['contract_version']}",
        f"  engine: {engine}",
        *(
            f"  supports: {v['distribution']} {versions.describe(v['supported'])}"
            + (f" (installed {v['installed']})" if v["installed"] else "")
            for v in item["supported_versions"]
        ),
        "  options:",
    ]
    if not item["options"]:
        lines.append("    (none)")
    width = max((len(o["name"]) for o in item["options"]), default=0)
    for option in item["options"]:
        default = (
            "required"
            if option["required"]
            else f"default {json.dumps(option['default'], default=str)}"
        )
        about = f"  {option['description']}" if option["description"] else ""
        lines.append(f"    {option['name'].ljust(width)}  {option['type']}, {default}.{about}")
    return "\n".join(lines) + "\n"
