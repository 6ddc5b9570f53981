"""The row protocol's outputs: the columns the stage adds to every row (names, Arrow types,
for which tasks), and what a deployment returns for one row. (The inputs:
:mod:`relayllm.rows.inputs`.)"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Final, TypedDict

from relayllm.rows.inputs import Task

# Output column names, for the code that reads one by meaning (the answer, the error).
GENERATED_TEXT = "generated_text"
FINISH_REASON = "finish_reason"
NUM_INPUT_TOKENS = "num_input_tokens"
NUM_GENERATED_TOKENS = "num_generated_tokens"
EMBEDDING = "embedding"
LABEL = "label"  # classify: the most likely class's name
PROBS = "probs"  # classify: every class's probability, in the model's label order
SCORE = "score"  # score: the relevance of the document to the query
LOGPROBS = "logprobs"
PROMPT_LOGPROBS = "prompt_logprobs"
TOOL_CALLS = "tool_calls"
REASONING_CONTENT = "reasoning_content"
SAMPLES = "samples"
#: The weights that produced the answer: the ``version`` of the deployment's last weight update
#: (``relayllm.control(name).update_weights``) when the row entered the engine; null on a
#: deployment never updated and on a row that never reached an engine.
WEIGHT_VERSION: Final = "weight_version"  # Final: a TypedDict key in the replica
#: The row's engine time in seconds, stamped by the replica: its call's share of the engine's
#: busy time (each moment divided among the calls in the engine at once) split across the
#: call's rows by their tokens; the rows' times add up to the replica's ``engine_busy_s``.
#: Null on a row that never reached an engine.
ENGINE_S: Final = "engine_s"
REQUEST_ID = "request_id"
ERROR = "error"


@dataclass(frozen=True)
class OutputField:
    """One output column: its name, its Arrow type, and for which tasks the stage writes it.

    A new protocol feature (logprobs, n samples, tool calls...) is one more entry in
    :data:`OUTPUT_SCHEMA`: the stage, the pipeline and the batch format iterate over it.
    """

    name: str
    #: ``"string"``, ``"int64"``, ``"list<float32>"`` or a nested kind (see :func:`arrow_types`).
    kind: str
    #: Tasks whose rows get this column (None: every task).
    tasks: frozenset[Task] | None = None
    #: Written by the stage itself (not taken from the deployment's result).
    by_stage: bool = False

    def arrow_type(self) -> Any:

        return arrow_types()[self.kind]

    def written_for(self, task: Task) -> bool:
        return self.tasks is None or task in self.tasks


def arrow_types() -> dict[str, Any]:
    """Arrow type of each output kind. The nested ones keep OpenAI's shapes, so a row's
    ``logprobs`` or ``tool_calls`` read back from Parquet or JSON lines is what OpenAI's chat
    response has under ``choices[i].logprobs.content`` / ``choices[i].message.tool_calls``."""
    import pyarrow as pa  # here, not at import: ``import relayllm`` stays light

    top = pa.struct([("token", pa.string()), ("logprob", pa.float64())])
    # One entry per token: the chosen token, its logprob (null for a prompt's first token)
    # and the most likely alternatives when top_logprobs / prompt_logprobs asked for them.
    logprobs = pa.list_(
        pa.struct(
            [("token", pa.string()), ("logprob", pa.float64()), ("top_logprobs", pa.list_(top))]
        )
    )
    function = pa.struct([("name", pa.string()), ("arguments", pa.string())])
    tool_calls = pa.list_(
        pa.struct([("id", pa.string()), ("type", pa.string()), ("function", function)])
    )
    # n > 1: every sample, the first one also in the row's own columns.
    sample = pa.struct(
        [
            (GENERATED_TEXT, pa.string()),
            (FINISH_REASON, pa.string()),
            (NUM_GENERATED_TOKENS, pa.int64()),
            (LOGPROBS, logprobs),
            (TOOL_CALLS, tool_calls),
            (REASONING_CONTENT, pa.string()),
        ]
    )
    return {
        "string": pa.string(),
        "int64": pa.int64(),
        "float64": pa.float64(),
        "list<float32>": pa.list_(pa.float32()),
        "logprobs": logprobs,
        "tool_calls": tool_calls,
        "samples": pa.list_(sample),
    }


_TEXT: frozenset[Task] = frozenset({"chat", "completion"})
_CHAT: frozenset[Task] = frozenset({"chat"})

#: The columns a processor adds to every row, in this order. The optional ones (logprobs,
#: tool calls, reasoning, samples) are null unless the request asked for them.
OUTPUT_SCHEMA: tuple[OutputField, ...] = (
    OutputField(GENERATED_TEXT, "string"),
    OutputField(FINISH_REASON, "string"),
    OutputField(NUM_INPUT_TOKENS, "int64"),
    OutputField(NUM_GENERATED_TOKENS, "int64"),
    OutputField(EMBEDDING, "list<float32>", tasks=frozenset({"embedding"})),
    OutputField(LABEL, "string", tasks=frozenset({"classify"})),
    OutputField(PROBS, "list<float32>", tasks=frozenset({"classify"})),
    OutputField(SCORE, "float64", tasks=frozenset({"score"})),
    OutputField(LOGPROBS, "logprobs", tasks=_TEXT),
    OutputField(PROMPT_LOGPROBS, "logprobs", tasks=_TEXT),
    OutputField(TOOL_CALLS, "tool_calls", tasks=_CHAT),
    OutputField(REASONING_CONTENT, "string", tasks=_CHAT),
    OutputField(SAMPLES, "samples", tasks=_TEXT),
    OutputField(WEIGHT_VERSION, "string"),
    OutputField(ENGINE_S, "float64"),
    OutputField(REQUEST_ID, "string", by_stage=True),
    OutputField(ERROR, "string"),
)
#: Every output column name (a pipeline may not use one for its own output).
OUTPUT_COLUMNS: tuple[str, ...] = tuple(f.name for f in OUTPUT_SCHEMA)
#: The column holding a task's answer.
ANSWER_COLUMN: dict[Task, str] = {
    "chat": GENERATED_TEXT,
    "completion": GENERATED_TEXT,
    "embedding": EMBEDDING,
    "classify": LABEL,
    "score": SCORE,
}
EMBEDDING_COLUMN = EMBEDDING  # older name, kept for adapters that import it


@functools.cache
def output_fields(task: Task) -> tuple[OutputField, ...]:
    """The output columns the stage writes for ``task``."""
    return tuple(f for f in OUTPUT_SCHEMA if f.written_for(task))


class Result(TypedDict, total=False):
    """What a deployment returns for one row: a value, never an exception."""

    generated_text: str | None
    finish_reason: str | None
    num_input_tokens: int | None
    num_generated_tokens: int | None
    embedding: list[float] | None
    label: str | None
    probs: list[float] | None
    score: float | None
    logprobs: list[dict[str, Any]] | None
    prompt_logprobs: list[dict[str, Any]] | None
    tool_calls: list[dict[str, Any]] | None
    reasoning_content: str | None
    samples: list[dict[str, Any]] | None
    weight_version: str | None  # stamped by the replica (BatchDeployment), not the adapter
    engine_s: float | None  # stamped by the replica too
    error: str | None


def error_result(message: str, **fields: Any) -> Result:
    """A failed row's result: ``message`` is its ``error`` (plus any counts still known)."""
    return {ERROR: message, **fields}  # type: ignore[misc]


__all__ = [
    "GENERATED_TEXT",
    "FINISH_REASON",
    "NUM_INPUT_TOKENS",
    "NUM_GENERATED_TOKENS",
    "EMBEDDING",
    "LABEL",
    "PROBS",
    "SCORE",
    "LOGPROBS",
    "PROMPT_LOGPROBS",
    "TOOL_CALLS",
    "REASONING_CONTENT",
    "SAMPLES",
    "WEIGHT_VERSION",
    "ENGINE_S",
    "REQUEST_ID",
    "ERROR",
    "OutputField",
    "arrow_types",
    "OUTPUT_SCHEMA",
    "OUTPUT_COLUMNS",
    "ANSWER_COLUMN",
    "EMBEDDING_COLUMN",
    "output_fields",
    "Result",
    "error_result",
]
