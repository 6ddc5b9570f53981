"""Loading a pipeline file: ``${ENV}`` expansion, validation, and every error mapped to the
file, the line and the field.

Every check that can fail without an engine (keys, types, placeholders, deployments named by
steps, backends and their options, input paths and columns) runs in :func:`load_pipeline` and
the :class:`~relayllm.pipelines.pipeline.Pipeline` checks, and its error names the file, the
line and the field.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from relayllm.configbase import InvalidConfigError, error_message, flat_errors
from relayllm.errors import ConfigError
from relayllm.pipelines.inputs import columns_of_rows
from relayllm.pipelines.located import Loc, not_utf8, parse_yaml
from relayllm.pipelines.pipeline import Pipeline
from relayllm.pipelines.spec import HIDDEN_PREFIX, PipelineSpec, StepSpec
from relayllm.pipelines.templates import step_templates, template_fields
from relayllm.rows import output_fields

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_env(value: Any, loc: Loc, problems: list[tuple[Loc, str]]) -> Any:
    """``${NAME}`` / ``${NAME:-default}`` from the environment, so paths, hosts and model
    locations need not be written into the file. Not applied to steps: prompts keep '$'."""
    if isinstance(value, dict):
        return {k: expand_env(v, (*loc, k), problems) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_env(v, (*loc, i), problems) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        problems.append((loc, f"environment variable {name} is not set"))
        return match.group(0)

    return _ENV.sub(substitute, value)


def load_pipeline(path: str | os.PathLike[str]) -> Pipeline:
    """Read and validate a pipeline file; no cluster, no engine."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"{source}: cannot read the pipeline file: {exc.strerror or exc}"
        ) from None
    except UnicodeDecodeError as exc:
        raise not_utf8(source, exc) from None
    return parse_pipeline(text, source, Path(path).resolve().parent)


def parse_pipeline(text: str, source: str, base_dir: Path) -> Pipeline:
    located = parse_yaml(text, source)
    data = located.data
    if not isinstance(data, dict):
        raise located.error(
            [((), "the file must be a mapping with deployments, input, steps, output")]
        )
    problems: list[tuple[Loc, str]] = []
    data = {k: (expand_env(v, (k,), problems) if k != "steps" else v) for k, v in data.items()}
    if problems:
        raise located.error(problems)
    try:
        spec = PipelineSpec.model_validate(data)
    except ValidationError as exc:
        raise located.error(
            [(data_loc(e["loc"], data), error_message(PipelineSpec, e)) for e in flat_errors(exc)]
        ) from None
    pipeline = Pipeline(spec, source, base_dir, located)
    _check_references(pipeline)
    if spec.input.rows is not None:
        pipeline.check_columns(columns_of_rows(spec.input.rows))
    else:
        pipeline.check_columns(None)
    return pipeline


def data_loc(loc: tuple[Any, ...], data: Any) -> Loc:
    """Pydantic's loc without the union-member labels it inserts (e.g. 'str', 'list[str]')."""
    out: list[str | int] = []
    node = data
    for part in loc:
        in_dict = isinstance(node, dict) and part in node
        if in_dict or isinstance(node, list) and isinstance(part, int) and part < len(node):
            out.append(part)
            node = node[part]
        elif isinstance(node, dict) and isinstance(part, str) and not _is_type_label(part):
            out.append(part)  # a missing key: name it
            node = None
    return tuple(out)


def _is_type_label(part: str) -> bool:
    return (
        part in {"str", "int", "float", "bool", "dict", "list", "none"}
        or "[" in part
        or part.startswith(("function-", "literal[", "list[", "dict["))
    )


def _check_references(pipeline: Pipeline) -> None:
    spec = pipeline.spec
    problems: list[tuple[Loc, str]] = []
    names = [d.name for d in spec.deployments]
    for i, name in enumerate(names):
        if names.index(name) != i:
            problems.append((("deployments", i, "name"), f"deployment {name!r} is declared twice"))
    steps = [s.name for s in spec.steps]
    # The columns the pipeline's steps write (a classify step's `label`, say): no step may
    # name its output after one, or a later step would overwrite it.
    reserved = {f.name for s in spec.steps for f in output_fields(s.resolved_task)}
    for i, step in enumerate(spec.steps):
        loc: Loc = ("steps", i)
        if steps.index(step.name) != i:
            problems.append(((*loc, "name"), f"step {step.name!r} is declared twice"))
        if step.deployment not in names:
            problems.append(
                (
                    (*loc, "deployment"),
                    f"unknown deployment {step.deployment!r}; "
                    f"declared deployments: {', '.join(names)}",
                )
            )
        if step.output_column in reserved or step.output_column.startswith(HIDDEN_PREFIX):
            problems.append(
                ((*loc, "output_column"), f"{step.output_column!r} is reserved; pick another name")
            )
        if step.output_json_field and step.task == "embedding":
            problems.append(((*loc, "output_json_field"), "an embedding is not JSON text"))
        for t_loc, template in step_templates(step, loc):
            try:
                template_fields(template)
            except ValueError as exc:
                problems.append(
                    (t_loc, f"bad template ({exc}); write literal braces as {{{{ and }}}}")
                )
        try:
            step.processor_config()
        except InvalidConfigError as exc:  # the step's sampling_params, checked by the processor
            for e in exc.errors:
                key = "response_format" if "response_format" in str(e["msg"]) else e["loc"][0]
                problems.append(((*loc, key), error_message(StepSpec, e)))
    if problems:
        raise pipeline.located.error(problems)
