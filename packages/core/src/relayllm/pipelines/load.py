"""Loading a pipeline file: ``${ENV}`` expansion, validation, and every error mapped to the
file, the line and the field.

Every check that can fail without an engine (keys, types, placeholders, deployments named by
steps, backends and their options, input paths and columns) runs in :func:`load_pipeline` and
the :class:`Pipeline` checks, and its error names the file, the line and the field.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from relayllm.deployments import DeploymentConfig
from relayllm.errors import ConfigError, MissingDependencyError, RelayLLMError
from relayllm.pipelines.inputs import columns_of_rows
from relayllm.pipelines.located import Loc, Located, PipelineError, not_utf8, parse_yaml
from relayllm.pipelines.spec import EXTENSIONS, HIDDEN_PREFIX, PipelineSpec
from relayllm.pipelines.templates import step_templates, template_fields
from relayllm.rows import features_of, output_fields, unsupported_features

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _expand_env(value: Any, loc: Loc, problems: list[tuple[Loc, str]]) -> Any:
    """``${NAME}`` / ``${NAME:-default}`` from the environment, so paths, hosts and model
    locations need not be written into the file. Not applied to steps: prompts keep '$'."""
    if isinstance(value, dict):
        return {k: _expand_env(v, (*loc, k), problems) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v, (*loc, i), problems) for i, v in enumerate(value)]
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


@dataclass
class Pipeline:
    """A validated pipeline file. Input paths in it are relative to the file's directory, the
    output path to the current directory (the command's)."""

    spec: PipelineSpec
    source: str
    base_dir: Path
    located: Located

    def error(self, loc: Loc, message: str) -> PipelineError:
        return self.located.error([(loc, message)])

    def deployment(self, name: str) -> DeploymentConfig:
        return next(d for d in self.spec.deployments if d.name == name)

    def check_backends(self) -> None:
        """Backends installed, options valid, every step's task served. No cluster needed."""
        from relayllm.deployments import resolve, unserved_task_message
        from relayllm.plugin.manager import get_registry

        problems: list[tuple[Loc, str]] = []
        for i, config in enumerate(self.spec.deployments):
            try:
                backend, options = resolve(config)
            except MissingDependencyError as exc:
                # The engine is not installed here (a GPU engine checked on a laptop, say): say
                # so, and still check what the steps ask of the valid options (no engine needed).
                problems.extend(_deployment_problems(exc, i, config))
                backend = get_registry().get(config.backend)
                options = backend.parse_options(config.options)
            except RelayLLMError as exc:  # bad options, unknown backend
                problems.extend(_deployment_problems(exc, i, config))
                continue
            served = backend.tasks_for(options)
            supported = backend.features_for(options)
            for j, step in enumerate(self.spec.steps):
                if step.deployment != config.name:
                    continue
                if step.resolved_task not in served:
                    problems.append(
                        (
                            ("steps", j, "task"),
                            unserved_task_message(
                                config.name, config.backend, step.resolved_task, served
                            ),
                        )
                    )
                params = step.processor_config().sampling_params
                problem = unsupported_features(config.backend, features_of(params), supported)
                if problem:
                    problems.append((("steps", j, "sampling_params"), problem))
        if problems:
            raise self.located.error(problems)

    def input_paths(self, override: str | None = None) -> list[str]:
        """The input files, checked to exist and be readable (remote URIs are left to Ray)."""
        raw = [override] if override else self.spec.input.path
        raw = [raw] if isinstance(raw, str) else list(raw or [])
        base = Path.cwd() if override else self.base_dir
        loc: Loc = ("input", "path")
        where = "--input" if override else None  # an option's error names the option
        paths: list[str] = []
        for entry in raw:
            if "://" in entry:
                paths.append(entry)
                continue
            full = entry if os.path.isabs(entry) else str(base / entry)
            if glob.has_magic(full):
                matches = sorted(glob.glob(full))
                if not matches:
                    raise self._input_error(where, loc, f"no file matches {entry!r}")
                paths.extend(matches)
            elif not os.path.exists(full):
                raise self._input_error(where, loc, f"{entry!r} does not exist (looked at {full})")
            else:
                paths.append(full)
        for path in paths:
            if "://" not in path and not os.access(path, os.R_OK):
                raise self._input_error(where, loc, f"{path} is not readable")
        return paths

    def _input_error(self, where: str | None, loc: Loc, message: str) -> ConfigError:
        return ConfigError(f"{where}: {message}") if where else self.error(loc, message)

    def input_format(self, paths: list[str]) -> str:
        if self.spec.input.format:
            return self.spec.input.format
        for path in paths:
            candidates = [path] if not os.path.isdir(path) else sorted(os.listdir(path))
            for name in candidates:
                fmt = EXTENSIONS.get(Path(name).suffix.lower())
                if fmt:
                    return fmt
        raise self.error(
            ("input", "path"), "cannot tell the format from the file names; set input.format"
        )

    def check_columns(self, columns: list[str] | None) -> None:
        """Every placeholder names an input column or an earlier step's output column."""
        problems: list[tuple[Loc, str]] = []
        if columns == []:
            source = "input.rows" if self.spec.input.rows is not None else "the input file"
            raise self.error(("input",), f"{source} has no rows (an empty file?): nothing to run")
        id_column = self.spec.input.id_column
        if columns is not None and id_column and id_column not in columns:
            problems.append(
                (
                    ("input", "id_column"),
                    f"column {id_column!r} is not in the input (columns: {', '.join(columns)})",
                )
            )
        known = set(columns) if columns is not None else None
        for i, step in enumerate(self.spec.steps):
            for loc, template in step_templates(step, ("steps", i)):
                for name in template_fields(template):
                    if known is not None and name not in known:
                        problems.append(
                            (
                                loc,
                                f"column {name!r} is not in the input (columns: "
                                f"{', '.join(columns or [])}) nor an earlier step's output_column",
                            )
                        )
            if known is not None:
                known.add(step.output_column)
        if problems:
            raise self.located.error(problems)


def _deployment_problems(exc: Exception, i: int, config: DeploymentConfig) -> list[tuple[Loc, str]]:
    loc: Loc = ("deployments", i)
    cause = exc.__cause__
    if isinstance(cause, ValidationError):  # the backend's Options model: name each field
        return [
            ((*loc, "options", *e["loc"]), f"{_pydantic_message(e)} (backend {config.backend!r})")
            for e in cause.errors()
        ]
    from relayllm.errors import UnknownBackendError

    option = getattr(exc, "option", None)  # a backend's check that names one option
    if isinstance(option, str):
        return [((*loc, "options", option), str(exc))]
    key = (
        "backend" if isinstance(exc, UnknownBackendError) or "option" not in str(exc) else "options"
    )
    return [((*loc, key), str(exc))]


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
    data = {k: (_expand_env(v, (k,), problems) if k != "steps" else v) for k, v in data.items()}
    if problems:
        raise located.error(problems)
    try:
        spec = PipelineSpec.model_validate(data)
    except ValidationError as exc:
        raise located.error(
            [(_data_loc(e["loc"], data), _pydantic_message(e)) for e in exc.errors()]
        ) from None
    pipeline = Pipeline(spec, source, base_dir, located)
    _check_references(pipeline)
    if spec.input.rows is not None:
        pipeline.check_columns(columns_of_rows(spec.input.rows))
    else:
        pipeline.check_columns(None)
    return pipeline


def _data_loc(loc: tuple[Any, ...], data: Any) -> Loc:
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


def _pydantic_message(error: ErrorDetails) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    message = error["msg"]
    return message.removeprefix("Value error, ")


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
        except ValidationError as exc:
            for e in exc.errors():
                key = "response_format" if "response_format" in str(e["msg"]) else e["loc"][0]
                problems.append(((*loc, key), _pydantic_message(e)))
    if problems:
        raise pipeline.located.error(problems)
