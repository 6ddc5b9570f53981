"""The ``openai`` backend: its options, the Backend class and the hook that registers it.

Light on purpose (pydantic and relayllm only): the entry point loads this module in every
process that asks for the registry; the ``openai`` client is imported by :mod:`.deployment`.
"""

from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, NonNegativeInt, PositiveInt, ValidationError, field_validator

import relayllm
from relayllm.errors import ConfigError

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Headers that carry credentials: those belong in the variable ``api_key_env`` names.
_CREDENTIAL_HEADERS = {"authorization", "api-key", "proxy-authorization", "x-api-key"}


class OpenAIOptions(relayllm.BackendOptions):
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
    organization: str | None = None
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
    max_retries: NonNegativeInt = Field(
        default=5, description="Retries of one request on 429/408/409/5xx/timeouts/connection errors."
    )

    @field_validator("base_url")
    @classmethod
    def _valid_url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL, e.g. 'http://127.0.0.1:8000/v1'")
        if parts.username or parts.password:
            raise ValueError("must not carry credentials; put the key in the variable api_key_env names")
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


class OpenAIBackend(relayllm.Backend):
    """Any OpenAI-compatible endpoint: chat, completion and embedding."""

    name = "openai"
    Options = OpenAIOptions
    requires = ("openai", "aiolimiter")
    install_hint = ("pip install ./packages/adapter-openai "
                    "(run in a clone of the relayllm repository)")
    tasks = frozenset({"chat", "completion", "embedding"})

    @classmethod
    def parse_options(cls, options: dict[str, Any]) -> BaseModel:
        # pydantic's own message repeats each bad value; a value here may be a key pasted in
        # the wrong field, so the message names fields and reasons only.
        try:
            return cls.Options.model_validate(options)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'options'}: {e['msg']}"
                for e in exc.errors(include_url=False, include_input=False, include_context=False)
            )
            raise ConfigError(f"invalid options for backend 'openai': {problems}") from None

    @classmethod
    def check_options(cls, options: OpenAIOptions) -> None:
        # The replica reads the key from its own environment, which it inherits from the
        # process that started Ray; a missing variable fails here, before anything starts.
        if options.api_key_env and not os.environ.get(options.api_key_env):
            raise ConfigError(
                f"options.api_key_env: the environment variable {options.api_key_env} is not set. "
                "Export it before starting Ray (the Serve replica inherits it), or set "
                "api_key_env=None for an endpoint that needs no key."
            )

    @classmethod
    def deployment_class(cls) -> type[relayllm.BatchDeployment]:
        from relayllm_openai.deployment import OpenAIDeployment

        return OpenAIDeployment

    @classmethod
    def deployment_options(cls, options: OpenAIOptions) -> dict[str, Any]:
        # The replica only waits on HTTP: reserving a CPU would starve the stage actors.
        return {"ray_actor_options": {"num_cpus": 0}}


@relayllm.hookimpl
def relayllm_register_backends(registry) -> None:
    registry.add(OpenAIBackend)


__all__ = ["OpenAIBackend", "OpenAIOptions", "relayllm_register_backends"]
