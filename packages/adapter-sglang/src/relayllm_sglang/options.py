"""What an SGLang deployment is configured with, and how that becomes ``sglang.Engine(...)``.

The first-class options carry SGLang's own names (they are ``ServerArgs`` fields), so an SGLang
user recognises them; anything else goes in ``server_args``, whose names are checked against
the installed sglang's ``ServerArgs`` at deploy time, before an engine starts.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, PositiveInt, field_validator, model_validator

from relayllm.adapters import BackendOptions, ConfigError, did_you_mean
from relayllm_sglang.reasoning import REASONING_PARSERS, reasoning_parser_problem

#: ``server_args`` the adapter cannot work with, and why.
RESERVED_SERVER_ARGS = {
    "skip_tokenizer_init": "the adapter applies chat templates with the engine's tokenizer",
    "server_args": "pass server arguments as a dict of names, not a ServerArgs object",
}


class SGLangOptions(BackendOptions):
    """Options of the ``sglang`` backend (``DeploymentConfig.options``)."""

    model_path: str = Field(min_length=1, description="Model directory or hub id.")
    tokenizer_path: str | None = Field(default=None, description="Defaults to model_path.")
    tp_size: PositiveInt = Field(default=1, description="Tensor parallel size: GPUs per engine.")
    dp_size: PositiveInt = Field(default=1, description="Data parallel copies inside the engine.")
    mem_fraction_static: float | None = Field(
        default=None, gt=0, lt=1, description="GPU memory share for weights and KV cache."
    )
    context_length: PositiveInt | None = Field(
        default=None, description="Longest prompt plus answer in tokens; default: the model's."
    )
    chunked_prefill_size: int | None = Field(default=None, description="-1 disables chunking.")
    max_running_requests: PositiveInt | None = Field(
        default=None, description="Rows the engine runs at once at most; default: SGLang's."
    )
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = Field(
        default="auto", description="Weights' and activations' dtype (SGLang's --dtype)."
    )
    chat_template: str | None = Field(
        default=None, description="Path of a .jinja chat template replacing the model's."
    )
    lora_paths: dict[str, str] | None = Field(
        default=None, description="LoRA adapters by name; rows pick one in their 'model' column."
    )
    reasoning_parser: str | None = Field(
        default=None,
        description="SGLang reasoning parser (as the server's --reasoning-parser: deepseek-r1, "
        "qwen3, glm45, ...) that splits chat answers into reasoning_content and the answer.",
    )
    task: Literal["generate", "embed", "classify", "score"] | None = Field(
        default=None,
        description="What the model serves (relayllm's, as the vllm backend's task): generate: "
        "chat/completion; embed: embedding; classify: label/probs of a sequence-classification "
        "model; score: a cross-encoder's relevance score of a (query, document) pair. The "
        "pooling ones deploy the model with is_embedding. Default: embed when "
        "server_args.is_embedding is true, else generate.",
    )
    server_args: dict[str, Any] = Field(
        default_factory=dict, description="Any other sglang ServerArgs field, by its name."
    )

    @field_validator("chunked_prefill_size")
    @classmethod
    def _chunk(cls, value: int | None) -> int | None:
        if value is not None and value != -1 and value <= 0:
            raise ValueError("must be a positive number of tokens, or -1 to disable chunking")
        return value

    @field_validator("chat_template")
    @classmethod
    def _jinja_file(cls, value: str | None) -> str | None:
        # SGLang's built-in template names only apply to its HTTP server; relayllm renders
        # chats with the engine's tokenizer, which the engine loads a .jinja file into.
        if value is not None and not value.endswith(".jinja"):
            raise ValueError(
                "must be the path of a .jinja chat template file (SGLang's built-in template "
                "names apply only to its HTTP server)"
            )
        return value

    @field_validator("reasoning_parser")
    @classmethod
    def _known_reasoning_parser(cls, value: str | None) -> str | None:
        # Checked against the pinned release's names here, without sglang; the installed
        # release's own registry is checked again at deploy (backend.check_options_against).
        problem = None if value is None else reasoning_parser_problem(value, REASONING_PARSERS)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("lora_paths")
    @classmethod
    def _lora_names(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None:
            for name, path in value.items():
                if not name or not path:
                    raise ValueError("each LoRA adapter needs a non-empty name and path")
        return value

    @model_validator(mode="after")
    def _server_args_do_not_repeat_options(self) -> SGLangOptions:
        for name in self.server_args:
            if name in FIRST_CLASS_OPTIONS:
                raise ValueError(f"server_args.{name}: set {name!r} as an option of its own")
            if name in RESERVED_SERVER_ARGS:
                raise ValueError(f"server_args.{name} is not allowed: {RESERVED_SERVER_ARGS[name]}")
        embedding = self.server_args.get("is_embedding")
        if self.task is not None and embedding is not None and bool(embedding) != self.pooling:
            raise ValueError(
                f"task {self.task!r} contradicts server_args.is_embedding={embedding!r}: "
                "a pooling task (embed, classify, score) runs the model with is_embedding, "
                "generate without; drop server_args.is_embedding"
            )
        return self

    # -- derived facts -----------------------------------------------------------------------

    @property
    def model_task(self) -> str:
        """``task``, or what ``server_args.is_embedding`` implies when it is not set."""
        if self.task is not None:
            return self.task
        return "embed" if self.server_args.get("is_embedding") else "generate"

    @property
    def pooling(self) -> bool:
        """A pooling model (embed, classify, score): SGLang runs it with ``is_embedding``."""
        return self.model_task != "generate"

    @property
    def embedding_model(self) -> bool:
        """Serves embeddings (the ``embed`` task)."""
        return self.model_task == "embed"

    @property
    def seeded_sampling(self) -> bool:
        """SGLang applies per-request seeds only in its deterministic inference mode."""
        return bool(self.server_args.get("enable_deterministic_inference"))

    @property
    def gpus(self) -> int:
        """GPUs one engine uses. Data parallelism runs ``dp_size`` copies of a ``tp_size``
        group, except with DP attention, where the copies share the ``tp_size`` GPUs."""
        if self.server_args.get("enable_dp_attention"):
            return self.tp_size
        return self.tp_size * self.dp_size


#: Options that are relayllm's own, not ServerArgs fields.
RELAYLLM_OPTIONS = frozenset({"server_args", "task"})
#: Options that are ServerArgs fields of the same name (all but :data:`RELAYLLM_OPTIONS`).
FIRST_CLASS_OPTIONS = frozenset(SGLangOptions.model_fields) - RELAYLLM_OPTIONS


def engine_kwargs(options: SGLangOptions) -> dict[str, Any]:
    """The keyword arguments of ``sglang.Engine(...)`` (ServerArgs fields) for ``options``."""
    kwargs: dict[str, Any] = {}
    for name in sorted(FIRST_CLASS_OPTIONS):
        value = getattr(options, name)
        if value is not None:
            kwargs[name] = value
    if options.pooling:
        # Classification and cross-encoder architectures are pooling models to SGLang anyway;
        # an embedding model built on a decoder (Qwen, Llama...) needs the flag.
        kwargs["is_embedding"] = True
    kwargs.update(options.server_args)
    return kwargs


def check_server_arg_names(names: set[str] | list[str], known: set[str]) -> None:
    """Raise :class:`ConfigError` naming every name ServerArgs does not have."""
    unknown = sorted(set(names) - known)
    if not unknown:
        return
    parts = [f"{name!r}{did_you_mean(name, known)}" for name in unknown]
    raise ConfigError(
        "invalid options for backend 'sglang': unknown server_args "
        + ", ".join(parts)
        + "; server_args takes field names of sglang's ServerArgs"
    )


__all__ = [
    "FIRST_CLASS_OPTIONS",
    "RELAYLLM_OPTIONS",
    "RESERVED_SERVER_ARGS",
    "SGLangOptions",
    "check_server_arg_names",
    "engine_kwargs",
]
