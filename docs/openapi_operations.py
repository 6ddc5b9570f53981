"""The operations of docs/reference/openapi.json, by (path, method): what each route of
``relayllm serve`` takes and answers, with the ``openai`` package's types for the bodies and
the service's own constants for what it narrows. docs/gen_openapi.py checks this table against
the gateway's route table and writes the description."""

from __future__ import annotations

from typing import Any

REF = "#/components/schemas/{model}"
JSON, HTML, BYTES = "application/json", "text/html", "application/octet-stream"


def _list_of(item: dict[str, str]) -> dict[str, Any]:
    """OpenAI's cursor page (``first_id``, ``last_id``, ``has_more``) of ``item``."""
    nullable = {"type": ["string", "null"]}
    return {
        "type": "object",
        "required": ["object", "data", "first_id", "last_id", "has_more"],
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": item},
            "first_id": nullable,
            "last_id": nullable,
            "has_more": {"type": "boolean"},
        },
    }


def _json(schema: dict[str, Any], what: str) -> dict[str, Any]:
    return {"description": what, "content": {JSON: {"schema": schema}}}


def _query(name: str, schema: dict[str, Any], what: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "in": "query", "schema": schema, "description": what, **extra}


def _path(name: str, what: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": {"type": "string"},
        **{"description": what},
    }


def operations(schemas: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """Every operation the service answers, by (path, method)."""
    from openai.types import (
        Batch,
        Completion,
        CreateEmbeddingResponse,
        FileDeleted,
        FileObject,
        Model,
        batch_create_params,
        completion_create_params,
        embedding_create_params,
    )
    from openai.types.admin.organization.usage_completions_response import (
        UsageCompletionsResponse,
    )
    from openai.types.chat import ChatCompletion
    from openai.types.chat import completion_create_params as chat_params

    from relayllm.batch.format import URL_TASKS
    from relayllm_service.gateway.params import FILE_PURPOSES, MAX_CHARS, MAX_UNIX_S, MAX_VALUES
    from relayllm_service.gateway.usage_api import GROUPS, LIMITS, WIDTHS
    from relayllm_service.settings import MAX_EXPIRES_S, MIN_EXPIRES_S
    from relayllm_service.store.admin import AdminStore

    file, batch = schemas.model(FileObject), schemas.model(Batch)
    unix = {"type": "integer", "minimum": 0, "maximum": MAX_UNIX_S}
    text = {"type": "string", "maxLength": MAX_CHARS}
    names = {"type": "array", "items": text, "maxItems": MAX_VALUES}
    create = schemas.typed(batch_create_params.BatchCreateParams, "BatchCreateParams")
    create_schema = schemas.components["BatchCreateParams"]
    create_schema["properties"]["endpoint"] = {"type": "string", "enum": list(URL_TASKS)}
    models = {
        "type": "object",
        "required": ["object", "data"],
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": {}}},
    }
    models["properties"]["data"]["items"] = schemas.model(Model)
    most_files = AdminStore.list_files.__kwdefaults__["limit"]
    usage = schemas.model(UsageCompletionsResponse)
    file_id = _path("file_id", "A file's id (`file-...`).")
    batch_id = _path("batch_id", "A batch's id (`batch_...`).")
    form = {
        "type": "object",
        "required": ["file", "purpose"],
        "properties": {
            "file": {"type": "string", "format": "binary"},
            "purpose": {"type": "string", "enum": ["batch"]},
            "expires_after[anchor]": {"type": "string", "enum": ["created_at"]},
            "expires_after[seconds]": {
                "type": "integer",
                "minimum": MIN_EXPIRES_S,
                "maximum": MAX_EXPIRES_S,
            },
        },
    }
    embedding_answer = schemas.model(CreateEmbeddingResponse)
    # With encoding_format=base64 the vector is sent as base64 text (the openai client decodes it)
    vector = schemas.components["Embedding"]["properties"]["embedding"]
    schemas.components["Embedding"]["properties"]["embedding"] = {
        "anyOf": [vector, {"type": "string", "contentEncoding": "base64"}]
    }
    online = {
        "/v1/chat/completions": (
            schemas.typed(chat_params.CompletionCreateParamsBase, "ChatCompletionCreateParams"),
            schemas.model(ChatCompletion),
        ),
        "/v1/completions": (
            schemas.typed(
                completion_create_params.CompletionCreateParamsBase, "CompletionCreateParams"
            ),
            schemas.model(Completion),
        ),
        "/v1/embeddings": (
            schemas.typed(embedding_create_params.EmbeddingCreateParams, "EmbeddingCreateParams"),
            embedding_answer,
        ),
    }
    ops: dict[tuple[str, str], dict[str, Any]] = {
        ("/v1/files", "post"): {
            "summary": "Upload a batch input file (multipart form, `purpose=batch`).",
            "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": form}}},
            "responses": {"200": _json(file, "The stored file."), **_errors(403, 411, 413, 429)},
        },
        ("/v1/files", "get"): {
            "summary": "The project's files, newest first unless `order=asc`.",
            "parameters": [
                _query("after", text, "The id the previous page ended with."),
                _query(
                    "limit",
                    {"type": "integer", "minimum": 1, "maximum": most_files},
                    "Files per page.",
                ),
                _query("order", {"type": "string", "enum": ["asc", "desc"]}, "By creation."),
                _query(
                    "purpose",
                    {"type": "string", "enum": sorted(FILE_PURPOSES)},
                    "Only files of this purpose.",
                ),
            ],
            "responses": {"200": _json(_list_of(file), "A page of files."), **_errors(404)},
        },
        ("/v1/files/{file_id}", "get"): {
            "summary": "A file's record.",
            "parameters": [file_id],
            "responses": {"200": _json(file, "The file."), **_errors(404)},
        },
        ("/v1/files/{file_id}", "delete"): {
            "summary": "Delete a file (its record, then its bytes).",
            "parameters": [file_id],
            "responses": {"200": _json(schemas.model(FileDeleted), "Deleted."), **_errors(404)},
        },
        ("/v1/files/{file_id}/content", "get"): {
            "summary": "A file's bytes.",
            "parameters": [file_id],
            "responses": {
                "200": {
                    "description": "The bytes.",
                    "content": {BYTES: {"schema": {"type": "string", "format": "binary"}}},
                },
                **_errors(404),
            },
        },
        ("/v1/batches", "post"): {
            "summary": "Create a batch of an uploaded file's requests.",
            "requestBody": {"required": True, "content": {JSON: {"schema": create}}},
            "responses": {
                "200": _json(batch, "The batch, `validating`."),
                **_errors(403, 404, 429),
            },
        },
        ("/v1/batches", "get"): {
            "summary": "The project's batches, newest first.",
            "parameters": [
                _query("after", text, "The id the previous page ended with."),
                _query(
                    "limit", {"type": "integer", "minimum": 1, "maximum": 100}, "Batches per page."
                ),
            ],
            "responses": {"200": _json(_list_of(batch), "A page of batches."), **_errors(404)},
        },
        ("/v1/batches/{batch_id}", "get"): {
            "summary": "A batch.",
            "parameters": [batch_id],
            "responses": {"200": _json(batch, "The batch."), **_errors(404)},
        },
        ("/v1/batches/{batch_id}/cancel", "post"): {
            "summary": "Cancel a batch (`cancelling`, then `cancelled`).",
            "parameters": [batch_id],
            "responses": {"200": _json(batch, "The batch."), **_errors(404)},
        },
        ("/v1/models", "get"): {
            "summary": "Every deployment, by the name a body's `model` routes by.",
            "responses": {"200": _json(models, "The deployments."), **_errors()},
        },
        ("/v1/organization/usage/completions", "get"): {
            "summary": "Every project's usage, batch and online, in time buckets (admin key).",
            "parameters": [
                _query("start_time", unix, "Unix seconds, inclusive.", required=True),
                _query("end_time", unix, "Unix seconds, exclusive (default: now)."),
                _query("bucket_width", {"type": "string", "enum": list(WIDTHS)}, "Bucket width."),
                _query(
                    "group_by",
                    {
                        "type": "array",
                        "items": {"type": "string", "enum": list(GROUPS)},
                        "maxItems": MAX_VALUES,
                    },
                    "Fields to group the results by.",
                ),
                _query("project_ids", names, "Only these projects."),
                _query("models", names, "Only these models."),
                _query("batch", {"type": "boolean"}, "Only batch (true) or online (false) usage."),
                _query(
                    "limit",
                    {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": max(most for _, most in LIMITS.values()),
                    },
                    "Buckets per page (the most depends on bucket_width).",
                ),
                _query("page", text, "The previous page's `next_page`."),
            ],
            "responses": {"200": _json(usage, "A page of buckets."), **_errors(403)},
        },
    }
    for path, (request, answer) in online.items():
        ops[(path, "post")] = {
            "summary": "Answered by the deployment the body's `model` names (or the only one).",
            "requestBody": {"required": True, "content": {JSON: {"schema": request}}},
            "responses": {
                "200": {
                    "description": "The answer; with `stream: true`, server-sent events.",
                    "content": {
                        JSON: {"schema": answer},
                        "text/event-stream": {"schema": {"type": "string"}},
                    },
                },
                **_errors(404, 429, 503),
            },
        }
    ops.update(_console(file_id))
    return ops


