"""The Batch API's output and error lines: what a request that ran becomes (its response, in
the shape of the endpoint it named), and one that failed or named no deployment (an error
line, or OpenAI's 404 ``model_not_found`` response)."""

from __future__ import annotations

import uuid
from typing import Any

from relayllm import openai_body, openai_responses
from relayllm.batch.format import BatchRequest
from relayllm.rows import ERROR, REQUEST_ID


def batch_request_id() -> str:
    return f"batch_req_{uuid.uuid4().hex}"


def response_line(request: BatchRequest, result: dict[str, Any], model: str) -> dict[str, Any]:
    """The OpenAI batch output line for a request that succeeded (a scoring line's
    ``result["pairs"]``: each pair's row)."""
    rid = result.get(REQUEST_ID) or uuid.uuid4().hex
    if request.task == "score" and request.rerank:
        documents = [document for _, document in request.pairs]
        body = openai_body.rerank_body(result["pairs"], documents, request.top_n, model, rid)
    elif request.task == "score":
        body = openai_body.score_body(result["pairs"], model, rid)
    elif request.task == "embedding":
        body = openai_body.embeddings_body([result], model)
    elif getattr(request, "responses", False):  # (a stand-in without the field: a chat)
        body = openai_responses.responses_body(result, model, rid)
    else:
        body = openai_body.completion_body(request.task, result, model, rid)
    return {
        "id": batch_request_id(),
        "custom_id": request.custom_id,
        "response": {"status_code": 200, "request_id": rid, "body": body},
        "error": None,
    }


def gathered(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A scoring line's pair rows as one result: the first pair error, or every pair."""
    failed = [(i, r) for i, r in enumerate(rows) if r.get(ERROR)]
    if failed:
        i, r = failed[0]
        return {ERROR: f"documents[{i}]: {r[ERROR]}", REQUEST_ID: r.get(REQUEST_ID)}
    return {"pairs": rows, REQUEST_ID: rows[0].get(REQUEST_ID)}


def error_line(line: int, custom_id: str | None, code: str, message: str) -> dict[str, Any]:
    """The error-file line for a request that did not run or failed."""
    return {
        "id": batch_request_id(),
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message, "line": line},
    }


def model_not_found_line(
    line: int, custom_id: str | None, model: str | None, deployments: list[str]
) -> dict[str, Any]:
    """The error-file line of a request whose ``model`` names no deployment: OpenAI's shape
    for a request the API refused (its 404 ``model_not_found`` error as the response)."""
    served = ", ".join(deployments) or "none"
    message = (
        f"line {line}: the model {model!r} does not exist here; name a deployment ({served})"
        if model is not None
        else f"line {line}: no 'model': name a deployment ({served})"
    )
    return {
        "id": batch_request_id(),
        "custom_id": custom_id,
        "response": {
            "status_code": 404,
            "request_id": uuid.uuid4().hex,
            "body": {
                "error": {
                    "message": message,
                    "type": "invalid_request_error",
                    "param": "model",
                    "code": "model_not_found",
                }
            },
        },
        "error": None,
    }


def request_counts(total: int, completed: int, failed: int) -> dict[str, int]:
    return {"total": total, "completed": completed, "failed": failed}


def served_model(deployment: str) -> str:
    """The response's ``model`` field: the deployment's name -- the name a client routes by,
    ``/v1/models`` lists and the online endpoints answer with (as vLLM's server answers with
    its served model name), so one deployment has one name in every answer."""
    return deployment


__all__ = [
    "batch_request_id",
    "error_line",
    "gathered",
    "model_not_found_line",
    "request_counts",
    "response_line",
    "served_model",
]
