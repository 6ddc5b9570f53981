"""What the adapter reads from sglang's source: ServerArgs fields, SamplingParams fields and the
reasoning parsers, without importing sglang.

Importing sglang pulls in a CUDA torch and takes seconds, and the machine that validates a config
(the driver) often has no GPU. These names are plain declarations, read with core's source
reader (:class:`relayllm.adapters.source.SourceTree`): from the installed sglang at deploy time,
and from the pinned wheel in the API contract test, so one tested piece of code does both.
"""

from __future__ import annotations

import ast

from relayllm.adapters.source import SourceLayoutError, SourceTree, annotated_fields

ENGINE_MODULE = "sglang"  # where users (and the adapter) get ``Engine`` from
SERVER_ARGS_MODULE = "sglang.srt.server_args"
SAMPLING_PARAMS_MODULE = "sglang.srt.sampling.sampling_params"
REASONING_PARSER_MODULE = "sglang.srt.parser.reasoning_parser"


def installed() -> SourceTree | None:
    """The installed sglang's source (found, not imported), or None."""
    return SourceTree.installed("sglang")


def server_args_fields(tree: SourceTree) -> set[str]:
    """Every field ``ServerArgs`` accepts.

    In 0.5.x ServerArgs is assembled at import time from namespace classes listed in
    ``_INPUT_NAMESPACES`` (model, parallel, schedule, ...); earlier releases declared the fields
    on the class itself. Both shapes are read.
    """
    where, node = tree.find_class(SERVER_ARGS_MODULE, "ServerArgs")
    fields = annotated_fields(node)
    for statement in tree.module(where).body:
        targets = (
            statement.targets
            if isinstance(statement, ast.Assign)
            else ([statement.target] if isinstance(statement, ast.AnnAssign) else [])
        )
        if any(isinstance(t, ast.Name) and t.id == "_INPUT_NAMESPACES" for t in targets):
            for element in getattr(statement.value, "elts", []):
                if isinstance(element, ast.Name):
                    fields |= tree.fields(where, element.id)
    if not fields:
        raise SourceLayoutError(f"no ServerArgs fields found in {where}")
    return fields


def sampling_param_fields(tree: SourceTree) -> set[str]:
    """Names ``SamplingParams`` accepts (fields, or ``__init__`` parameters in old releases)."""
    fields = tree.fields(SAMPLING_PARAMS_MODULE, "SamplingParams")
    if not fields:
        fields = set(tree.constructor(SAMPLING_PARAMS_MODULE, "SamplingParams").keywords)
    if not fields:
        raise SourceLayoutError("no SamplingParams fields found")
    return fields


def reasoning_parsers(tree: SourceTree) -> dict[str, str]:
    """The names ``ReasoningParser`` accepts, each with the detector class it builds: its
    ``DetectorMap`` registry."""
    _, node = tree.find_class(REASONING_PARSER_MODULE, "ReasoningParser")
    for item in node.body:
        targets: list[ast.expr]
        if isinstance(item, ast.AnnAssign):
            targets, value = [item.target], item.value
        elif isinstance(item, ast.Assign):
            targets, value = item.targets, item.value
        else:
            continue
        if isinstance(value, ast.Dict) and any(
            isinstance(t, ast.Name) and t.id == "DetectorMap" for t in targets
        ):
            parsers = {
                k.value: ast.unparse(v)
                for k, v in zip(value.keys, value.values, strict=True)
                if isinstance(k, ast.Constant) and isinstance(k.value, str)
            }
            if parsers:
                return parsers
    raise SourceLayoutError("no ReasoningParser.DetectorMap of parser names found")


def reasoning_parser_names(tree: SourceTree) -> set[str]:
    """The names ``ReasoningParser`` accepts (``--reasoning-parser``'s choices)."""
    return set(reasoning_parsers(tree))


__all__ = [
    "ENGINE_MODULE",
    "REASONING_PARSER_MODULE",
    "SAMPLING_PARAMS_MODULE",
    "SERVER_ARGS_MODULE",
    "installed",
    "reasoning_parser_names",
    "reasoning_parsers",
    "sampling_param_fields",
    "server_args_fields",
]
