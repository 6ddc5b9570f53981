"""Options of an ``openai`` deployment, and the sampling names a row may set."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from pydantic import Field, NonNegativeInt, PositiveInt, field_validator

from relayllm.adapters import BackendOptions, Task

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Headers that carry credentials: those belong in the variable ``api_key_env`` names.
_CREDENTIAL_HEADERS = {"authorization", "api-key", "proxy-authorization", "x-api-key"}


#: The tasks OpenAI's own API has (``classify`` and ``score`` are vLLM server endpoints).
OPENAI_TASKS: tuple[Task, ...] = ("chat", "completion", "embedding")


class OpenAIOptions(BackendOptions):
    """Options of an ``openai`` deployment. The key is never an option: ``api_key_env`` names
    the environment variable that holds it, read by the Serve replica."""

    model: str = Field(min_length=1, description="Model name the endpoint serves.")
    base_url: str | None = Field(
        default=None,
        description="The endpoint, e.g. 'http://127.0.0.1:8000/v1'. None: the openai client's "
        "default (OPENAI_BASE_URL, else OpenAI's own API).",
    )
    api_key_env: str | None = Field(
        default="OPENAI_API_KEY",
        description="Name of the environment variable holding the key; None for endpoints "
        "that need no key (a local vLLM server).",
    )
    organization: str | None = Field(
        default=None, description="OpenAI organization id sent with each request, if any."
    )
    headers: dict[str, str] = Field(
        default_factory=dict, description="Extra HTTP headers (not credentials)."
    )
    timeout_s: float = Field(default=60.0, gt=0, description="Limit on one HTTP request.")
    max_concurrency: PositiveInt = Field(
        default=32, description="Requests in flight to the endpoint, for the whole deployment."
    )
    requests_per_minute: PositiveInt | None = Field(
        default=None, description="Request budget for the whole deployment (None: no limit)."
    )
    tokens_per_minute: PositiveInt | None = Field(
        default=None, description="Token budget for the whole deployment (None: no limit)."
    )
    interactive_share: float = Field(
        default=0.25,
        ge=0,
        lt=1,
        description="On a deployment with an HTTP front: the part of each budget (concurrency, "
        "requests and tokens per minute) kept for interactive requests, the rest for batch "
        "rows, so a batch job cannot use up what interactive users need. Without an HTTP "
        "front batch rows get the whole budget.",
    )
    max_retries: NonNegativeInt = Field(
        default=5,
        description="Retries of one request on 429/408/409/5xx/timeouts/connection errors.",
    )
    tasks: list[Task] = Field(
        default_factory=lambda: list(OPENAI_TASKS),
        min_length=1,
        description="What the endpoint serves (default: OpenAI's chat, completion, embedding; "
        "a vLLM server with a generate model: chat and completion; with a classifier: "
        "classify, through its /classify endpoint; with a cross-encoder: score, through "
        "/score); a processor with another task is refused before any row is sent.",
    )
    features: list[str] = Field(
        default_factory=lambda: sorted(OPENAI_FEATURES),
        description="Optional request features the endpoint supports (relayllm.rows.FEATURES). "
        "Default: OpenAI's own (logprobs, n, tools, JSON schema output). A vLLM server also "
        "does prompt_logprobs, chat_template_kwargs, continue_final_message and "
        "structured_outputs.choice/regex/grammar: list them to send those fields.",
    )
    extra_sampling_params: list[str] = Field(
        default_factory=list,
        description="Sampling names this endpoint accepts beyond OpenAI's own (vLLM's top_k, "
        "min_p...); a row setting any other name fails with an error naming it.",
    )

    @field_validator("features")
    @classmethod
    def _known_features(cls, value: list[str]) -> list[str]:
        from relayllm.adapters import FEATURES

        unknown = sorted(set(value) - set(FEATURES))
        if unknown:
            raise ValueError(f"unknown features {unknown}; known: {', '.join(FEATURES)}")
        return value

    @field_validator("base_url")
    @classmethod
    def _valid_url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL, e.g. 'http://127.0.0.1:8000/v1'")
        if parts.username or parts.password:
            raise ValueError(
                "must not carry credentials; put the key in the variable api_key_env names"
            )
        return value.rstrip("/")

    @field_validator("api_key_env")
    @classmethod
    def _valid_env_name(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME.match(value):
            raise ValueError(
                "must be the NAME of an environment variable (letters, digits, '_'), "
                "not the key itself"
            )
        return value

    @field_validator("headers")
    @classmethod
    def _no_credentials(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if name.lower() in _CREDENTIAL_HEADERS:
                raise ValueError(
                    f"header {name!r} carries a credential: set api_key_env to the name of "
                    "the environment variable that holds the key instead"
                )
        return value


#: The optional features OpenAI's own API has.
OPENAI_FEATURES = frozenset({"logprobs", "n", "tools", "structured_outputs.json"})
#: Body fields a feature beyond OpenAI's adds (vLLM server names), sent when it is declared.
FEATURE_FIELDS = {
    "prompt_logprobs": "prompt_logprobs",
    "chat_template_kwargs": "chat_template_kwargs",
    "continue_final_message": "continue_final_message",
    "structured_outputs.choice": "structured_outputs",
    "structured_outputs.regex": "structured_outputs",
    "structured_outputs.grammar": "structured_outputs",
}


__all__ = ["FEATURE_FIELDS", "OPENAI_FEATURES", "OpenAIOptions"]
