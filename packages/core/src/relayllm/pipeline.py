"""Pipelines from a YAML file: deployments, an input, steps that run in order, an output.

A step is a processor on a named deployment with a ``messages`` / ``prompt`` / ``input``
template whose ``{column}`` placeholders are filled from the row; its answer lands in the
step's ``output_column``, where a later step's template can use it. Several steps may name one
deployment: they share its engine. The deployment block is the only backend-specific part, so
swapping ``backend:``/``options:`` leaves every step as it is.

Every check that can fail without an engine (keys, types, placeholders, deployments named by
steps, backends and their options, input paths and columns) runs in :func:`load_pipeline` and
:meth:`Pipeline.check`, and its error names the file, the line and the field.
"""

from __future__ import annotations

import glob
import json
import os
import re
import string
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, model_validator

from relayllm.deployments import DeploymentConfig
from relayllm.errors import ConfigError, RelayLLMError
from relayllm.processor import ProcessorConfig, build_processor
from relayllm.resources import TASK_NUM_CPUS
from relayllm.rows import (
    ANSWER_COLUMN,
    ERROR,
    INPUT_COLUMN,
    NUM_GENERATED_TOKENS,
    NUM_INPUT_TOKENS,
    OUTPUT_COLUMNS,
    TASK_OF_INPUT,
    Task,
    features_of,
    output_fields,
    unsupported_features,
)

Loc = tuple[str | int, ...]

# -- errors that name the file, the line and the field ------------------------------------


class PipelineError(ConfigError):
    """A pipeline file is invalid. ``problems`` holds (line, field, message) triples."""

    def __init__(self, source: str, problems: list[tuple[int | None, str, str]]) -> None:
        self.source = source
        self.problems = problems
        lines = []
        for line, where, message in problems:
            place = f"{source}:{line}" if line else source
            lines.append(f"{place}: {where}: {message}" if where else f"{place}: {message}")
        super().__init__("\n".join(lines))


