"""Per-step row transforms: fill a step's template into the column its task reads, and put
its answer in ``output_column`` and the version of the weights that answered it in
``<output_column>_weight_version`` (:func:`version_column`: each step its own, since an
update may fall between two steps of one row); the run's own numbers travel in hidden
columns."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from relayllm import compat
from relayllm.blocks import block_rows, stage_batch
from relayllm.fit import TASK_NUM_CPUS
from relayllm.pipelines.spec import HIDDEN_PREFIX, StepSpec
from relayllm.pipelines.templates import render, render_content
from relayllm.processor import build_processor
from relayllm.routing import key_hash
from relayllm.rows import (
    ANSWER_COLUMN,
    ENGINE_S,
    ERROR,
    EXTRA_INPUT_COLUMNS,
    NUM_GENERATED_TOKENS,
    NUM_INPUT_TOKENS,
    WEIGHT_VERSION,
    output_fields,
)

if TYPE_CHECKING:
    from pathlib import Path

    import pyarrow as pa

    from relayllm.pipelines.pipeline import Pipeline

ERROR_COLUMN = ERROR
#: A row's lineage, set before its first step: its id_column's value, else the hash of its
#: input columns (resume's identity of a row); every step's calls are keyed by it, so a row's
#: steps prefer one replica (relayllm.stage.affinity).
LINEAGE = f"{HIDDEN_PREFIX}row"
FIRST_ERROR = f"{HIDDEN_PREFIX}error"  # the first failure of the row, across steps (the
# stage's own 'error' column is rewritten by every step)


def version_column(step: StepSpec) -> str:
    """The column of a step's weight version: null for a row the step did not answer and
    for a deployment never updated (``update_weights``)."""
    return f"{step.output_column}_{WEIGHT_VERSION}"


def step_prefix(index: int) -> str:
    """The hidden columns of step ``index``: ``t0``/``t1`` (its start and end), ``in``/``out``
    (tokens), ``engine`` (engine seconds) and ``failed``, read by the run's statistics."""
    return f"{HIDDEN_PREFIX}{index}_"


class _Prepare:
    """Preprocess of one step: fill the template into the column the task reads."""

    def __init__(
        self, index: int, step: StepSpec, base_dir: Path | None = None, id_column: str | None = None
    ) -> None:
        self.index, self.step, self.base_dir = index, step, base_dir
        self.id_column = id_column
        self.key = step.template_key
        # Per step, not per row: this runs for every row of the step.
        self.prefix = step_prefix(index)
        self.templated = has_template(step)
        self.extras = filled_extras(step)
        self.string_template = None if step.messages is not None else getattr(step, self.key)

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        row = dict(row)
        p = self.prefix
        if LINEAGE not in row:  # the first step
            row[LINEAGE] = lineage(row, self.id_column)
        row[f"{p}t0"] = time.time()
        problem = None
        if row.get(FIRST_ERROR):
            problem = "skipped: an earlier step failed"
        value: Any = row.get(self.key)
        try:
            if self.step.messages is not None:
                value = [
                    {"role": m.role, "content": render_content(m.content, row, self.base_dir)}
                    for m in self.step.messages
                ]
            elif self.string_template is not None:
                value = render(self.string_template, row)
            # Further input columns with a template of their own (score's ``document``).
            extras: dict[str, str | None] = {
                name: render(getattr(self.step, name), row) for name in self.extras
            }
        except LookupError as exc:
            problem = problem or f"step {self.step.name!r}: {exc.args[0]}"
            extras = dict.fromkeys(self.extras)
        if self.templated and self.key in row:
            row[f"{p}saved"] = json.dumps(row[self.key])  # an input column of the same name
        row[self.key] = None if problem else value
        for name, extra in extras.items():
            if name in row:
                row[f"{p}saved_{name}"] = json.dumps(row[name])
            row[name] = None if problem else extra
        row[f"{p}skip"] = problem
        return row


def lineage(row: dict[str, Any], id_column: str | None) -> str:
    """A row's lineage (:data:`LINEAGE`) from its input columns."""
    if id_column and row.get(id_column) is not None:
        return str(row[id_column])
    inputs = {k: v for k, v in row.items() if not k.startswith(HIDDEN_PREFIX)}
    return key_hash(json.dumps(inputs, sort_keys=True, default=str))


def has_template(step: StepSpec) -> bool:
    """Whether the step fills its input column from a template (else it reads the column)."""
    return getattr(step, step.template_key, None) is not None


def filled_extras(step: StepSpec) -> list[str]:
    """The task's further input columns this step fills from a template of its own."""
    return [n for n in EXTRA_INPUT_COLUMNS.get(step.resolved_task, ()) if getattr(step, n)]


