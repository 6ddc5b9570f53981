"""What a deployment's HTTP front needs of the replica it serves, as a Protocol: the replica
implements it in its own process, and the batch gateway implements it for a deployment it
reaches through a Serve handle (:class:`relayllm_service.gateway.online.DeploymentOverHandle`).
The front imports neither: this is the one place the two meet."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

from relayllm.rows import Request, Result


class FrontHost(Protocol):
    """The rows of HTTP requests go to :meth:`serve_http_row` and :meth:`stream_http_row`,
    which refuse them (``DeploymentPausedError``, ``EngineFailedError``) while the deployment
    is paused, updating its weights or failed: the front turns those into 503 answers."""

    @property
    def backend_name(self) -> str:
        """The backend's name, in the messages of refused features."""
        ...

    @property
    def deployment(self) -> Mapping[str, Any]:
        """The deployment's config as a dict (``features``: what its backend declares)."""
        ...

    def engine_info(self) -> dict[str, Any]:
        """The engine's description; ``model``: the name a request may use for the base model."""
        ...

    async def serve_http_row(self, request: Request) -> Result:
        """One row, answered whole."""
        ...

    async def serve_http_rows(self, requests: list[Request]) -> list[Result]:
        """The rows of one request (an embeddings request's inputs), in one call."""
        ...

    def stream_http_row(self, request: Request) -> AsyncIterator[Result]:
        """One row, answered in parts (the last carries the token counts)."""
        ...


__all__ = ["FrontHost"]
