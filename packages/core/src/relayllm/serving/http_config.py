"""The ``http`` section of a deployment: where its OpenAI-compatible HTTP front listens.

Light on purpose (pydantic only): :class:`~relayllm.DeploymentConfig` holds it, and
``import relayllm`` must not bring the HTTP stack (starlette, openai) along. The front itself
is :mod:`relayllm.serving.http_front`, loaded in the replica.
"""

from __future__ import annotations

import posixpath
import re

from pydantic import ConfigDict, Field, field_validator, model_validator

from relayllm.configbase import ConfigModel

_PREFIX = re.compile(r"^/([A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*)?$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")
#: The control calls that read a source a client names, and the argument naming it.
SOURCE_ARGUMENTS = {"update_weights": "source", "load_adapter": "path"}


class HttpConfig(ConfigModel):
    """An OpenAI-compatible HTTP API on the deployment's own replicas (Ray Serve's ingress).

    Serve runs one HTTP proxy per cluster, so ``host`` and ``port`` are the cluster's: every
    deployment with an ``http`` section must name the same ones, and each its own
    ``route_prefix``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    route_prefix: str | None = Field(
        default=None,
        description="URL path the API is served under (then /v1/...); default '/<name>'.",
    )
    host: str = Field(default="127.0.0.1", description="Address Serve's HTTP proxy binds.")
    port: int = Field(default=8000, ge=1, le=65535, description="Port of Serve's HTTP proxy.")
    api_key_env: str | None = Field(
        default=None,
        description="Name of an environment variable (set where the replicas run) holding the "
        "API key clients must send as 'Authorization: Bearer KEY'. Unset: no key is asked.",
    )
    admin_key_env: str | None = Field(
        default=None,
        description="Name of an environment variable (set where the replicas run) holding the "
        "key of the control routes (POST <prefix>/admin/CALL: pause, resume, load_adapter...; "
        "see the control plane's docs), sent as 'Authorization: Bearer KEY'. A key of their "
        "own: a client that may ask questions may not pause the engine. Unset: no control "
        "routes.",
    )
    admin_sources: list[str] = Field(
        default_factory=list,
        description="Where the control routes may load weights (update_weights' source) and "
        "LoRA adapters (load_adapter's path) from: absolute directories or URI prefixes "
        "(s3://bucket/checkpoints). A source sent over HTTP must lie under one of them. "
        "Empty: those two calls are refused over HTTP (use relayllm.control or the CLI).",
    )
    model_name: str | None = Field(
        default=None, description="Model id served at /v1/models; default: the deployment name."
    )
    default_max_tokens: int | None = Field(
        default=4096,
        gt=0,
        description="max_tokens of a chat or completion request whose body sets neither "
        "max_tokens nor max_completion_tokens (the engine's context length where that is "
        "smaller), so no request generates without a bound; null: the engine's own default "
        "(vLLM: up to the context length).",
    )
    request_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="Longest time one request may take, a streamed one included: past it the "
        "engine's work on it is cancelled and the client gets 504 with OpenAI's error body "
        "(code 'timeout', header x-should-retry: false: the same request would take as long "
        "again); a stream already started ends with that error as its last event. Keep it "
        "below the clients' own timeout (the openai client's default is 600 s).",
    )
    max_concurrent_requests: int = Field(
        default=64,
        gt=0,
        description="HTTP requests one replica takes at once, on top of the batch calls "
        "(max_ongoing_requests): interactive requests never wait behind batch calls in Serve.",
    )

    @field_validator("route_prefix")
    @classmethod
    def _valid_prefix(cls, value: str | None) -> str | None:
        if value is not None and not _PREFIX.match(value):
            raise ValueError("must start with '/', have no trailing '/', e.g. '/chat'")
        return value

    @field_validator("api_key_env", "admin_key_env")
    @classmethod
    def _valid_env(cls, value: str | None) -> str | None:
        if value is not None and not _ENV.match(value):
            raise ValueError(
                "must be the NAME of an environment variable (letters, digits, '_'), not a key"
            )
        return value

    @field_validator("admin_sources")
    @classmethod
    def _valid_sources(cls, value: list[str]) -> list[str]:
        for root in value:
            if _place(root) is None:
                raise ValueError(
                    f"{root!r} must be an absolute directory or a URI (scheme://...) without '..'"
                )
        return value

    @model_validator(mode="after")
    def _admin_key_of_its_own(self) -> HttpConfig:
        if self.admin_key_env is not None and self.admin_key_env == self.api_key_env:
            raise ValueError(
                "admin_key_env must name another variable than api_key_env: every client with "
                "the API key could pause the engine"
            )
        return self

    def source_problem(self, call: str, arguments: dict[str, object]) -> str | None:
        """Why the control call ``call`` may not read the source ``arguments`` name over
        HTTP (None: it may, or it reads none). The key of the control routes opens the
        engine, not every directory and address the replicas can reach: a source must lie
        under ``admin_sources``, after normalisation, so ``..`` and encoded tricks cannot
        step out."""
        param = SOURCE_ARGUMENTS.get(call)
        if param is None or param not in arguments:
            return None  # no source: the call's own argument check answers
        source = arguments[param]
        if not self.admin_sources:
            return (
                f"{call} reads no source over HTTP on this deployment: list the allowed "
                "directories or URI prefixes in http.admin_sources (or call it with "
                "relayllm.control / the CLI)"
            )
        place = _place(source) if isinstance(source, str) else None
        if place is not None and any(_under(place, _place(root)) for root in self.admin_sources):
            return None
        return (
            f"{param} must be an absolute directory or URI under one of http.admin_sources "
            f"({', '.join(self.admin_sources)}), without '..'"
        )

    def prefix_for(self, deployment: str) -> str:
        return self.route_prefix or f"/{deployment}"

    def url_for(self, deployment: str) -> str:
        """The base URL an OpenAI client takes (``base_url``)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        prefix = self.prefix_for(deployment).rstrip("/")
        return f"http://{host}:{self.port}{prefix}/v1"


def _place(source: str) -> tuple[str, str] | None:
    """(scheme, normalised path) of an absolute directory ("" scheme) or a URI; None for a
    relative path, a '..' segment (escaped or not) or a percent-escape, which the reader of
    the source may decode where this check did not."""
    if "%" in source or "\\" in source or "\x00" in source:
        return None
    match = _URI.match(source)
    scheme, path = (match.group(1).lower(), match.group(2)) if match else ("", source)
    if not match and not path.startswith("/"):
        return None
    if ".." in path.split("/"):
        return None
    return scheme, posixpath.normpath("/" + path.lstrip("/")) if path else "/"


def _under(place: tuple[str, str], root: tuple[str, str] | None) -> bool:
    if root is None or place[0] != root[0]:
        return False
    base = root[1].rstrip("/")
    return place[1] == base or place[1].startswith(base + "/") or base == ""


__all__ = ["SOURCE_ARGUMENTS", "HttpConfig"]
