"""The OpenAI Batch API file format: request lines in, response and error lines out.

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

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from relayllm.errors import ConfigError
from relayllm.rows import (
    EMBEDDING,
    ERROR,
    FINISH_REASON,
    GENERATED_TEXT,
    INPUT_COLUMN,
    LOGPROBS,
    NUM_GENERATED_TOKENS,
    NUM_INPUT_TOKENS,
    REASONING_CONTENT,
    REQUEST_ID,
    SAMPLES,
    SAMPLING_PARAMS_COLUMN,
    SCORE,
    TOOL_CALLS,
    Task,
    check_messages,
    check_sampling_params,
)

URL_TASKS: dict[str, Task] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completion",
    "/v1/embeddings": "embedding",
    "/v1/score": "score",
    "/v1/rerank": "score",
}
#: Body keys of a scoring line: (queries, documents) as vLLM's server names them.
_SCORE_KEYS = (("text_1", "text_2"), ("queries", "documents"), ("query", "documents"))

#: Body keys that are not sampling parameters (the rest are passed to the backend as such).
_NOT_SAMPLING = {
    "model",
    "messages",
    "prompt",
    "input",
    "stream",
    "stream_options",
    "user",
    "metadata",
    "store",
    "encoding_format",
    "dimensions",
}


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


@dataclass
class BadLine:
    line: int
    custom_id: str | None
    code: str
    message: str


@dataclass
class BatchFile:
    requests: list[BatchRequest] = field(default_factory=list)
    bad: list[BadLine] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.requests) + len(self.bad)


def read_batch_file(path: str) -> BatchFile:
    """Parse every line; duplicate ``custom_id``s reject the whole file (as OpenAI does)."""
    parsed = BatchFile()
    try:
        with open(path, encoding="utf-8") as handle:
            for number, text in enumerate(handle, start=1):
                if not text.strip():
                    continue
                item = parse_line(text, number)
                if isinstance(item, BadLine):
                    parsed.bad.append(item)
                else:
                    parsed.requests.append(item)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the batch file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    lines_of: dict[str, list[int]] = {}
    items: list[BatchRequest | BadLine] = [*parsed.requests, *parsed.bad]
    for item in items:
        if item.custom_id is not None:
            lines_of.setdefault(item.custom_id, []).append(item.line)
    duplicates = {cid: sorted(lines) for cid, lines in lines_of.items() if len(lines) > 1}
    if duplicates:
        raise duplicate_ids_error(path, duplicates)
    if not parsed.total:
        raise ConfigError(f"{path}: the batch file has no request lines")
    return parsed


@dataclass
class Envelope:
    """What the driver's scan of a line needs: who it is and where it goes (the body is
    checked in full later, by :func:`parse_line`, where the line runs)."""

    custom_id: str
    task: Task
    url: str
    body: dict[str, Any]
    model: str | None


def duplicate_ids_error(path: str, duplicates: dict[str, list[int]]) -> ConfigError:
    """The error for a batch file whose custom_ids repeat (``duplicates``: id -> its lines)."""
    shown = "; ".join(
        f"{cid!r} on lines {', '.join(map(str, n))}" for cid, n in list(duplicates.items())[:10]
    )
    more = f" (and {len(duplicates) - 10} more)" if len(duplicates) > 10 else ""
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
    try:
        item = json.loads(text)
    except json.JSONDecodeError as exc:
        return BadLine(
            line,
            None,
            "invalid_json",
            f"line {line}: not valid JSON: {exc.msg} (column {exc.colno})",
        )
    if not isinstance(item, dict):
        return BadLine(
            line, None, "invalid_request", f"line {line}: a request line must be a JSON object"
        )
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return BadLine(
            line, None, "missing_custom_id", f"line {line}: 'custom_id' must be a non-empty string"
        )

    def bad(code: str, message: str) -> BadLine:
        return BadLine(line, custom_id, code, f"line {line}: {message}")

    unknown = sorted(set(item) - {"custom_id", "method", "url", "body"})
    if unknown:
        return bad(
            "invalid_request", f"unknown keys {unknown}; a line has custom_id, method, url, body"
        )
    if item.get("method", "POST") != "POST":
        return bad("invalid_request", f"'method' must be POST, got {item.get('method')!r}")
    url = item.get("url")
    task = URL_TASKS.get(url) if isinstance(url, str) else None
    if task is None:
        return bad(
            "unsupported_url", f"'url' {url!r} is not supported; use one of {', '.join(URL_TASKS)}"
        )
    body = item.get("body")
    if not isinstance(body, dict):
        return bad("invalid_request", "'body' must be a JSON object")
    if body.get("stream"):
        return bad("invalid_request", "'stream' is not supported in a batch")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        return bad("invalid_request", f"'model' must be a string, got {model!r}")
    return Envelope(custom_id, task, str(url), body, model)


def parse_body(envelope: Envelope, line: int, check: bool = True) -> BatchRequest | BadLine:
    """The request of a line whose envelope is valid, or the reason its body cannot run.

    ``check=False`` leaves out the checks of ``messages`` and the sampling parameters that the
    stage's ``rows.build_request`` makes again on every row anyway: a row that fails there is
    parsed again with them, for the reason to report (``batch_file``)."""
    custom_id, task, body, model = envelope.custom_id, envelope.task, envelope.body, envelope.model
    url = envelope.url

    def bad(code: str, message: str) -> BadLine:
        return BadLine(line, custom_id, code, f"line {line}: {message}")

    if task == "score":
        return _score_line(line, custom_id, str(url), body, model, bad)
    key = INPUT_COLUMN[task]
    value = body.get(key)
    if task == "chat":
        problem = check_messages(value) if check else None
        if problem:
            return bad("invalid_request", problem)
    else:
        if isinstance(value, list) and len(value) == 1:
            value = value[0]  # one prompt/input per line: the row protocol's shape
        if not isinstance(value, str) or not value:
            return bad(
                "invalid_request", f"'{key}' must be a non-empty string (or a list of exactly one)"
            )

    params = (
        {k: v for k, v in body.items() if k not in _NOT_SAMPLING} if task != "embedding" else {}
    )
    if "max_completion_tokens" in params:
        params.setdefault("max_tokens", params.pop("max_completion_tokens"))
    problem = check_sampling_params(params) if check else None
    if problem:
        return bad("invalid_request", problem.replace("sampling_params.", "body."))
    return BatchRequest(line, custom_id, task, value, params, model)


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


def route(
    requests: list[BatchRequest], deployments: list[str], default: str | None
) -> dict[int, str]:
    """The deployment each request goes to, by line (see :func:`route_models`)."""
    first_line: dict[str | None, int] = {}
    for request in requests:
        first_line.setdefault(request.model, request.line)
    to = route_models(first_line, deployments, default)
    return {request.line: to[request.model] for request in requests}


def route_models(
    first_line: dict[str | None, int], deployments: list[str], default: str | None
) -> dict[str | None, str]:
    """The deployment each ``model`` value of a file goes to (``first_line``: each value and
    the first line that uses it, for the error message).

    A ``model`` naming one of ``deployments`` goes there. Otherwise, if the file uses at most
    one ``model`` value, everything goes to ``default``. Several model values that do not all
    name deployments is an error before anything runs.
    """
    unrouted = sorted({m for m in first_line if m is not None and m not in deployments})
    named = [m for m in first_line if m is not None]
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


def batch_request_id() -> str:
    return f"batch_req_{uuid.uuid4().hex}"


def response_line(request: BatchRequest, result: dict[str, Any], model: str) -> dict[str, Any]:
    """The OpenAI batch output line for a request that succeeded."""
    now = int(time.time())
    rid = result.get(REQUEST_ID) or uuid.uuid4().hex
    prompt_tokens = result.get(NUM_INPUT_TOKENS) or 0
    completion_tokens = result.get(NUM_GENERATED_TOKENS) or 0
    if request.task == "score":
        return _score_response(request, result, model, rid)
    if request.task == "embedding":
        body: dict[str, Any] = {
            "object": "list",
            "data": [
                {"object": "embedding", "index": 0, "embedding": list(result.get(EMBEDDING) or [])}
            ],
            "model": model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        }
    else:
        # n > 1: one choice per sample; otherwise the row's own columns are the one choice.
        samples = result.get(SAMPLES) or [result]
        choices = [_choice(request.task, i, s) for i, s in enumerate(samples)]
        if request.task == "chat":
            kind, prefix = "chat.completion", "chatcmpl"
        else:
            kind, prefix = "text_completion", "cmpl"
        body = {
            "id": f"{prefix}-{rid}",
            "object": kind,
            "created": now,
            "model": model,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
    return {
        "id": batch_request_id(),
        "custom_id": request.custom_id,
        "response": {"status_code": 200, "request_id": rid, "body": body},
        "error": None,
    }


def _score_response(
    request: BatchRequest, result: dict[str, Any], model: str, rid: str
) -> dict[str, Any]:
    """vLLM's score / rerank response body for a line whose pairs all succeeded
    (``result["pairs"]``: each pair's row)."""
    rows = result["pairs"]
    tokens = sum(r.get(NUM_INPUT_TOKENS) or 0 for r in rows)
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    if request.rerank:
        ranked = sorted(range(len(rows)), key=lambda i: rows[i][SCORE], reverse=True)
        ranked = ranked[: request.top_n] if request.top_n else ranked
        body: dict[str, Any] = {
            "id": f"rerank-{rid}",
            "model": model,
            "usage": usage,
            "results": [
                {
                    "index": i,
                    "document": {"text": request.pairs[i][1]},
                    "relevance_score": rows[i][SCORE],
                }
                for i in ranked
            ],
        }
    else:
        body = {
            "id": f"score-{rid}",
            "object": "list",
            "created": int(time.time()),
            "model": model,
            "data": [
                {"index": i, "object": "score", "score": r[SCORE]} for i, r in enumerate(rows)
            ],
            "usage": usage,
        }
    return {
        "id": batch_request_id(),
        "custom_id": request.custom_id,
        "response": {"status_code": 200, "request_id": rid, "body": body},
        "error": None,
    }


def _choice(task: str, index: int, sample: dict[str, Any]) -> dict[str, Any]:
    """One of a response's ``choices`` from a row (or one of its ``samples``), in OpenAI's
    shape: tool calls in ``message.tool_calls``, logprobs in ``logprobs.content`` (chat) or
    the completions API's parallel lists."""
    text = sample.get(GENERATED_TEXT)
    finish = sample.get(FINISH_REASON) or "stop"
    logprobs = sample.get(LOGPROBS)
    if task == "chat":
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if sample.get(TOOL_CALLS):
            message["tool_calls"] = sample[TOOL_CALLS]
        if sample.get(REASONING_CONTENT) is not None:
            message["reasoning_content"] = sample[REASONING_CONTENT]
        if message["content"] is None and "tool_calls" not in message:
            message["content"] = ""
        chat_logprobs = None
        if logprobs is not None:
            chat_logprobs = {"content": [_token_logprob(t) for t in logprobs], "refusal": None}
        return {
            "index": index,
            "message": message,
            "finish_reason": finish,
            "logprobs": chat_logprobs,
        }
    completion_logprobs = None
    if logprobs is not None:
        offsets, at = [], 0
        for entry in logprobs:
            offsets.append(at)
            at += len(entry.get("token") or "")
        completion_logprobs = {
            "tokens": [t.get("token") for t in logprobs],
            "token_logprobs": [t.get("logprob") for t in logprobs],
            "top_logprobs": [
                {a["token"]: a["logprob"] for a in t.get("top_logprobs") or []} for t in logprobs
            ],
            "text_offset": offsets,
        }
    return {
        "index": index,
        "text": text or "",
        "finish_reason": finish,
        "logprobs": completion_logprobs,
    }


def _token_logprob(entry: dict[str, Any]) -> dict[str, Any]:
    """A row's logprob entry in OpenAI's chat shape (with the token's UTF-8 bytes)."""

    def one(token: str | None, logprob: float | None) -> dict[str, Any]:
        token = token or ""
        return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}

    out = one(entry.get("token"), entry.get("logprob"))
    out["top_logprobs"] = [
        one(a.get("token"), a.get("logprob")) for a in entry.get("top_logprobs") or []
    ]
    return out


