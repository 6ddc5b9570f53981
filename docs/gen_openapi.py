"""Write docs/reference/openapi.json: the OpenAPI description of what ``relayllm serve``
answers (the Batch API service's gateway: files, batches, the usage API, the online routes,
the console).

    python docs/gen_openapi.py           # write the description
    python docs/gen_openapi.py --check   # exit 1 when the committed one is stale

``python docs/gen_reference.py`` writes (and ``--check`` checks) it with the other reference
pages. The paths and methods are the gateway's own route table (``Gateway._routes``, each
feature's routes, and the console's ``Console.routes``, read without starting a service): a
route added or removed in the code fails the check until its operation below is written or
removed. The bodies are the
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

from openapi_operations import JSON, REF, operations  # beside this script

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "reference" / "openapi.json"

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


def served_routes() -> list[tuple[str, str]]:
    """(path, method) of every route the gateway serves, from its own table."""
    from relayllm_service.console.routes import Console
    from relayllm_service.gateway.app import Gateway
    from relayllm_service.gateway.batches import BatchRoutes
    from relayllm_service.gateway.files import FileRoutes

    gateway, console = Gateway.__new__(Gateway), Console.__new__(Console)  # no service started
    gateway.files, gateway.batches = (
        FileRoutes.__new__(FileRoutes),
        BatchRoutes.__new__(BatchRoutes),
    )
    routes = gateway._routes() + console.routes()
    return [(r.path, m.lower()) for r in routes for m in sorted(r.methods or ()) if m != "HEAD"]


def build() -> dict[str, Any]:
    from importlib.metadata import version

    from relayllm_service.console.routes import COOKIE

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
            f"route: {gone}; update docs/openapi_operations.py"
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