def _errors(*statuses: int) -> dict[str, Any]:
    """Every keyed route's refusals (400, 401, 429 for an address with too many refused
    keys) and ``statuses``: OpenAI's error envelope."""
    return {
        str(s): {"$ref": "#/components/responses/Error"} for s in sorted({400, 401, 429, *statuses})
    }


def _console(file_id: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    page = {"content": {HTML: {"schema": {"type": "string"}}}}
    seen = {
        "303": {
            "description": "To the console.",
            "headers": {"Location": {"schema": {"type": "string"}}},
        }
    }
    refused = {
        "401": {"description": "The sign-in page.", **page},
        "429": {"description": "Too many refused keys.", **page},
    }
    either = [{}, {"bearer": []}, {"session": []}]
    return {
        ("/console", "get"): {
            "summary": "The console: the viewer's batches, usage and the deployments.",
            "security": either,
            "responses": {"200": {"description": "The console.", **page}, **refused},
        },
        ("/console/login", "post"): {
            "summary": "Sign in with a key (a form), for a session cookie.",
            "security": [{}],
            "requestBody": {
                "content": {
                    "application/x-www-form-urlencoded": {
                        "schema": {"type": "object", "properties": {"key": {"type": "string"}}}
                    }
                }
            },
            "responses": {**seen, **refused},
        },
        ("/console/logout", "post"): {
            "summary": "End the session.",
            "security": [{}],
            "responses": seen,
        },
        ("/console/files/{file_id}", "get"): {
            "summary": "Download a file the viewer may read.",
            "security": either,
            "parameters": [file_id],
            "responses": {
                "200": {
                    "description": "The bytes.",
                    "content": {"application/jsonl": {"schema": {"type": "string"}}},
                },
                "404": {"description": "No such file.", **page},
                **refused,
            },
        },
    }
