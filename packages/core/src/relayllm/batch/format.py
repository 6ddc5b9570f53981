"""The OpenAI Batch API file format: request lines in (their lines out: relayllm.batch.output).

A request line is ``{"custom_id", "method": "POST", "url", "body"}`` with ``url`` one of
:data:`URL_TASKS`. An output line is ``{"id", "custom_id", "response": {"status_code",
"request_id", "body"}, "error": null}``; an error line has ``"response": null`` and ``"error":
{"code", "message", "line"}``. Every input line ends up in exactly one of the two files.

``/v1/score`` and ``/v1/rerank`` (vLLM's server's scoring endpoints, which the OpenAI Batch
API does not have) take one query and several documents per line: each (query, document)
pair is one row of the ``score`` task, and the line's response gathers them (a pair that
fails sends the whole line to the error file, naming the document).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from relayllm import bounded_json, openai_body, openai_responses
from relayllm.errors import ConfigError
from relayllm.rows import Task, check_messages, check_sampling_params

URL_TASKS: dict[str, Task] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completion",
    "/v1/embeddings": "embedding",
    "/v1/responses": "chat",  # text in, text out: translated to a chat and back
    "/v1/score": "score",
    "/v1/rerank": "score",
}
#: Body keys of a scoring line: (queries, documents) as vLLM's server names them.
_SCORE_KEYS = (("text_1", "text_2"), ("queries", "documents"), ("query", "documents"))


@dataclass
class BatchRequest:
    line: int
    custom_id: str
    task: Task
    value: Any  # messages (chat), prompt (completion) or input (embedding)
    sampling_params: dict[str, Any]
    model: str | None = None
    #: score / rerank: the (query, document) pairs of the line, one row each.
    pairs: list[tuple[str, str]] = field(default_factory=list)
    rerank: bool = False
    top_n: int = 0
    #: A ``/v1/responses`` line: its answer is a ``response`` object, not a chat completion.
    responses: bool = False


@dataclass
class BadLine:
    line: int
    custom_id: str | None
    code: str
    message: str
    #: The field at fault (``custom_id``, ``url``, ``body.model``...), for the ``param`` of
    #: OpenAI's batch ``errors`` entries; None when it is the line as a whole.
    param: str | None = None


@dataclass
class Envelope:
    """What the driver's scan of a line needs: who it is and where it goes (the body is
    checked in full later, by :func:`parse_line`, where the line runs)."""

    custom_id: str
    task: Task
    url: str
    body: dict[str, Any]
    model: str | None
    #: What makes the body unrunnable, found while the envelope was read (nested too deep,
    #: text that cannot be encoded as UTF-8): the line's entry in the error file, as a body
    #: the checks refuse.
    problem: BadLine | None = None


#: The error code of a line nested deeper than the reader's limit.
TOO_DEEP = "nesting_too_deep"
_ENVELOPE_KEYS = ("custom_id", "method", "url")  # read from a line too deep to parse


def duplicate_ids_error(
    path: str, duplicates: dict[str, list[int]], count: int | None = None
) -> ConfigError:
    """The error for a batch file whose custom_ids repeat (``duplicates``: id -> its lines,
    the first ten named; ``count``: how many ids repeat, when ``duplicates`` holds only some)."""
    shown = "; ".join(
        f"{cid!r} on lines {', '.join(map(str, n))}" for cid, n in list(duplicates.items())[:10]
    )
    count = len(duplicates) if count is None else count
    more = f" (and {count - 10} more)" if count > 10 else ""
    return ConfigError(f"{path}: duplicate custom_id values, nothing was run: {shown}{more}")


def parse_line(text: str, line: int, check: bool = True) -> BatchRequest | BadLine:
    """One request line, or the reason it cannot run (see :func:`parse_body` for ``check``)."""
    envelope = parse_envelope(text, line)
    if isinstance(envelope, BadLine):
        return envelope
    return parse_body(envelope, line, check)


def parse_envelope(text: str, line: int) -> Envelope | BadLine:
    """A line's JSON, ``custom_id``, ``method``, ``url`` and ``body`` object checked; the
    body's contents are not (see :func:`parse_body`)."""
    deep: str | None = None
    try:
        item: Any = bounded_json.loads(text, check_strings=False)
    except bounded_json.TooDeepError as exc:  # who it is, read without parsing it
        deep = exc.message
        item = bounded_json.top_level_strings(text, _ENVELOPE_KEYS)
        if item is not None:
            item["body"] = {}  # the strings read, and an empty body: what is checked
    except bounded_json.JsonTextError as exc:
        return BadLine(line, None, "invalid_json", f"line {line}: {exc.message}")
    if not isinstance(item, dict):
        return BadLine(
            line, None, "invalid_request", f"line {line}: a request line must be a JSON object"
        )
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return BadLine(
            line,
            None,
            "missing_custom_id",
            f"line {line}: 'custom_id' must be a non-empty string",
            "custom_id",
        )
    unencodable = bounded_json.may_hold_unencodable(text)
    where = bounded_json.unencodable_path(item) if unencodable else None
    not_utf8 = f"{where} holds text that cannot be encoded as UTF-8"
    if where is not None and not where.startswith("body"):  # no id to report it under
        return BadLine(line, None, "invalid_request", f"line {line}: {not_utf8}", where)

    def bad(code: str, message: str, param: str | None = None) -> BadLine:
        return BadLine(line, custom_id, code, f"line {line}: {message}", param)

    unknown = sorted(set(item) - {"custom_id", "method", "url", "body"})
    if unknown:
        return bad(
            "invalid_request", f"unknown keys {unknown}; a line has custom_id, method, url, body"
        )
    if item.get("method", "POST") != "POST":
        return bad(
            "invalid_request", f"'method' must be POST, got {item.get('method')!r}", "method"
        )
    url = item.get("url")
    task = URL_TASKS.get(url) if isinstance(url, str) else None
    if task is None:
        return bad(
            "unsupported_url",
            f"'url' {url!r} is not supported; use one of {', '.join(URL_TASKS)}",
            "url",
        )
    body = item.get("body")
    if not isinstance(body, dict):
        return bad("invalid_request", "'body' must be a JSON object", "body")
    if body.get("stream"):
        return bad("invalid_request", "'stream' is not supported in a batch", "body.stream")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        return bad("invalid_request", f"'model' must be a string, got {model!r}", "body.model")
    problem = bad(TOO_DEEP, deep, "body") if deep is not None else None
    if where is not None:
        problem = bad("invalid_request", not_utf8, where)
    return Envelope(custom_id, task, str(url), body, model, problem)


