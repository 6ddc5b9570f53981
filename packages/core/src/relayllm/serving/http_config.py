"""The ``http`` section of a deployment: where its OpenAI-compatible HTTP front listens.

Light on purpose (pydantic only): :class:`~relayllm.DeploymentConfig` holds it, and
``import relayllm`` must not bring the HTTP stack (starlette, openai) along. The front itself
is :mod:`relayllm.serving.http_front`, loaded in the replica.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_PREFIX = re.compile(r"^/([A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*)?$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class HttpConfig(BaseModel):
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
    model_name: str | None = Field(
        default=None, description="Model id served at /v1/models; default: the deployment name."
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

    @model_validator(mode="after")
    def _admin_key_of_its_own(self) -> HttpConfig:
        if self.admin_key_env is not None and self.admin_key_env == self.api_key_env:
            raise ValueError(
                "admin_key_env must name another variable than api_key_env: every client with "
                "the API key could pause the engine"
            )
        return self

    def prefix_for(self, deployment: str) -> str:
        return self.route_prefix or f"/{deployment}"

    def url_for(self, deployment: str) -> str:
        """The base URL an OpenAI client takes (``base_url``)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        prefix = self.prefix_for(deployment).rstrip("/")
        return f"http://{host}:{self.port}{prefix}/v1"


__all__ = ["HttpConfig"]
