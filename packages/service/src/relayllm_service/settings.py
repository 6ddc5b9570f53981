"""The batch service's server settings: where its state lives, where the gateway listens, the
limits, and how the runner sizes its work. One frozen model, pickled to the gateway's replicas
and the runner (no Ray, no HTTP stack)."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from typing import Any

from pydantic import ConfigDict, Field, PositiveFloat, field_serializer, field_validator

from relayllm import env
from relayllm.configbase import ConfigModel
from relayllm.deployments import names
from relayllm.http.server import base_url  # the one base_url rule, the direct server's too
from relayllm_service.store.files import DEFAULT_MAX_BYTES
from relayllm_service.store.postgres_file import check_url, is_postgres_url, redact
from relayllm_service.tenancy.quotas import Quota

#: OpenAI's bounds of a file's ``expires_after`` seconds (an hour to 30 days).
MIN_EXPIRES_S = 3600
MAX_EXPIRES_S = 30 * 24 * 3600
#: Where the state lives unless told (on the node the gateway and the runner run on).
DEFAULT_STATE_DIR = env.STATE_DIR.value
#: A gateway's kind of Serve application: ``relayllm-gateway:NAME`` (deployments.names).
GATEWAY_KIND = "gateway"
#: The gateways' application prefix before 0.2, still found (listed, stopped) for a release.
LEGACY_GATEWAY_PREFIX = "relayllm_"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_PREFIX = re.compile(r"^/([A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*)?$")


class ServiceSettings(ConfigModel):
    """One batch service: a gateway (Serve application) and the runner of its state. A bad
    key or value raises ``ConfigError`` naming the field (with "did you mean"), as the other
    config models do."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(default="gateway", description="The gateway's name (its Serve app).")
    state_dir: str = Field(
        default=DEFAULT_STATE_DIR,
        description="Directory of the job store (SQLite) and the runner's work files, on the "
        "disk of the node the gateway and the runner run on (the head node unless "
        "node_resources says otherwise); with node_resources, a path every such node "
        "reaches (docs/scaling.md says what qualifies).",
    )
    node_resources: dict[str, PositiveFloat] | None = Field(
        default=None,
        description="Custom Ray resources the gateway and the runner ask for, to run on the "
        "nodes that offer them (`ray start --resources '{\"service\": 1}'`) instead of the "
        "head node: when their node is lost, Ray and Serve start them again on another such "
        "node (one that joins later included), and the runner resumes its batches there.",
    )
    store: str | None = Field(
        default=None,
        description="Where the job store is (batches, files' records, runners' claims, quota "
        "counts and the usage ledger): an SQLite file's path, default STATE_DIR/jobs.sqlite; "
        "or a postgresql://user:password@host:port/database URL, a PostgreSQL database that "
        "gateways and runners on hosts with no shared disk all reach (the service's "
        "postgresql extra). Its password is never shown: ***.",
    )
    files: str | None = Field(
        default=None,
        description="Where file bytes live: a directory or a pyarrow.fs URI (s3://...); "
        "default: STATE_DIR/files.",
    )
    host: str = Field(
        default="127.0.0.1",
        description="Address Serve's HTTP proxy (and the gateway's own server) binds.",
    )
    port: int = Field(default=8000, ge=1, le=65535, description="Port of Serve's HTTP proxy.")
    direct_port: int | None = Field(
        default=8001,
        ge=0,
        le=65535,
        description="Port of the gateway's own HTTP server on --host, beside Serve's proxy: "
        "the same API, the base URL given to clients, and where files of any size pass in "
        "flat memory (Serve's proxy holds a file's body in memory). 0: any free port; "
        "None (--direct-port off): only Serve's proxy.",
    )
    route_prefix: str = Field(default="/", description="Path the API is served under.")
    window_s: int | None = Field(
        default=None,
        gt=0,
        description="Enforce this completion window (seconds) instead of the one asked "
        "(24h): for tests and short-lived services.",
    )
    max_file_bytes: int = Field(default=DEFAULT_MAX_BYTES, gt=0, description="Upload limit.")
    output_expires_s: int | None = Field(
        default=None,
        gt=0,
        description="A batch's output and error files expire this many seconds after they "
        "are written unless its create asks otherwise (output_expires_after); default: kept "
        "until deleted.",
    )
    min_expires_s: int = Field(
        default=MIN_EXPIRES_S,
        gt=0,
        description="The shortest expires_after / output_expires_after a client may ask "
        "(OpenAI's: 3600 s); shorter for tests.",
    )
    quotas: dict[str, Quota] = Field(
        default_factory=dict,
        description="Limits per project name ('*': every project not named): stored_bytes, "
        "files, batches (not finished), enqueued_tokens per deployment, requests_per_minute "
        "online, and the weight of its "
        "share of the batch lines written. Default: none (weight 1).",
    )
    quotas_file: str | None = Field(
        default=None,
        description="The file the quotas came from: the gateways and the runner read it again "
        "when it changes (a quota or a weight changed without a restart). A path they reach "
        "on their nodes.",
    )
    max_lines: int = Field(default=1_000_000, gt=0, description="Request lines per batch.")
    batch_size: int = Field(default=64, gt=0, description="Rows per call to a deployment.")
    concurrency: int = Field(default=1, gt=0, description="Stage workers per batch.")
    image_hosts: list[str] = Field(
        default_factory=list,
        description="Hosts whose http(s) image URLs batch lines may name (exact names; '*' "
        "any). Default: none, only data: URLs: the workers would fetch any address for "
        "anyone holding a key.",
    )
    max_batches: int = Field(default=4, gt=0, description="Batches the runner runs at once.")
    turn_s: float = Field(
        default=30.0,
        gt=0,
        description="While batches wait for a slot, a running batch gives its slot up at "
        "its next block once this many seconds have passed since the turn's first block "
        "(not since its start: starting the batch's Ray Data job again each turn is not "
        "counted), if its turn's lines (turn_lines) have not ended it first; its claim and "
        "lines are kept.",
    )
    turn_lines: int = Field(
        default=1000,
        gt=0,
        description="A turn's lines per unit of its project's weight: a turn given while "
        "other batches wait runs at most weight x this many of its batch's unfinished lines, "
        "then gives its slot up (a turn that began alone ends at its next block once it has "
        "written as many and another batch waits). The projects' shares are counted in the "
        "lines their turns wrote. Smaller: finer shares, but each turn starts the batch's "
        "Ray Data job again (a second or more).",
    )
    poll_s: float = Field(
        default=2.0, gt=0, description="How often the runner looks for work unwoken."
    )
    record_usage: bool = Field(
        default=True,
        description="Record every batch line and online request in the usage ledger (the "
        "Usage API, relayllm usage, the console's tokens). Off: a service that does no "
        "accounting records nothing (what was recorded before stays readable).",
    )

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise ValueError("1-64 letters, digits, '_', '.' or '-'")
        return value

    @field_validator("route_prefix")
    @classmethod
    def _valid_prefix(cls, value: str) -> str:
        if not _PREFIX.match(value):
            raise ValueError("must start with '/' and have no trailing '/', e.g. '/' or '/api'")
        return value

    @field_validator("store")
    @classmethod
    def _store_location(cls, value: str | None) -> str | None:
        if value is None or is_postgres_url(value):
            if value is not None:
                check_url(value)
            return value
        if "://" in value:
            raise ValueError(
                "a postgresql://user:password@host:port/database URL or an SQLite file's path"
            )
        return os.path.abspath(os.path.expanduser(value))

    @field_serializer("store")
    def _store_shown(self, value: str | None) -> str | None:
        """What dumps (``relayllm status``, the reuse check) say: no password."""
        return None if value is None else redact(value)

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        for name, value in super().__repr_args__():
            yield name, redact(value) if name == "store" and value is not None else value

    @field_validator("state_dir", "quotas_file")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        return None if value is None else os.path.abspath(os.path.expanduser(value))

    @property
    def app_name(self) -> str:
        return names.app_name(self.name, kind=GATEWAY_KIND)

    @property
    def store_path(self) -> str:
        """Where the job store is (``store``'s path or URL, default in the state
        directory); ``open_store`` opens it."""
        return self.store or os.path.join(self.state_dir, "jobs.sqlite")

    @property
    def work_dir(self) -> str:
        return os.path.join(self.state_dir, "work")

    @property
    def files_location(self) -> str:
        return self.files or os.path.join(self.state_dir, "files")

    @property
    def runner_name(self) -> str:
        """The runner's actor name: one runner per state directory, whichever gateways share
        it."""
        digest = hashlib.sha256(self.state_dir.encode("utf-8")).hexdigest()[:12]
        return f"relayllm-batch-runner-{digest}"

    @property
    def lease_s(self) -> float:
        """How long a runner's claim holds without a write (it writes every ``poll_s``):
        another runner takes its batches only after that."""
        return max(5 * self.poll_s, 10.0)

    @property
    def url(self) -> str:
        """The base URL through Serve's proxy (``base_url``; the gateway's own server's is
        known once it listens: ``GatewayRef.url``)."""
        return base_url(self.host, self.port, self.route_prefix)


def gateway_name_of(app: str) -> str | None:
    """The gateway a Serve application is, None for any other application."""
    if app.startswith(LEGACY_GATEWAY_PREFIX):
        return app[len(LEGACY_GATEWAY_PREFIX) :]
    return names.name_of(app, kind=GATEWAY_KIND)


__all__ = [
    "DEFAULT_STATE_DIR",
    "GATEWAY_KIND",
    "LEGACY_GATEWAY_PREFIX",
    "MAX_EXPIRES_S",
    "MIN_EXPIRES_S",
    "ServiceSettings",
    "gateway_name_of",
]
