"""The pipeline file's model: deployments, input, steps, output (pydantic, strict keys)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from relayllm.config import ProcessorConfig, ProcessorSettings
from relayllm.deployments import DeploymentConfig
from relayllm.rows import (
    EXTRA_INPUT_COLUMNS,
    INPUT_COLUMN,
    TASK_OF_INPUT,
    Task,
    output_fields,
)

#: A step's template keys, one per task (the input column it fills).
TEMPLATE_KEYS = ("messages", "prompt", "input", "text", "query")
#: Templates of a single string (the rest: ``messages``); ``document`` fills score's second
#: input column.
STRING_TEMPLATES = ("prompt", "input", "text", "query", "document")

#: Columns starting with this are the run's own bookkeeping, hidden from the output.
HIDDEN_PREFIX = "__relayllm_"
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

    path: str | list[str] | None = Field(
        default=None,
        description="A file, a directory, a glob, or a list of them (jsonl, json, csv, "
        "parquet); relative to the pipeline file's folder.",
    )
    rows: list[dict[str, Any]] | None = Field(
        default=None, description="Rows written inline, instead of path."
    )
    format: Format | None = Field(default=None, description="Inferred from the extension if unset.")
    id_column: str | None = Field(default=None, description="A column that identifies each row.")

    @model_validator(mode="after")
    def _one_source(self) -> InputSpec:
        if (self.path is None) == (self.rows is None):
            raise ValueError("give exactly one of 'path' or 'rows'")
        return self


class TextPart(_Strict):
    type: Literal["text"] = Field(description="A text part of a message's content.")
    text: str = Field(description="A template: {column} is replaced by the row's value.")


class ImageURL(_Strict):
    url: str = Field(
        description="http(s)://, data: or a local file; a relative path is read from the "
        "pipeline file's folder (as input.path)."
    )
    detail: Literal["auto", "low", "high"] | None = Field(
        default=None, description="OpenAI's image detail, passed to the backend."
    )


class ImagePart(_Strict):
    type: Literal["image_url"] = Field(description="An image part of a message's content.")
    image_url: ImageURL = Field(description="Where the image is read from.")


#: A part of a message's content, in OpenAI's shape; ``text`` and ``image_url.url`` are
#: templates.
ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class MessageTemplate(_Strict):
    role: Literal["system", "user", "assistant", "developer"] = Field(
        description="The message's role, as in OpenAI's chat format."
    )
    content: str | Annotated[list[ContentPart], Field(min_length=1)] = Field(
        description="A template string, or OpenAI content parts (text and image_url)."
    )


class StepSpec(ProcessorSettings):
    """One step: a processor on a named deployment (every :class:`ProcessorSettings` field is
    a key of the step), its template and where its answer goes."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        description="The step's name, in progress lines, errors and the run's summary.",
    )
    deployment: str = Field(description=ProcessorConfig.model_fields["deployment"].description)
    task: Task | None = Field(
        default=None, description="Inferred from the template key given (default: chat)."
    )
    messages: list[MessageTemplate] | None = Field(
        default=None, description="Chat template: the messages sent for each row."
    )
    prompt: str | None = Field(default=None, description="Completion template.")
    input: str | None = Field(default=None, description="Embedding template.")
    text: str | None = Field(default=None, description="Classify template.")
    query: str | None = Field(default=None, description="Score template, with document.")
    document: str | None = Field(default=None, description="Score: the document's template.")
    sampling_params: dict[str, Any] = Field(
        default_factory=dict,
        description=ProcessorConfig.model_fields["sampling_params"].description,
    )
    response_format: dict[str, Any] | None = Field(
        default=None,
        description="OpenAI's response_format (json_schema, json_object) for every row.",
    )
    output_column: str = Field(
        pattern=_COLUMN, description="The column the step's answer is written to."
    )
    output_json_field: str | None = Field(
        default=None, description="Parse the answer as JSON and keep this field of it."
    )
    output_field: str | None = Field(
        default=None,
        description="Which of the step's output columns (rows.OUTPUT_SCHEMA) goes to "
        "output_column: reasoning_content, tool_calls, logprobs, samples... Default: the answer.",
    )

    @model_validator(mode="after")
    def _one_template(self) -> StepSpec:
        given = [k for k in TEMPLATE_KEYS if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give one template, not {' and '.join(given)}")
        inferred = TASK_OF_INPUT
        if given and self.task and self.task != inferred[given[0]]:
            raise ValueError(
                f"task {self.task!r} reads '{INPUT_COLUMN[self.task]}', not '{given[0]}'"
            )
        if self.task is None:
            self.task = inferred[given[0]] if given else "chat"
        for extra in ("document",):
            if getattr(self, extra) is not None and extra not in EXTRA_INPUT_COLUMNS.get(
                self.task, ()
            ):
                raise ValueError(f"task {self.task!r} reads no '{extra}' (task 'score' does)")
        if self.output_field is not None:
            written = [f.name for f in output_fields(self.resolved_task) if not f.by_stage]
            if self.output_field not in written:
                raise ValueError(
                    f"output_field {self.output_field!r} is not an output of task "
                    f"{self.task!r}; one of {', '.join(written)}"
                )
        return self

    @property
    def template_key(self) -> str:
        return INPUT_COLUMN[self.resolved_task]

    @property
    def resolved_task(self) -> Task:
        """The task, once validation has inferred it (never None after that)."""
        return self.task or "chat"

    def processor_config(self) -> ProcessorConfig:
        params = dict(self.sampling_params)
        if self.response_format is not None:
            params["response_format"] = self.response_format
        return ProcessorConfig(
            deployment=self.deployment,
            task=self.resolved_task,
            sampling_params=params,
            **self.settings(),
        )


class OutputSpec(_Strict):
    path: str = Field(description="The output file (jsonl, json, csv or parquet).")
    format: Format | None = Field(default=None, description="Inferred from the extension if unset.")
    columns: list[str] | None = Field(default=None, description="Keep only these columns.")


class PipelineSpec(_Strict):
    deployments: list[DeploymentConfig] = Field(
        min_length=1, description="The deployments the steps use: started, or reused if running."
    )
    input: InputSpec = Field(description="Where rows come from.")
    steps: list[StepSpec] = Field(min_length=1, description="Run in order, each on every row.")
    output: OutputSpec | None = Field(default=None, description="Unset: rows go to stdout.")