def format_loc(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class _Located:
    """The parsed YAML plus the line of every key and item, to point errors at them."""

    def __init__(self, source: str, data: Any, lines: dict[Loc, int]) -> None:
        self.source, self.data, self.lines = source, data, lines

    def line(self, loc: Loc) -> int | None:
        for end in range(len(loc), -1, -1):  # the deepest part of loc the file has
            if loc[:end] in self.lines:
                return self.lines[loc[:end]]
        return None

    def error(self, problems: list[tuple[Loc, str]]) -> PipelineError:
        return PipelineError(
            self.source, [(self.line(loc), format_loc(loc), m) for loc, m in problems]
        )


def _parse_yaml(text: str, source: str) -> _Located:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else None
        raise PipelineError(
            source, [(line, "", f"not valid YAML: {getattr(exc, 'problem', exc)}")]
        ) from None
    finally:
        loader.dispose()
    lines: dict[Loc, int] = {}
    problems: list[tuple[int | None, str, str]] = []

    def walk(node: yaml.Node, loc: Loc) -> None:
        lines.setdefault(loc, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key, value in node.value:
                name = key.value if isinstance(key, yaml.ScalarNode) else str(key.value)
                if name in seen:  # PyYAML silently keeps the last one
                    problems.append(
                        (key.start_mark.line + 1, format_loc((*loc, name)), "duplicate key")
                    )
                seen.add(name)
                lines[(*loc, name)] = key.start_mark.line + 1
                walk(value, (*loc, name))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, (*loc, i))

    if node is not None:
        walk(node, ())
    if problems:
        raise PipelineError(source, problems)
    return _Located(source, data, lines)


# -- the file's model ---------------------------------------------------------------------

_COLUMN = r"^[^\s{}][^{}]*$"
Format = Literal["jsonl", "json", "csv", "parquet"]
#: File extension -> input/output format.
EXTENSIONS = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".csv": "csv",
    ".parquet": "parquet",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class InputSpec(_Strict):
    """Where rows come from: ``path`` (a file, a directory, a glob, or a list of them) or
    ``rows`` written inline."""

    path: str | list[str] | None = None
    rows: list[dict[str, Any]] | None = None
    format: Format | None = Field(default=None, description="Inferred from the extension if unset.")
    id_column: str | None = Field(default=None, description="A column that identifies each row.")

    @model_validator(mode="after")
    def _one_source(self) -> InputSpec:
        if (self.path is None) == (self.rows is None):
            raise ValueError("give exactly one of 'path' or 'rows'")
        return self


class MessageTemplate(_Strict):
    role: Literal["system", "user", "assistant", "developer"]
    content: str


class StepSpec(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    deployment: str
    task: Task | None = None
    messages: list[MessageTemplate] | None = None
    prompt: str | None = None
    input: str | None = None
    sampling_params: dict[str, Any] = Field(default_factory=dict)
    response_format: dict[str, Any] | None = None
    output_column: str = Field(pattern=_COLUMN)
    output_json_field: str | None = Field(
        default=None, description="Parse the answer as JSON and keep this field of it."
    )
    output_field: str | None = Field(
        default=None,
        description="Which of the step's output columns (rows.OUTPUT_SCHEMA) goes to "
        "output_column: reasoning_content, tool_calls, logprobs, samples... Default: the answer.",
    )
    # How the step's processor talks to the deployment (see ProcessorConfig).
    batch_size: PositiveInt | None = None
    concurrency: PositiveInt | None = None
    max_in_flight_batches: PositiveInt | None = None
    timeout_s: float | None = Field(default=None, gt=0)
    max_retries: int | None = Field(default=None, ge=0)
    on_error: Literal["record", "raise"] | None = None

    @model_validator(mode="after")
    def _one_template(self) -> StepSpec:
        given = [k for k in ("messages", "prompt", "input") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give one template, not {' and '.join(given)}")
        inferred = TASK_OF_INPUT
        if given and self.task and self.task != inferred[given[0]]:
            raise ValueError(
                f"task {self.task!r} reads '{INPUT_COLUMN[self.task]}', not '{given[0]}'"
            )
        if self.task is None:
            self.task = inferred[given[0]] if given else "chat"
        if self.output_field is not None:
            written = [f.name for f in output_fields(self.task) if not f.by_stage]
            if self.output_field not in written:
                raise ValueError(
                    f"output_field {self.output_field!r} is not an output of task "
                    f"{self.task!r}; one of {', '.join(written)}"
                )
        return self

    @property
    def template_key(self) -> str:
        return INPUT_COLUMN[self.task or "chat"]

    def processor_config(self) -> ProcessorConfig:
        params = dict(self.sampling_params)
        if self.response_format is not None:
            params["response_format"] = self.response_format
        tuning = {
            k: getattr(self, k)
            for k in (
                "batch_size",
                "concurrency",
                "max_in_flight_batches",
                "timeout_s",
                "max_retries",
                "on_error",
            )
            if getattr(self, k) is not None
        }
        return ProcessorConfig(
            deployment=self.deployment, task=self.task, sampling_params=params, **tuning
        )


class OutputSpec(_Strict):
    path: str
    format: Format | None = None
    columns: list[str] | None = Field(default=None, description="Keep only these columns.")


class PipelineSpec(_Strict):
    deployments: list[DeploymentConfig] = Field(min_length=1)
    input: InputSpec
    steps: list[StepSpec] = Field(min_length=1)
    output: OutputSpec | None = Field(default=None, description="Unset: rows go to stdout.")


# -- templates ----------------------------------------------------------------------------

_FORMATTER = string.Formatter()


def template_fields(template: str) -> list[str]:
    """The ``{column}`` names in ``template`` (``{{``/``}}`` are literal braces)."""
    return [name for _, name, _, _ in _FORMATTER.parse(template) if name is not None]


def render(template: str, row: dict[str, Any]) -> str:
    """Fill ``template`` from ``row``. A missing or empty column raises ``LookupError``."""
    out = []
    for literal, name, spec, conversion in _FORMATTER.parse(template):
        out.append(literal)
        if name is None:
            continue
        if name not in row:
            raise LookupError(f"the row has no column {name!r}")
        value = row[name]
        if value is None:
            raise LookupError(f"column {name!r} is empty")
        if isinstance(value, (dict, list)):
            value = json.dumps(value, ensure_ascii=False)
        value = _FORMATTER.convert_field(value, conversion) if conversion else value
        out.append(format(value, spec or ""))
    return "".join(out)


# -- loading ------------------------------------------------------------------------------

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
    located: _Located

    def error(self, loc: Loc, message: str) -> PipelineError:
        return self.located.error([(loc, message)])

    def deployment(self, name: str) -> DeploymentConfig:
        return next(d for d in self.spec.deployments if d.name == name)

    def check_backends(self) -> None:
        """Backends installed, options valid, every step's task served. No cluster needed."""
        from relayllm.deployments import resolve, unserved_task_message

        problems: list[tuple[Loc, str]] = []
        for i, config in enumerate(self.spec.deployments):
            try:
                backend, options = resolve(config)
            except RelayLLMError as exc:  # bad options, unknown backend, engine not installed
                problems.extend(_deployment_problems(exc, i, config))
                continue
            served = backend.tasks_for(options)
            supported = backend.features_for(options)
            for j, step in enumerate(self.spec.steps):
                if step.deployment != config.name:
                    continue
                if step.task not in served:
                    problems.append(
                        (
                            ("steps", j, "task"),
                            unserved_task_message(config.name, config.backend, step.task, served),
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
            for loc, template in _templates(step, ("steps", i)):
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


def _templates(step: StepSpec, loc: Loc) -> Iterator[tuple[Loc, str]]:
    if step.messages is not None:
        for k, message in enumerate(step.messages):
            yield (*loc, "messages", k, "content"), message.content
    for key in ("prompt", "input"):
        value = getattr(step, key)
        if value is not None:
            yield (*loc, key), value


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
    located = _parse_yaml(text, source)
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
        pipeline.check_columns(_columns_of_rows(spec.input.rows))
    else:
        pipeline.check_columns(None)
    return pipeline


def _data_loc(loc: tuple[Any, ...], data: Any) -> Loc:
    """Pydantic's loc without the union-member labels it inserts (e.g. 'str', 'list[str]')."""
    out: list[str | int] = []
    node = data
    for part in loc:
        if (
            isinstance(node, dict)
            and part in node
            or isinstance(node, list)
            and isinstance(part, int)
            and part < len(node)
        ):
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


def _pydantic_message(error: dict[str, Any]) -> str:
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
        if step.output_column in OUTPUT_COLUMNS or step.output_column.startswith(_HIDDEN):
            problems.append(
                ((*loc, "output_column"), f"{step.output_column!r} is reserved; pick another name")
            )
        if step.output_json_field and step.task == "embedding":
            problems.append(((*loc, "output_json_field"), "an embedding is not JSON text"))
        for t_loc, template in _templates(step, loc):
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


def _columns_of_rows(rows: list[dict[str, Any]]) -> list[str]:
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    return list(columns)


def not_utf8(path: str, exc: UnicodeDecodeError) -> ConfigError:
    """The error for a file that is not UTF-8 text: the file, the first bad line, what to do."""
    where = path
    try:
        with open(path, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError as bad:
                    where, exc = f"{path}:{number}", bad
                    break
    except OSError:
        pass
    byte = exc.object[exc.start]
    return ConfigError(
        f"{where}: not UTF-8 text ({exc.reason}: byte {byte:#04x}); save the file "
        f"as UTF-8 (e.g. `iconv -f LATIN1 -t UTF-8 FILE`)"
    )


def peek_columns(paths: list[str], fmt: str, sample: int = 100) -> list[str] | None:
    """The columns of local input files, read from their first rows (None for remote ones).
    A file that is not UTF-8 text fails here, naming it, before anything starts."""
    files = _local_files(paths, fmt)
    if files is None:
        return None
    if not files:
        return []
    try:
        return _columns_of_file(files[0], fmt, sample)
    except UnicodeDecodeError as exc:
        raise not_utf8(files[0], exc) from None


def _columns_of_file(first: str, fmt: str, sample: int) -> list[str]:
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return list(pq.read_schema(first).names)
    if fmt == "csv":
        import csv

        with open(first, newline="", encoding="utf-8") as handle:
            return next(csv.reader(handle), [])
    columns: dict[str, None] = {}
    with open(first, encoding="utf-8") as handle:
        if fmt == "json":
            rows = json.load(handle)
            rows = rows if isinstance(rows, list) else [rows]
            return _columns_of_rows([r for r in rows[:sample] if isinstance(r, dict)])
        for n, line in enumerate(handle):
            if n >= sample:
                break
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"{first}:{n + 1}: not valid JSON: {exc.msg}") from None
                if isinstance(row, dict):
                    columns.update(dict.fromkeys(row))
    return list(columns)


def count_rows(
    pipeline: Pipeline, input_override: str | None = None, limit: int | None = None
) -> int | None:
    """The number of input rows when it is cheap to know (inline rows, local JSON-lines and
    Parquet files), for the progress display's totals; None otherwise."""
    count: int | None = None
    if pipeline.spec.input.rows is not None and not input_override:
        count = len(pipeline.spec.input.rows)
    else:
        paths = pipeline.input_paths(input_override)
        fmt = pipeline.input_format(paths)
        files = _local_files(paths, fmt)
        if files is not None and fmt in ("jsonl", "parquet"):
            count = 0
            for path in files:
                if fmt == "parquet":
                    import pyarrow.parquet as pq

                    count += pq.read_metadata(path).num_rows
                else:
                    with open(path, "rb") as handle:
                        count += sum(1 for line in handle if line.strip())
    if limit is not None and count is not None:
        count = min(count, limit)
    return count


def _local_files(paths: list[str], fmt: str) -> list[str] | None:
    files: list[str] = []
    for path in paths:
        if "://" in path:
            return None
        if os.path.isdir(path):
            files += [
                os.path.join(path, n)
                for n in sorted(os.listdir(path))
                if EXTENSIONS.get(Path(n).suffix.lower()) == fmt
            ]
        else:
            files.append(path)
    return files


# -- running ------------------------------------------------------------------------------

_HIDDEN = "__relayllm_"
ERROR_COLUMN = ERROR
_ERROR = f"{_HIDDEN}error"  # the first failure of the row, across steps (the stage's own
# 'error' column is rewritten by every step)


class _Prepare:
    """Preprocess of one step: fill the template into the column the task reads."""

    def __init__(self, index: int, step: StepSpec) -> None:
        self.index, self.step = index, step
        self.key = step.template_key

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        row = dict(row)
        p = f"{_HIDDEN}{self.index}_"
        row[f"{p}t0"] = time.time()
        problem = None
        if row.get(_ERROR):
            problem = "skipped: an earlier step failed"
        value: Any = row.get(self.key)
        try:
            if self.step.messages is not None:
                value = [
                    {"role": m.role, "content": render(m.content, row)} for m in self.step.messages
                ]
            elif self.step.prompt is not None:
                value = render(self.step.prompt, row)
            elif self.step.input is not None:
                value = render(self.step.input, row)
        except LookupError as exc:
            problem = problem or f"step {self.step.name!r}: {exc.args[0]}"
        if self.key in row and self._has_template():
            row[f"{p}saved"] = json.dumps(row[self.key])  # an input column of the same name
        row[self.key] = None if problem else value
        row[f"{p}skip"] = problem
        return row

    def _has_template(self) -> bool:
        return any(getattr(self.step, k) is not None for k in ("messages", "prompt", "input"))


class _Finish:
    """Postprocess of one step: the answer to ``output_column``, numbers to hidden columns."""

    def __init__(self, index: int, step: StepSpec) -> None:
        self.index, self.step = index, step

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        row = dict(row)
        p = f"{_HIDDEN}{self.index}_"
        step = self.step
        out = {name: row.pop(name, None) for name in OUTPUT_COLUMNS}
        skip = row.pop(f"{p}skip", None)
        saved = row.pop(f"{p}saved", None)
        key = step.template_key
        if saved is not None:
            row[key] = json.loads(saved)
        elif step.messages is not None or step.prompt is not None or step.input is not None:
            row.pop(key, None)
        error = skip or (f"step {step.name!r}: {out[ERROR]}" if out[ERROR] else None)
        value = out[step.output_field or ANSWER_COLUMN[step.task]]
        if not error and step.output_json_field:
            value, error = _json_field(value, step)
        row[step.output_column] = None if error else value
        if error and not row.get(_ERROR):
            row[_ERROR] = error
        row.setdefault(_ERROR, None)
        row[f"{p}in"] = out[NUM_INPUT_TOKENS] or 0
        row[f"{p}out"] = out[NUM_GENERATED_TOKENS] or 0
        row[f"{p}failed"] = error is not None
        row[f"{p}t1"] = time.time()
        return row


def _json_field(text: Any, step: StepSpec) -> tuple[Any, str | None]:
    field_name = step.output_json_field
    try:
        parsed = json.loads(text)
    except (TypeError, json.JSONDecodeError):
        return None, f"step {step.name!r}: the answer is not JSON: {str(text)[:80]!r}"
    if not isinstance(parsed, dict) or field_name not in parsed:
        return (
            None,
            f"step {step.name!r}: the answer has no field {field_name!r}: {str(text)[:80]!r}",
        )
    return parsed[field_name], None


@dataclass
class StepStats:
    name: str
    deployment: str
    rows: int = 0
    errors: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    first_start: float = float("inf")
    last_end: float = 0.0

    @property
    def wall_s(self) -> float:
        return max(self.last_end - self.first_start, 0.0) if self.rows else 0.0

    def rate(self, amount: int) -> float:
        return amount / self.wall_s if self.wall_s > 0 else 0.0


@dataclass
class RunSummary:
    steps: list[StepStats]
    rows: int = 0
    errors: int = 0
    wall_s: float = 0.0
    output: str | None = None
    already_done: int = 0  # rows a resumed run found in its output and did not run again
    started: list[str] = field(default_factory=list)
    startup_s: float = 0.0  # connecting and deploying, before the first row (the CLI's)


Sink = Callable[[list[dict[str, Any]]], None]


def open_dataset(pipeline: Pipeline, input_override: str | None = None, limit: int | None = None):
    """The input as a Ray Dataset, columns checked against the templates first."""
    import ray
    from ray.data import DataContext

    # Rows come out in input order. Set before the dataset exists: a dataset keeps the context
    # it was created with, and a read of small tasks otherwise finishes blocks out of order.
    DataContext.get_current().execution_options.preserve_order = True
    spec = pipeline.spec.input
    if spec.rows is not None and not input_override:
        dataset = ray.data.from_items(spec.rows)
    else:
        paths = pipeline.input_paths(input_override)
        fmt = pipeline.input_format(paths)
        columns = peek_columns(paths, fmt)
        if columns is not None:
            pipeline.check_columns(columns)
        reader = {
            "jsonl": ray.data.read_json,
            "json": ray.data.read_json,
            "csv": ray.data.read_csv,
            "parquet": ray.data.read_parquet,
        }[fmt]
        # A read asks one whole CPU by default: next to an engine replica and the stage
        # actors on a small machine it may never be scheduled (relayllm.resources).
        dataset = reader(
            paths if len(paths) > 1 else paths[0], ray_remote_args={"num_cpus": TASK_NUM_CPUS}
        )
        if columns is None:
            pipeline.check_columns(list(dataset.schema().names))
    if limit is not None:
        dataset = dataset.limit(limit)
    return dataset


def build_steps(pipeline: Pipeline, dataset):
    """Chain the steps' processors on ``dataset`` (lazy)."""
    for i, step in enumerate(pipeline.spec.steps):
        prepare = _named(_Prepare(i, step), f"prepare[{step.name}]")
        finish = _named(_Finish(i, step), f"finish[{step.name}]")
        processor = build_processor(step.processor_config(), prepare, finish)
        dataset = processor(dataset)
    return dataset


def _named(
    fn: Callable[[dict[str, Any]], dict[str, Any]], name: str
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A function wrapper: Ray Data names an operator (and its progress bar) after it."""

    def call(row: dict[str, Any]) -> dict[str, Any]:
        return fn(row)

    call.__name__ = call.__qualname__ = name
    return call


def task_operators(pipeline: Pipeline) -> int:
    """Ray Data task operators the pipeline runs at once, after Ray Data fuses neighbouring
    maps: the read, the first step's template fill, each step's parse with the next step's
    fill, and the last parse."""
    return len(pipeline.spec.steps) + 2


def check_fit(pipeline: Pipeline, running: set[str] | None = None) -> None:
    """Fail before any engine starts if the pipeline's engines (those not ``running``
    already), stage actors and tasks cannot all be scheduled at once on the cluster.
    Needs a connection to Ray; :class:`relayllm.ResourceFitError` says what to change."""
    from relayllm import resources

    running = running or set()
    demands = [
        resources.engine_demand(d) for d in pipeline.spec.deployments if d.name not in running
    ]
    for step in pipeline.spec.steps:
        config = step.processor_config()
        demands.append(resources.stage_demand(step.name, config.num_cpus, config.concurrency))
    demands.append(resources.task_demand(task_operators(pipeline)))
    free, total, nodes = resources.cluster_view()
    resources.check_fit(demands, free, total, nodes)


def deploy_all(pipeline: Pipeline, address: str | None = None) -> list[str]:
    """Start (or reuse by name) every deployment; returns the names this call started.
    First checks that the whole pipeline fits on the cluster (:func:`check_fit`)."""
    import relayllm

    running = {r.name for r in relayllm.list_deployments(address=address)}
    check_fit(pipeline, running)
    started = []
    for config in pipeline.spec.deployments:
        relayllm.deploy(config, address=address)
        if config.name not in running:
            started.append(config.name)
    return started


def execute(
    pipeline: Pipeline, dataset, sink: Sink, progress: Callable[[RunSummary], None] | None = None
) -> RunSummary:
    """Run the steps and hand every finished block of rows to ``sink`` (input order);
    ``progress`` sees the summary so far after each block."""
    from ray.data import DataContext

    DataContext.get_current().execution_options.preserve_order = True
    steps = pipeline.spec.steps
    summary = RunSummary([StepStats(s.name, s.deployment) for s in steps])
    start = time.time()
    output = build_steps(pipeline, flush_blocks(pipeline, dataset))
    # A dataset runs with the copy of the DataContext taken when it was created (open_dataset
    # ran before this function): input order must be set on that copy.
    output.context.execution_options.preserve_order = True
    for batch in output.iter_batches(batch_format="pyarrow", batch_size=None):
        rows = batch.to_pylist()
        for row in rows:
            for i, stats in enumerate(summary.steps):
                p = f"{_HIDDEN}{i}_"
                stats.rows += 1
                stats.errors += bool(row[f"{p}failed"])
                stats.input_tokens += row[f"{p}in"]
                stats.output_tokens += row[f"{p}out"]
                stats.first_start = min(stats.first_start, row[f"{p}t0"])
                stats.last_end = max(stats.last_end, row[f"{p}t1"])
            summary.errors += bool(row.get(_ERROR))
        visible = [_visible(row) for row in rows]
        sink(visible)
        summary.rows += len(rows)
        if progress:
            progress(summary)
    summary.wall_s = time.time() - start
    return summary


def flush_blocks(pipeline: Pipeline, dataset):
    """Cut the input into blocks no larger than one Ray Data batch of the first step.

    A block reaches the output (and the disk) only when every row of it has passed every
    step, and a reader makes one block of a whole small file: a 400-row file would be written
    at the very end, and a kill would lose all of it. With blocks of at most one stage batch
    (``batch_size * max_in_flight_batches`` rows, what one stage actor has in flight anyway)
    a stop loses at most the rows in flight. Ray Data's streaming repartition; no shuffle.
    """
    config = pipeline.spec.steps[0].processor_config()
    # strict: without it, small blocks are merged and larger ones left whole (a 400-row block).
    rows = config.batch_size * config.max_in_flight_batches
    blocks = dataset.repartition(target_num_rows_per_block=rows, strict=True)
    # Its tasks would ask a whole CPU each, which next to an engine replica on a small machine
    # may never be scheduled (relayllm.resources); repartition() takes no ray_remote_args in
    # Ray 2.60, so they are set on the operator it adds.
    blocks._logical_plan.dag.ray_remote_args["num_cpus"] = TASK_NUM_CPUS
    return blocks


def _visible(row: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in row.items() if not k.startswith(_HIDDEN)}
    out[ERROR_COLUMN] = row.get(_ERROR)
    return out


__all__ = [
    "ERROR_COLUMN",
    "EXTENSIONS",
    "InputSpec",
    "OutputSpec",
    "Pipeline",
    "PipelineError",
    "PipelineSpec",
    "RunSummary",
    "StepSpec",
    "StepStats",
    "build_steps",
    "check_fit",
    "count_rows",
    "deploy_all",
    "execute",
    "flush_blocks",
    "load_pipeline",
    "open_dataset",
    "parse_pipeline",
    "peek_columns",
    "render",
    "task_operators",
    "template_fields",
]