class _Finish:
    """Postprocess of one step: the answer to ``output_column``, numbers to hidden columns."""

    def __init__(self, index: int, step: StepSpec) -> None:
        self.index, self.step = index, step
        # Per step, not per row: this runs for every row of the step.
        self.prefix = step_prefix(index)
        self.fields = [f.name for f in output_fields(step.resolved_task)]
        self.key = step.template_key
        self.templated = has_template(step)
        self.extras = filled_extras(step)
        self.answer = step.output_field or ANSWER_COLUMN[step.resolved_task]
        self.version = version_column(step)

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        row = dict(row)
        p = self.prefix
        step = self.step
        out = {name: row.pop(name, None) for name in self.fields}
        skip = row.pop(f"{p}skip", None)
        saved = row.pop(f"{p}saved", None)
        key = self.key
        if saved is not None:
            row[key] = json.loads(saved)
        elif self.templated:
            row.pop(key, None)
        for name in self.extras:
            saved_extra = row.pop(f"{p}saved_{name}", None)
            if saved_extra is not None:
                row[name] = json.loads(saved_extra)
            else:
                row.pop(name, None)
        error = skip or (f"step {step.name!r}: {out[ERROR]}" if out[ERROR] else None)
        value = out[self.answer]
        if not error and step.output_json_field:
            value, error = _json_field(value, step)
        row[step.output_column] = None if error else value
        row[self.version] = None if skip else out.get(WEIGHT_VERSION)
        if error and not row.get(FIRST_ERROR):
            row[FIRST_ERROR] = error
        row.setdefault(FIRST_ERROR, None)
        row[f"{p}in"] = out[NUM_INPUT_TOKENS] or 0
        row[f"{p}out"] = out[NUM_GENERATED_TOKENS] or 0
        row[f"{p}engine"] = float(out.get(ENGINE_S) or 0.0)
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


def build_steps(pipeline: Pipeline, dataset):
    """Chain the steps' processors on ``dataset`` (lazy)."""
    id_column = pipeline.spec.input.id_column
    for i, step in enumerate(pipeline.spec.steps):
        prepare = _named(_Prepare(i, step, pipeline.base_dir, id_column), f"prepare[{step.name}]")
        finish = _named(_Finish(i, step), f"finish[{step.name}]")
        config = step.processor_config()
        if config.affinity_column is None:  # every step keyed by the row's lineage
            config = config.model_copy(update={"affinity_column": LINEAGE})
        processor = build_processor(config, prepare, finish)
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


#: Ray Data task operators a pipeline runs at once, at most, whatever its steps: the read, and
#: (when the input's size is not known in advance) the repartition that cuts it into blocks
#: (:func:`in_blocks`). The steps' template fills and parses run inside their stage actors.
MAX_TASK_OPERATORS = 2


def input_block_rows(pipeline: Pipeline, total: int | None = None) -> int:
    """Rows per input block of ``pipeline`` (:func:`relayllm.blocks.block_rows`, with the
    stage batch of its first step), for an input of ``total`` rows (None: not known)."""
    config = pipeline.spec.steps[0].processor_config()
    return block_rows(total, stage_batch(config.batch_size, config.max_in_flight_batches))


def in_blocks(pipeline: Pipeline, dataset):
    """Cut an input of unknown size into blocks of :func:`input_block_rows` rows: Ray Data's
    streaming repartition (no shuffle), a task per block. Inputs whose size is known are
    split by their reader instead (``inputs.open_dataset``), which costs nothing extra."""
    # strict: without it, small blocks are merged and larger ones left whole (a 400-row block).
    blocks = dataset.repartition(target_num_rows_per_block=input_block_rows(pipeline), strict=True)
    # Its tasks would ask a whole CPU each, which next to an engine replica on a small machine
    # may never be scheduled (relayllm.fit); repartition() takes no ray_remote_args in
    # Ray 2.60, so they are set on the operator it adds.
    return compat.set_task_num_cpus(blocks, TASK_NUM_CPUS)


def visible_rows(batch: pa.Table) -> list[dict[str, Any]]:
    """A finished block's rows as the output shows them: hidden columns dropped, the first
    error of each row (across steps) in ``error``."""
    first_error = batch.column(FIRST_ERROR)
    table = batch.select([n for n in batch.column_names if not n.startswith(HIDDEN_PREFIX)])
    index = table.schema.get_field_index(ERROR_COLUMN)
    if index >= 0:
        table = table.set_column(index, ERROR_COLUMN, first_error)
    else:
        table = table.append_column(ERROR_COLUMN, first_error)
    return table.to_pylist()