def parse_body(envelope: Envelope, line: int, check: bool = True) -> BatchRequest | BadLine:
    """The request of a line whose envelope is valid, or the reason its body cannot run.

    ``check=False`` leaves out the checks of ``messages`` and the sampling parameters that the
    stage's ``rows.build_request`` makes again on every row anyway: a row that fails there is
    parsed again with them, for the reason to report (``batch_file``)."""
    if envelope.problem is not None:
        return envelope.problem
    custom_id, task, body, model = envelope.custom_id, envelope.task, envelope.body, envelope.model
    url = envelope.url

    def bad(code: str, message: str) -> BadLine:
        return BadLine(line, custom_id, code, f"line {line}: {message}")

    if task == "score":
        return _score_line(line, custom_id, str(url), body, model, bad)
    responses = url == "/v1/responses"
    if responses:
        body, problem = openai_responses.responses_as_chat(body)
        if problem:
            return bad("invalid_request", problem)
    value, problem = openai_body.single_input(task, body)
    if task == "chat" and check:
        problem = check_messages(value)
    if problem:
        return bad("invalid_request", problem)
    params = openai_body.sampling_params(task, body)
    problem = check_sampling_params(params) if check else None
    if problem:
        return bad("invalid_request", problem.replace("sampling_params.", "body."))
    return BatchRequest(line, custom_id, task, value, params, model, responses=responses)