def _rows_of(request: BatchRequest) -> list[dict[str, Any]]:
    """The stage rows of one request line: one, or one per (query, document) pair."""
    if request.task == "score":
        return [
            {"line": request.line, "pair": i, "query": q, "document": d}
            for i, (q, d) in enumerate(request.pairs)
        ]
    row = {
        "line": request.line,
        INPUT_COLUMN[request.task]: request.value,
        SAMPLING_PARAMS_COLUMN: request.sampling_params or None,
    }
    return [row]


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


def request_counts(total: int, completed: int, failed: int) -> dict[str, int]:
    return {"total": total, "completed": completed, "failed": failed}


def served_model(deployment: str) -> str:
    """The model that answers on ``deployment`` (its ``info()``), for the response's
    ``model`` field: OpenAI reports the model that served a request, not the one asked for."""
    from relayllm.deployments import handle_for

    try:
        info = handle_for(deployment).info.remote().result(timeout_s=60)
    except Exception:
        return deployment
    model = info.get("model") if isinstance(info, dict) else None
    return str(model) if model else deployment


def run_batch(
    parsed: BatchFile,
    routes: dict[int, str],
    output: Any,
    errors: Any,
    processor_fields: dict[str, Any] | None = None,
) -> dict[str, int]:
    """Run requests already parsed in memory on their deployments; write each line to
    ``output`` or ``errors`` (text files); return OpenAI's ``request_counts``. Each group is one
    block on one stage actor: for a few requests; ``relayllm batch`` streams a file of any size
    with :mod:`relayllm.batch.run` instead."""
    import ray

    from relayllm.data_context import keep_input_order
    from relayllm.processor import ProcessorConfig, build_processor

    keep_input_order()
    failed = 0
    for bad in parsed.bad:
        errors.write(json.dumps(error_line(bad.line, bad.custom_id, bad.code, bad.message)) + "\n")
        failed += 1
    groups: dict[tuple[str, Task], list[BatchRequest]] = {}
    for request in parsed.requests:
        groups.setdefault((routes[request.line], request.task), []).append(request)
    completed = 0
    served: dict[str, str] = {}
    for (deployment, task), requests in groups.items():
        if deployment not in served:
            served[deployment] = served_model(deployment)
        by_line = {r.line: r for r in requests}
        rows = [row for r in requests for row in _rows_of(r)]
        config = ProcessorConfig(deployment=deployment, task=task, **(processor_fields or {}))
        # One block: request bodies differ in shape (string vs list content, different
        # params), which Arrow can hold in one block but not concatenate across blocks.
        dataset = build_processor(config)(ray.data.from_items(rows, override_num_blocks=1))
        pending: dict[int, list[dict[str, Any]]] = {}  # a scoring line's pairs so far
        for batch in dataset.iter_batches(batch_format="pyarrow", batch_size=None):
            for row in batch.to_pylist():  # type: ignore[union-attr]
                request = by_line[row["line"]]
                if task == "score":
                    pending.setdefault(request.line, []).append(row)
                    if len(pending[request.line]) < len(request.pairs):
                        continue
                    row = gathered(sorted(pending.pop(request.line), key=lambda r: r["pair"]))
                if row.get(ERROR):
                    failed += 1
                    line = error_line(
                        request.line,
                        request.custom_id,
                        "engine_error",
                        f"deployment {deployment!r}: {row[ERROR]}",
                    )
                    errors.write(json.dumps(line, ensure_ascii=False) + "\n")
                else:
                    completed += 1
                    line = response_line(request, row, served[deployment])
                    output.write(json.dumps(line, ensure_ascii=False) + "\n")
    return request_counts(parsed.total, completed, failed)


__all__ = [
    "URL_TASKS",
    "BadLine",
    "BatchFile",
    "BatchRequest",
    "Envelope",
    "error_line",
    "parse_line",
    "read_batch_file",
    "request_counts",
    "response_line",
    "parse_body",
    "parse_envelope",
    "route",
    "route_models",
    "run_batch",
]
