"""OpenAI's Usage API over the ledger (:mod:`relayllm_service.tenancy.usage`), the subset a
batch service has: ``GET /v1/organization/usage/completions`` with ``start_time``,
``end_time``, ``bucket_width`` (``1m``, ``1h``, ``1d``), ``group_by`` (``project_id``,
``model``, ``batch``), ``project_ids``, ``models``, ``batch``, ``limit`` and ``page``, answered
in OpenAI's page of buckets of results (the ``openai`` client's
``admin.organization.usage.completions``), each result with one field OpenAI's has not:
``engine_s``, the engine seconds. And the gateway's metering of online requests:
:func:`metered` records a response's usage before the client has read all of it.

Buckets start on whole multiples of their width (UTC midnight for ``1d``), the first one at
or before ``start_time``; only usage in ``[start_time, end_time)`` is counted. Every bucket
of the range is listed, empty ones with no results, as OpenAI lists them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from relayllm_service.errors import InvalidRequestError
from relayllm_service.gateway.params import choice, items, one, unix_time, whole
from relayllm_service.tenancy.usage import UsageLedger, Use, body_use

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

#: Bucket widths in seconds.
WIDTHS = {"1m": 60, "1h": 3600, "1d": 86400}
#: Buckets per page: (default, most), OpenAI's.
LIMITS = {"1m": (60, 1440), "1h": (24, 168), "1d": (7, 31)}
#: ``group_by`` fields -> the ledger's column.
GROUPS = {"project_id": "project", "model": "model", "batch": "batch_id"}
#: OpenAI's fields this service has no data for: refused, not answered with nothing.
UNSUPPORTED = ("user_ids", "api_key_ids")


def completions_page(
    ledger: UsageLedger, query: Mapping[str, Sequence[str]], now: int
) -> dict[str, Any]:
    """The Usage API's answer to ``query`` (each parameter's values, in order)."""
    for name in UNSUPPORTED:
        if items(query, name):
            raise InvalidRequestError(f"{name} is not supported here: keys are per project", name)
    width_name = str(choice(query, "bucket_width", WIDTHS, "1d"))
    width = WIDTHS[width_name]
    start = unix_time(query, "start_time")
    if start is None:
        raise InvalidRequestError("start_time (Unix seconds) is required", "start_time")
    end = unix_time(query, "end_time")
    end = now + 1 if end is None else end  # through the current second: what it recorded too
    if end <= start:
        raise InvalidRequestError("end_time must be after start_time", "end_time")
    default, most = LIMITS[width_name]
    limit = int(whole(query, "limit", 1, most, default) or default)
    groups = items(query, "group_by")
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        raise InvalidRequestError(
            f"group_by {unknown} is not supported; group by {', '.join(GROUPS)}", "group_by"
        )
    batch = choice(query, "batch", ("true", "false"), None)
    first = start - start % width
    page = one(query, "page")
    if page is not None:
        digits = page.isascii() and page.isdigit()
        if not digits or int(page) % width or not first <= int(page) < end:
            raise InvalidRequestError("page is not a next_page of this query", "page")
        first = int(page)
    last = min(end, first + limit * width)  # this page's buckets end here
    rows = ledger.rows(
        max(start, first),
        last,
        projects=items(query, "project_ids") or None,
        models=items(query, "models") or None,
        batch=None if batch is None else batch == "true",
    )
    sums: dict[int, dict[tuple[Any, ...], Use]] = {}
    for row in rows:
        bucket = sums.setdefault(row["minute"] - row["minute"] % width, {})
        key = tuple(row[GROUPS[g]] for g in groups)
        use = Use(
            row["requests"],
            row["input_tokens"],
            row["cached_tokens"],
            row["output_tokens"],
            row["engine_s"],
        )
        bucket[key] = bucket[key] + use if key in bucket else use
    data = []
    for bucket_start in range(first, last, width):
        found = sums.get(bucket_start, {})
        results = [
            _result(dict(zip(groups, key, strict=True))) | _numbers(found[key])
            for key in sorted(found)
        ]
        data.append(
            {
                "object": "bucket",
                "start_time": bucket_start,
                "end_time": bucket_start + width,
                "results": results,
            }
        )
    more = first + limit * width < end
    return {
        "object": "page",
        "data": data,
        "has_more": more,
        "next_page": str(first + limit * width) if more else None,
    }


def _result(grouped: dict[str, Any]) -> dict[str, Any]:
    batch = grouped.get("batch")
    return {
        "object": "organization.usage.completions.result",
        "project_id": grouped.get("project_id"),
        "model": grouped.get("model"),
        "batch": None if batch is None else batch != "",
        "user_id": None,
        "api_key_id": None,
        "service_tier": None,
    }


def _numbers(use: Use) -> dict[str, Any]:
    """OpenAI's figures, and relayllm's one more: ``engine_s``, the engine seconds spent on
    the requests (:data:`relayllm.rows.outputs.ENGINE_S`), which OpenAI's API does not have."""
    return {
        "num_model_requests": use.requests,
        "input_tokens": use.input_tokens,
        "input_cached_tokens": use.cached_tokens,
        "output_tokens": use.output_tokens,
        "input_audio_tokens": 0,
        "output_audio_tokens": 0,
        "engine_s": round(use.engine_s, 6),
    }


