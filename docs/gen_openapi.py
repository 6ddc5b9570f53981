"""Write docs/reference/openapi.json: the OpenAPI description of what ``relayllm serve``
answers (the Batch API service's gateway: files, batches, the usage API, the online routes,
the console).

    python docs/gen_openapi.py           # write the description
    python docs/gen_openapi.py --check   # exit 1 when the committed one is stale

``python docs/gen_reference.py`` writes (and ``--check`` checks) it with the other reference
pages. The paths and methods are the gateway's own route table (``Gateway._routes`` and the
console's ``Console.routes``, read without starting a service): a route added or removed in
the code fails the check until its operation below is written or removed. The bodies are the
``openai`` package's types (``model_json_schema()`` of its pydantic models, a ``TypeAdapter``'s
schema of its request ``TypedDict``s), so a request or an answer is described as OpenAI's
client reads it; what the service narrows (the batch endpoints it runs, the parameters of its
usage API, its upload form) comes from its own constants. The property-based fuzz of the
running service (tests/service/test_routes_fuzz_on_ray.py) reads this file.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "reference" / "openapi.json"
REF = "#/components/schemas/{model}"
JSON, HTML, BYTES = "application/json", "text/html", "application/octet-stream"

#: Fields OpenAI's published description requires (``null`` when there is nothing) that the
#: ``openai`` package's models leave optional (it types a required nullable field as
#: ``Optional[...] = None``, as it types an absent one): (schema, its defining model) ->
#: the fields.
REQUIRED_AS_OPENAI = {
    ("ChatCompletionMessage", "ChatCompletion"): ("content", "refusal", "role"),
    ("Choice", "ChatCompletion"): ("finish_reason", "index", "logprobs", "message"),
    ("CompletionChoice", "Completion"): ("finish_reason", "index", "logprobs", "text"),
}


class Schemas:
    """``components.schemas``: each model's ``$defs`` merged in; a name two models define
    differently is kept apart as ``Owner.Name``."""

    def __init__(self) -> None:
        self.components: dict[str, Any] = {}

    def model(self, model: Any, name: str | None = None) -> dict[str, str]:
        return self.add(name or model.__name__, model.model_json_schema(ref_template=REF))

    def typed(self, typed: Any, name: str) -> dict[str, str]:
        from pydantic import TypeAdapter

        return self.add(name, TypeAdapter(typed).json_schema(ref_template=REF))

    def add(self, name: str, schema: dict[str, Any]) -> dict[str, str]:
        schema = copy.deepcopy(schema)
        defs: dict[str, Any] = schema.pop("$defs", {})
        for (def_name, owner), fields in REQUIRED_AS_OPENAI.items():
            if owner == name and def_name in defs:
                defs[def_name]["required"] = sorted({*defs[def_name].get("required", ()), *fields})
        renamed: dict[str, str] = {}
        while True:  # a def renamed changes the defs that point at it: until nothing differs
            tree = _renamed({"top": schema, **defs}, renamed)
            clash = {
                d
                for d in defs
                if d not in renamed
                and d in self.components
                and self.components[d] != tree[renamed.get(d, d)]
            }
            if not clash:
                break
            renamed.update({d: f"{name}.{d}" for d in clash})
        for def_name in defs:
            self.components.setdefault(renamed.get(def_name, def_name), tree[def_name])
        top = tree["top"]
        top.pop("title", None)
        if self.components.get(name, top) != top:
            raise ValueError(f"two schemas named {name}")
        self.components[name] = top
        return {"$ref": REF.format(model=name)}


def _renamed(tree: dict[str, Any], renamed: dict[str, str]) -> dict[str, Any]:
    """``tree`` with every ``$ref`` to a renamed def pointing at its new name."""

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            out = {key: walk(item) for key, item in value.items()}
            ref = out.get("$ref")
            if isinstance(ref, str) and ref.startswith(REF.format(model="")):
                target = ref[len(REF.format(model="")) :]
                out["$ref"] = REF.format(model=renamed.get(target, target))
            return out
        if isinstance(value, list):
            return [walk(item) for item in value]
        return value

    return {key: walk(value) for key, value in tree.items()}


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


def operations(schemas: Schemas) -> dict[tuple[str, str], dict[str, Any]]:
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
    from relayllm.batch.service.admin import AdminStore
    from relayllm.batch.service.settings import MAX_EXPIRES_S, MIN_EXPIRES_S
    from relayllm.batch.service.usage_api import GROUPS, LIMITS, WIDTHS

    file, batch = schemas.model(FileObject), schemas.model(Batch)
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
            schemas.model(CreateEmbeddingResponse),
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
                _query("after", {"type": "string"}, "The id the previous page ended with."),
                _query(
                    "limit",
                    {"type": "integer", "minimum": 1, "maximum": most_files},
                    "Files per page.",
                ),
                _query("order", {"type": "string", "enum": ["asc", "desc"]}, "By creation."),
                _query("purpose", {"type": "string"}, "Only files of this purpose."),
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
                _query("after", {"type": "string"}, "The id the previous page ended with."),
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
            "responses": {"200": _json(models, "The deployments.")},
        },
        ("/v1/organization/usage/completions", "get"): {
            "summary": "Every project's usage, batch and online, in time buckets (admin key).",
            "parameters": [
                _query(
                    "start_time", {"type": "integer"}, "Unix seconds, inclusive.", required=True
                ),
                _query("end_time", {"type": "integer"}, "Unix seconds, exclusive (default: now)."),
                _query("bucket_width", {"type": "string", "enum": list(WIDTHS)}, "Bucket width."),
                _query(
                    "group_by",
                    {"type": "array", "items": {"type": "string", "enum": list(GROUPS)}},
                    "Fields to group the results by.",
                ),
                _query(
                    "project_ids",
                    {"type": "array", "items": {"type": "string"}},
                    "Only these projects.",
                ),
                _query(
                    "models", {"type": "array", "items": {"type": "string"}}, "Only these models."
                ),
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
                _query("page", {"type": "string"}, "The previous page's `next_page`."),
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


def served_routes() -> list[tuple[str, str]]:
    """(path, method) of every route the gateway serves, from its own table."""
    from relayllm.batch.service.console import Console
    from relayllm.batch.service.gateway import Gateway

    gateway, console = Gateway.__new__(Gateway), Console.__new__(Console)  # no service started
    routes = gateway._routes() + console.routes()
    return [(r.path, m.lower()) for r in routes for m in sorted(r.methods or ()) if m != "HEAD"]


def build() -> dict[str, Any]:
    from importlib.metadata import version

    from relayllm.batch.service.console import COOKIE

    schemas = Schemas()
    error = {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type", "param", "code"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": {"type": ["string", "null"]},
                    "code": {"type": ["string", "null"]},
                },
            }
        },
    }
    schemas.add("Error", error)
    table = operations(schemas)
    served = served_routes()
    missing = [route for route in served if route not in table]
    gone = [route for route in table if route not in served]
    if missing or gone:
        raise LookupError(
            f"routes the gateway serves with no operation here: {missing}; operations of no "
            f"route: {gone}; update docs/gen_openapi.py"
        )
    paths: dict[str, dict[str, Any]] = {}
    for path, method in served:
        operation = {"operationId": _operation_id(path, method), **table[(path, method)]}
        paths.setdefault(path, {})[method] = operation
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "relayllm serve",
            "version": "1",
            "description": "The Batch API service: OpenAI's files, batches and usage API, the "
            "online routes of its deployments, and the console. Generated by "
            "docs/gen_openapi.py from the gateway's routes and the openai package's types.",
            "x-generated-with": {name: version(name) for name in ("openai", "pydantic")},
        },
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A project's key or the admin key.",
                },
                "session": {"type": "apiKey", "in": "cookie", "name": COOKIE},
            },
            "responses": {
                "Error": {
                    "description": "OpenAI's error envelope.",
                    "headers": {"Retry-After": {"schema": {"type": "string"}}},
                    "content": {JSON: {"schema": {"$ref": REF.format(model="Error")}}},
                }
            },
            "schemas": dict(sorted(schemas.components.items())),
        },
    }


def _operation_id(path: str, method: str) -> str:
    words = [w.strip("{}") for w in path.split("/") if w and w != "v1"]
    return method + "".join(
        w[:1].upper() + w[1:] for w in "_".join(words).replace("-", "_").split("_")
    )


def text(committed: str | None = None) -> str:
    """The description as JSON text. With ``committed`` (a check): when that one was made
    with other versions of the ``openai`` package or pydantic (whose types and schemas are
    theirs) and describes the same routes, parameters and statuses, ``committed`` itself, so
    a new release of either does not fail an unrelated check; regenerate to take it in."""
    new = build()
    if committed:
        try:
            old = json.loads(committed)
        except ValueError:
            return _dumps(new)
        made_with = old.get("info", {}).get("x-generated-with")
        if made_with != new["info"]["x-generated-with"] and _skeleton(old) == _skeleton(new):
            return committed
    return _dumps(new)


def _dumps(spec: dict[str, Any]) -> str:
    return json.dumps(spec, indent=1, ensure_ascii=False) + "\n"


def _skeleton(spec: dict[str, Any]) -> dict[str, Any]:
    """What relayllm's code decides: each operation's parameters, body types and statuses."""
    return {
        (path, method): (
            [(p["in"], p["name"], p["schema"]) for p in op.get("parameters", [])],
            sorted(op.get("requestBody", {}).get("content", {})),
            sorted(op["responses"]),
        )
        for path, item in spec.get("paths", {}).items()
        for method, op in item.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    old = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
    new = text(old if args.check else None)
    if old == new:
        return 0
    if args.check:
        print(f"stale: {args.out}; run python docs/gen_openapi.py", file=sys.stderr)
        return 1
    args.out.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