def _score_line(
    line: int, custom_id: str, url: str, body: dict[str, Any], model: str | None, bad: Any
) -> BatchRequest | BadLine:
    """A ``/v1/score`` line (``text_1``/``text_2`` or ``queries``/``documents``: one query and
    N documents, or N of each, paired in order) or a ``/v1/rerank`` line (``query``,
    ``documents``, optional ``top_n``)."""
    rerank = url.endswith("rerank")
    keys = [_SCORE_KEYS[2]] if rerank else list(_SCORE_KEYS[:2])
    found = next(((q, d) for q, d in keys if q in body and d in body), None)
    if found is None:
        names = " or ".join(f"'{q}' and '{d}'" for q, d in keys)
        return bad("invalid_request", f"a {url} body needs {names}")
    queries, documents = (body[k] for k in found)
    queries = [queries] if isinstance(queries, str) else queries
    documents = [documents] if isinstance(documents, str) else documents
    for name, values in zip(found, (queries, documents), strict=True):
        if not isinstance(values, list) or not values:
            return bad("invalid_request", f"'{name}' must be a string or a non-empty list")
        if not all(isinstance(v, str) and v for v in values):
            return bad("invalid_request", f"'{name}' must hold non-empty strings (text only)")
    if len(queries) == 1:
        queries = queries * len(documents)
    if len(queries) != len(documents):
        return bad(
            "invalid_request",
            f"'{found[0]}' has {len(queries)} texts and '{found[1]}' {len(documents)}: give one "
            f"query, or as many as documents",
        )
    top_n = body.get("top_n", 0) if rerank else 0
    if not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 0:
        return bad("invalid_request", f"'top_n' must be a non-negative integer, got {top_n!r}")
    unknown = sorted(set(body) - {*found, "model", "top_n", "user"})
    if unknown:
        return bad("invalid_request", f"unknown keys {unknown} in a {url} body")
    pairs = list(zip(queries, documents, strict=True))
    return BatchRequest(line, custom_id, "score", None, {}, model, pairs, rerank, top_n)


def default_deployment(names: list[str]) -> str | None:
    """The deployment a line or request without a matching ``model`` goes to: the only one
    there is, else none."""
    return names[0] if len(names) == 1 else None


def route_models(
    first_line: dict[str | None, int],
    deployments: list[str],
    default: str | None,
    strict: bool = True,
) -> dict[str | None, str]:
    """The deployment each ``model`` value of a file goes to (``first_line``: each value and
    the first line that uses it, for the error message).

    A ``model`` naming one of ``deployments`` goes there. Otherwise, if the file uses at most
    one ``model`` value, everything goes to ``default``. Several model values that do not all
    name deployments is an error before anything runs. ``strict=False`` (the batch service,
    where an unknown model fails only its lines) leaves the values that route nowhere out of
    the answer instead of raising.
    """
    unrouted = sorted({m for m in first_line if m is not None and m not in deployments})
    named = [m for m in first_line if m is not None]
    if not strict:
        single = len(named) <= 1
        return {
            model: model if model in deployments else str(default)
            for model in first_line
            if model in deployments or (default is not None and (model is None or single))
        }
    if len(named) > 1 and unrouted:
        raise ConfigError(
            f"the file mixes model values {sorted(named)}; each must name a deployment to route "
            f"to, and {unrouted} do not (deployments: {', '.join(deployments) or 'none'})"
        )
    out: dict[str | None, str] = {}
    for model, line in sorted(first_line.items(), key=lambda item: item[1]):
        if model is not None and model in deployments:
            out[model] = model
        elif default is not None:
            out[model] = default
        else:
            raise ConfigError(
                f"line {line}: model {model!r} names none of the deployments "
                f"({', '.join(deployments)}); name one, or give the file a single deployment"
            )
    return out


__all__ = [
    "URL_TASKS",
    "BadLine",
    "BatchRequest",
    "Envelope",
    "default_deployment",
    "TOO_DEEP",
    "parse_line",
    "parse_body",
    "parse_envelope",
    "route_models",
]
