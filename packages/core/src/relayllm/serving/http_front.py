"""The OpenAI-compatible HTTP front of a deployment, served by its own replicas.

Ray Serve's HTTP proxy hands each request to the replica's ``__call__`` (a starlette
``Request``); :class:`HttpFront`, a route set on :mod:`relayllm.http` (routing, error envelope,
keys, JSON bodies), turns it into one row of the row protocol, runs it on the same engine the
batch processors reach by name, and answers with the ``openai`` package's own
response bodies. Request bodies are checked against the ``openai`` package's request types
(``CompletionCreateParams`` and friends): the schema is that library's, not written here. Body
-> row and result -> response are :mod:`relayllm.openai_body`'s, the translation batch files
use too, so a request answers the same through either door.

With ``http.admin_key_env`` set, ``POST <prefix>/admin/CALL`` runs a control call on the whole
deployment, behind a key of its own (:mod:`relayllm.serving.http_admin`).

Loaded only inside a replica whose deployment has an ``http`` section (it imports openai and
starlette), never by ``import relayllm``.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import TYPE_CHECKING, Any

from relayllm import openai_body
from relayllm.errors import (
    DeploymentPausedError,
    EngineFailedError,
    MissingDependencyError,
)
from relayllm.http.app import Endpoint, HttpApp, json_body
from relayllm.http.auth import SingleKey, project_of
from relayllm.http.errors import HttpError, UnauthorizedError, json_response
from relayllm.rows import (
    TEXT_TASKS,
    Request,
    Result,
    Task,
    build_request,
    features_of,
    unsupported_features,
)
from relayllm.serving.http_admin import answer_control
from relayllm.serving.http_config import HttpConfig
from relayllm.serving.http_stream import StreamTimeout, next_part, stream_events
from relayllm.serving.traffic import INTERACTIVE_PRIORITY

if TYPE_CHECKING:
    from starlette.requests import Request as HttpRequest
    from starlette.responses import Response

    from relayllm.http.host import FrontHost

logger = logging.getLogger(__name__)

#: The OpenAI routes, under the deployment's prefix: path -> (method, what it answers).
ROUTES: dict[str, tuple[str, str]] = {
    "/v1/chat/completions": ("POST", "chat"),
    "/v1/completions": ("POST", "completion"),
    "/v1/embeddings": ("POST", "embedding"),
    "/v1/models": ("GET", "models"),
}
#: The control routes' path, under the deployment's prefix: ``POST <prefix>/admin/pause``.
ADMIN_ROUTE = "/admin/{call}"
ANY_METHOD = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
#: Inputs one embeddings request may hold, and choices one answer may have: OpenAI's limits.
MAX_EMBEDDING_INPUTS = 2048
MAX_CHOICES = 128
#: What the front tells a client whose request met a failed engine (seconds, ``Retry-After``):
#: time mends it, as Serve's router moves the retry to another replica or the health check
#: replaces this one; OpenAI's clients wait that long before they retry.
ENGINE_FAILED_RETRY_AFTER_S = 5


class HttpFront:
    """One replica's HTTP front: the OpenAI routes and the control routes, a route set on
    :class:`relayllm.http.app.HttpApp`. Built when the replica starts, so a missing key
    variable or a missing ``openai`` package fails the deploy, not the first request.

    ``host`` is what the front answers from (:class:`relayllm.http.host.FrontHost`): the
    replica itself, or the batch gateway's view of a deployment it reaches by handle."""

    def __init__(self, host: FrontHost, config: HttpConfig, deployment: str) -> None:
        try:
            from openai.types import completion_create_params, embedding_create_params
            from openai.types.chat import completion_create_params as chat_params
            from pydantic import TypeAdapter
            from starlette.routing import Route
        except ImportError as exc:
            raise MissingDependencyError(
                "the HTTP front needs the openai package: pip install 'relayllm[http]'"
            ) from exc
        self.host = host
        self.config = config
        self.deployment = deployment
        self.model = config.model_name or deployment
        self._key = SingleKey.from_env(config.api_key_env, "api_key_env", "to ask for no key")
        self._admin_key = SingleKey.from_env(
            config.admin_key_env, "admin_key_env", "to serve no control routes"
        )
        self._validators: dict[str, Any] = {
            "chat": TypeAdapter(chat_params.CompletionCreateParamsBase),
            "completion": TypeAdapter(completion_create_params.CompletionCreateParamsBase),
            "embedding": TypeAdapter(embedding_create_params.EmbeddingCreateParams),
        }
        self.requests: dict[str, int] = {"ok": 0, "failed": 0, "unauthorized": 0}
        routes = [
            Route(path, self._counted(route), methods=[method])
            for path, (method, route) in ROUTES.items()
        ]
        # Every method: a GET is refused inside, after the key (no key set: 404 for all).
        routes.append(Route(ADMIN_ROUTE, self._admin, methods=ANY_METHOD))
        self.app = HttpApp(routes)

    # -- entry points --------------------------------------------------------------------------

    async def __call__(self, request: HttpRequest) -> Response:
        """Serve's ingress hands the replica each request to the deployment's prefix."""
        return await self.app.respond(request)

    async def answer(self, route: str, request: HttpRequest) -> Response:
        """The answer of an OpenAI route (``chat``, ``completion``, ``embedding``,
        ``models``), the key checked already (by this front, or by the batch gateway)."""
        if route == "models":
            return json_response(self.models_body())
        body = await self._body(request, route)
        if route == "embedding":
            return await self._embeddings(body)
        if body.get("stream"):
            return await self._stream(route, body)
        return await self._complete(route, body)

    def _counted(self, route: str) -> Endpoint:
        async def endpoint(request: HttpRequest) -> Response:
            try:
                project_of(request, self._key)
                answer = await self.answer(route, request)
            except UnauthorizedError:
                self.requests["unauthorized"] += 1
                raise
            except HttpError:
                self.requests["failed"] += 1
                raise
            self.requests["ok"] += 1
            return answer

        return endpoint

    async def _body(self, request: HttpRequest, route: str) -> dict[str, Any]:
        from pydantic import ValidationError

        body = await json_body(request)
        try:
            checked = self._validators[route].validate_python(body)
            for value in checked.values():  # pydantic checks list items lazily: force it
                if not isinstance(value, (str, bytes, dict)) and hasattr(value, "__iter__"):
                    list(value)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
            )
            raise HttpError(400, f"invalid request: {problems}") from None
        return body

    # -- control routes ------------------------------------------------------------------------

    async def _admin(self, request: HttpRequest) -> Response:
        return await answer_control(request, self._admin_key, self.config, self.deployment)

    # -- rows ----------------------------------------------------------------------------------

    def _row(self, task: Task, value: Any, body: dict[str, Any]) -> Request:
        params = openai_body.sampling_params(task, body)
        n = params.get("n")
        if isinstance(n, int) and n > MAX_CHOICES:
            raise HttpError(400, f"n is {n}; at most {MAX_CHOICES} choices", param="n")
        default = self._default_max_tokens() if task in TEXT_TASKS else None
        if default is not None and params.get("max_tokens") is None:
            params["max_tokens"] = default  # no request generates without a bound
        model = body.get("model")
        adapter = model if model not in (None, self.model, self._engine_model()) else None
        row = build_request(task, value, {}, params, adapter, f"http-{uuid.uuid4().hex}")
        if isinstance(row, str):
            raise HttpError(400, row)
        # What the backend cannot do is refused by name, as a batch row's is by the stage.
        supported = self.host.deployment.get("features")
        if supported is not None and (
            problem := unsupported_features(
                self.host.backend_name, features_of(row["sampling_params"]), supported
            )
        ):
            raise HttpError(400, problem)
        row.setdefault("priority", INTERACTIVE_PRIORITY)
        return row

    def _single_input(self, task: Task, body: dict[str, Any]) -> Any:
        value, problem = openai_body.single_input(task, body)
        if problem:
            raise HttpError(400, f"{problem} here")
        return value

    def _engine_model(self) -> str | None:
        model = self.host.engine_info().get("model")
        return model if isinstance(model, str) else None

    def _default_max_tokens(self) -> int | None:
        """``http.default_max_tokens``, or the engine's context length where that is smaller:
        a request whose body names no bound still has one."""
        default = self.config.default_max_tokens
        context = self.host.engine_info().get("max_model_len")
        if default is not None and isinstance(context, int) and 0 < context < default:
            return context
        return default

    def _deadline(self) -> float:
        return asyncio.get_running_loop().time() + self.config.request_timeout_s

    def _timed_out(self) -> HttpError:
        """The answer to a request that took longer than ``http.request_timeout_s``: 504 and
        no retry (the same request would take as long again)."""
        limit = self.config.request_timeout_s
        return HttpError(
            504,
            f"{self.model} did not answer within {limit:g}s (http.request_timeout_s); ask for "
            "fewer tokens (max_tokens) or send a shorter input",
            "server_error",
            "timeout",
            headers={"x-should-retry": "false"},
        )

    async def _within(self, awaitable: Any, deadline: float) -> Any:
        """``awaitable`` until ``deadline``; past it cancelled, and the client gets 504."""
        try:
            async with asyncio.timeout_at(deadline):
                return await awaitable
        except TimeoutError:
            raise self._timed_out() from None

    async def _run(self, row: Request) -> Result:
        result = await self._guard(self.host.serve_http_row(row))
        if result.get("error"):
            # The engine refused this request (too long, bad parameter): the client's to fix,
            # and a 400 is not retried by OpenAI's clients, which retry 5xx answers.
            raise HttpError(400, str(result["error"]))
        return result

    async def _guard(self, awaitable: Any) -> Any:
        try:
            return await awaitable
        except EngineFailedError as exc:
            raise HttpError(
                503,
                f"the engine failed: {exc}; retry",
                "server_error",
                headers={"Retry-After": str(ENGINE_FAILED_RETRY_AFTER_S)},
            ) from None
        except DeploymentPausedError as exc:
            updating = "updating its weights" in str(exc)
            raise _paused(self.model, "is updating its weights" if updating else None) from None

    # -- endpoints -----------------------------------------------------------------------------

    def models_body(self) -> dict[str, Any]:
        """The ``/v1/models`` answer (the batch service's gateway lists every deployment's)."""
        from openai.types import Model

        model = Model(id=self.model, object="model", created=0, owned_by="relayllm")
        return {"object": "list", "data": [model.model_dump()]}

    async def _complete(self, route: str, body: dict[str, Any]) -> Response:
        from openai.types import Completion
        from openai.types.chat import ChatCompletion

        task: Task = "chat" if route == "chat" else "completion"
        row = self._row(task, self._single_input(task, body), body)
        result = await self._within(self._run(row), self._deadline())
        answer = openai_body.completion_body(task, result, self.model, row["request_id"])
        (ChatCompletion if task == "chat" else Completion).model_validate(answer)  # a guard
        return json_response(answer)

    async def _embeddings(self, body: dict[str, Any]) -> Response:
        from openai.types import CreateEmbeddingResponse

        inputs = body["input"]
        texts = [inputs] if isinstance(inputs, str) else inputs
        if not texts or not all(isinstance(t, str) for t in texts):
            raise HttpError(400, "input must be a string or a list of strings here", param="input")
        if len(texts) > MAX_EMBEDDING_INPUTS:
            raise HttpError(
                400,
                f"input holds {len(texts)} texts; at most {MAX_EMBEDDING_INPUTS} per request",
                param="input",
            )
        rows = [self._row("embedding", text, body) for text in texts]
        served = self._guard(self.host.serve_http_rows(rows))  # one call for every input
        results = await self._within(served, self._deadline())
        if failed := next((r["error"] for r in results if r.get("error")), None):
            raise HttpError(400, str(failed))  # the engine refused an input: the client's to fix
        answer = openai_body.embeddings_body(results, self.model, body.get("encoding_format"))
        CreateEmbeddingResponse.model_validate(  # a guard; base64 as the client decodes it
            openai_body.embeddings_body(results, self.model)
        )
        return json_response(answer)

    # -- streaming (the events: relayllm.serving.http_stream) ---------------------------------

    async def _stream(self, route: str, body: dict[str, Any]) -> Response:
        from starlette.responses import StreamingResponse

        task: Task = "chat" if route == "chat" else "completion"
        row = self._row(task, self._single_input(task, body), body)
        if (row.get("sampling_params") or {}).get("n", 1) != 1:
            raise HttpError(400, "streaming serves n=1 only", param="n")
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        deadline = self._deadline()
        # The first part is awaited before the status line is sent: a paused, updating or
        # failed deployment refuses the row there, and the client gets its 503, not a 200;
        # a first part later than the deadline is a 504.
        parts = self.host.stream_http_row(row)
        try:
            first = await self._guard(next_part(parts, deadline))
        except StreamTimeout:
            raise self._timed_out() from None

        def failed() -> None:
            self.requests["failed"] += 1

        events = stream_events(
            task, self.model, usage, first, parts, deadline, self._timed_out, failed
        )
        return StreamingResponse(events, media_type="text/event-stream")


def _paused(model: str, state: str | None = None) -> HttpError:
    """A paused deployment answers interactive requests at once with 503 and Retry-After
    (OpenAI's clients retry a 503 after the time it names) instead of holding the connection
    for a pause of unknown length; batch rows wait in the replica instead."""
    from relayllm.serving.control_state import PAUSED_RETRY_AFTER_S

    return HttpError(
        503,
        f"{model} {state or 'is paused (relayllm.control)'}; retry after {PAUSED_RETRY_AFTER_S}s",
        "server_error",
        "paused",
        headers={"Retry-After": str(PAUSED_RETRY_AFTER_S)},
    )


__all__ = ["HttpFront"]
