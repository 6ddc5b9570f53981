"""The control routes of a deployment's HTTP front: ``POST <prefix>/admin/CALL`` runs a
control call (:mod:`relayllm.serving.controller`: pause, resume, ...) on the whole deployment,
behind a key of its own (``http.admin_key_env``). Loaded inside a replica with an HTTP front."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from relayllm.errors import ConfigError, RelayLLMError
from relayllm.http.app import json_body
from relayllm.http.auth import SingleKey, project_of
from relayllm.http.errors import HttpError, json_response
from relayllm.serving.http_config import HttpConfig

if TYPE_CHECKING:
    from starlette.requests import Request as HttpRequest
    from starlette.responses import Response


async def answer_control(
    request: HttpRequest, admin_key: SingleKey, config: HttpConfig, deployment: str
) -> Response:
    """``POST <prefix>/admin/CALL`` with the call's keyword arguments as a JSON object (or no
    body): the control call on every replica of this deployment, as
    ``relayllm.control(name).CALL(**arguments)``; answers ``{"call": ..., "result": ...}``.
    Without ``http.admin_key_env`` there are no control routes: 404, whatever is sent."""
    from relayllm.serving.control_state import CONTROL_CALLS

    call = str(request.path_params["call"])
    if not admin_key.required:
        raise HttpError(
            404,
            "this deployment serves no control routes: set http.admin_key_env to the "
            "name of a variable holding their key",
            code="not_found",
        )
    project_of(request, admin_key)
    if request.method != "POST":
        raise HttpError(405, f"/admin/{call} takes POST", headers={"Allow": "POST"})
    if call not in CONTROL_CALLS:
        known = ", ".join(CONTROL_CALLS)
        raise HttpError(404, f"no control call {call!r}; calls: {known}", code="not_found")
    arguments = await json_body(request, empty=True, what="a JSON object of the call's arguments")
    if problem := config.source_problem(call, arguments):
        raise HttpError(403, problem, code="source_not_allowed")  # nothing was asked
    # In a thread: the call reaches every replica, this one too, whose event loop must
    # stay free to answer it.
    result = await asyncio.to_thread(_control_call, deployment, call, arguments)
    return json_response({"call": call, "result": result})


def _control_call(deployment: str, call: str, arguments: dict[str, Any]) -> Any:
    """``relayllm.control(deployment).call(**arguments)``; what the caller got wrong (an
    argument, a refused call) as a 400 naming it."""
    import inspect

    from ray import serve

    from relayllm.serving.controller import Controller

    # This replica's own application and deployment: no lookup by name, and the same
    # deployment even if another of its name were deployed since.
    context = serve.get_replica_context()
    target = Controller(deployment, context.app_name, context.deployment)
    method = getattr(target, call)
    try:
        inspect.signature(method).bind(**arguments)
    except TypeError as exc:
        raise HttpError(400, f"{call}{inspect.signature(method)}: {exc}") from None
    try:
        return method(**arguments)
    except (ConfigError, ValueError) as exc:
        raise HttpError(400, str(exc)) from None
    except RelayLLMError as exc:  # refused by the backend, or no such deployment any more
        raise HttpError(  # the same call is refused again: the client must not retry it
            409, str(exc), code="control_refused", headers={"x-should-retry": "false"}
        ) from None


__all__ = ["answer_control"]