async def answer(ledger: UsageLedger, request: Request, project: str) -> Response:
    """``GET /v1/organization/usage/completions``: the admin key's alone (403 for a project's
    key: a project sees no other's usage)."""
    from relayllm.http.errors import HttpError, json_response
    from relayllm_service.tenancy.keys import ADMIN

    if project != ADMIN:
        raise HttpError(403, "usage is read with the admin key (RELAYLLM_ADMIN_KEY)")
    from relayllm_service.gateway.params import query_of

    page = await asyncio.to_thread(completions_page, ledger, query_of(request), ledger.now())
    return json_response(page)


async def metered(
    response: Response, project: str, ledger: UsageLedger, model: str = "unknown"
) -> Response:
    """``response`` to an online request of ``project``, its usage recorded in ``ledger``: at
    once for a JSON body; for a streamed one, from the chunk with ``usage`` (sent when the
    request asked ``stream_options.include_usage``; otherwise the request alone is counted),
    before the stream's ``[DONE]`` goes out. Not after the stream: a client that has read
    ``[DONE]`` closes the connection, and the server cancels what the stream would still do.
    A stream the client leaves early is counted, as far as it went. An error answer records
    nothing; with the ledger not recording, an answer passes untouched (a stream is not read
    on its way)."""
    from starlette.responses import StreamingResponse

    async def record(served: str, use: Use) -> None:
        await asyncio.to_thread(ledger.record, project, served, use)

    if response.status_code != 200 or not ledger.recording:
        return response
    if not isinstance(response, StreamingResponse):
        try:
            body = json.loads(bytes(response.body))
        except ValueError:
            return response
        await record(str(body.get("model") or model), body_use(body))
        return response
    inner = response.body_iterator

    async def counted() -> AsyncIterator[Any]:
        use, served, recorded = Use(), model, False
        try:
            async for chunk in inner:
                text = chunk.decode("utf-8", "replace") if isinstance(chunk, bytes) else str(chunk)
                for line in text.splitlines():
                    if line.startswith("data: {") and '"usage"' in line:
                        try:
                            event = json.loads(line[len("data: ") :])
                        except ValueError:
                            continue
                        if event.get("usage"):
                            use, served = body_use(event), str(event.get("model") or model)
                    elif line.strip() == "data: [DONE]" and not recorded:
                        recorded = True
                        await record(served, use)
                yield chunk
        finally:
            if not recorded:  # the client left early, or the stream ended without [DONE]
                record_later(served, use)

    def record_later(served: str, use: Use) -> None:
        """Recorded from a thread not awaited: the stream is being cancelled here."""
        try:
            asyncio.get_running_loop().run_in_executor(None, ledger.record, project, served, use)
        except RuntimeError:  # closed outside the event loop
            ledger.record(project, served, use)

    response.body_iterator = counted()
    return response


__all__ = ["GROUPS", "LIMITS", "WIDTHS", "answer", "completions_page", "metered"]
