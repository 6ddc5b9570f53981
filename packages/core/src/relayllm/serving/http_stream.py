"""The server-sent events of a streamed answer of the HTTP front (``stream: true``): one chunk
per part the engine sends, in OpenAI's chunk shapes (``chat.completion.chunk``, and
``text_completion`` for completions), then the usage chunk when asked and ``[DONE]``.

Each chunk is written as OpenAI's streams send it: every field the schema requires, null
where the schema allows null (``finish_reason`` until the last part, ``logprobs``), and no
field the answer has no value for; the ``openai`` package's types check it before it leaves.

The stream is bounded as a whole answer is (``http.request_timeout_s``): a part that does not
come before the deadline ends the stream with OpenAI's error event, and the engine's work on
the row is cancelled with it.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from relayllm import openai_body
from relayllm.errors import EngineFailedError, RelayLLMError
from relayllm.http.errors import HttpError
from relayllm.rows import ENGINE_S, WEIGHT_VERSION, Result, Task


class StreamTimeout(RelayLLMError):
    """The next part did not come before the request's deadline."""


async def next_part(parts: AsyncIterator[Result], deadline: float) -> Result | None:
    """The next part of ``parts`` (None at its end), waited for until ``deadline`` (the
    event loop's clock); past it :class:`StreamTimeout`, the part's await cancelled. In the
    caller's task (no task per part): the stream's own clean-up runs where it started."""
    try:
        async with asyncio.timeout_at(deadline):
            return await anext(parts, None)
    except TimeoutError:
        raise StreamTimeout from None


async def stream_events(
    task: Task,
    model: str,
    include_usage: bool,
    first: Result | None,
    parts: AsyncIterator[Result],
    deadline: float,
    timed_out: Callable[[], HttpError],
    failed: Callable[[], None],
) -> AsyncIterator[str]:
    """The events of one streamed answer: ``first`` (awaited already, before the status
    line) and the rest of ``parts``. ``timed_out`` is the error a late part ends the stream
    with; ``failed`` counts a stream that ended with an error event."""
    ident = f"{'chatcmpl' if task == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
    created = int(time.time())
    last: Result = {}

    def event(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> str:
        fields: dict[str, Any] = {
            "id": ident,
            "object": "chat.completion.chunk" if task == "chat" else "text_completion",
            "created": created,
            "model": model,
            "choices": choices,
        }
        if usage is not None:
            fields["usage"] = usage
        if last:  # every chunk after the first part: the weights that produced it,
            fields[WEIGHT_VERSION] = last.get(WEIGHT_VERSION)
            fields[ENGINE_S] = last.get(ENGINE_S)  # and the engine time up to it
        check_chunk(task, fields)
        return f"data: {json.dumps(fields)}\n\n"

    if task == "chat":
        yield event([_chat_choice({"role": "assistant", "content": ""}, None)])
    part = first
    try:
        while part is not None:
            if part.get("error"):
                raise HttpError(400, str(part["error"]))
            last = part
            text = part.get("generated_text") or ""
            reason = part.get("finish_reason")
            finish = openai_body.finish_reason(reason, task) if reason else None
            if text or finish is not None:
                if task == "chat":
                    yield event([_chat_choice({"content": text}, finish)])
                else:
                    yield event(
                        [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}]
                    )
            part = await next_part(parts, deadline)
    except (HttpError, EngineFailedError, StreamTimeout) as exc:
        # The status line is sent already: the error travels as an event, as OpenAI's does.
        if isinstance(exc, StreamTimeout):
            failure = timed_out()
        elif isinstance(exc, HttpError):
            failure = exc
        else:
            failure = HttpError(503, str(exc), "server_error")
        failed()
        yield f"data: {json.dumps(failure.body())}\n\n"
        return
    finally:
        await _close(parts)
    if include_usage:
        yield event([], openai_body.usage(last))
    yield "data: [DONE]\n\n"


def _chat_choice(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}


def check_chunk(task: Task, chunk: dict[str, Any]) -> None:
    """The ``openai`` package's type of the chunk reads it (a guard: a chunk it cannot read
    is a bug here, not the client's). A completions chunk before the last part has
    ``finish_reason`` null, as OpenAI's streams send it, which ``Completion`` (the type of a
    whole answer) does not allow: that one field is checked as the last part's would be."""
    from openai.types import Completion
    from openai.types.chat import ChatCompletionChunk

    if task == "chat":
        ChatCompletionChunk.model_validate(chunk)
        return
    choices = [{**c, "finish_reason": c["finish_reason"] or "stop"} for c in chunk["choices"]]
    Completion.model_validate({**chunk, "choices": choices})


async def _close(parts: AsyncIterator[Result]) -> None:
    close = getattr(parts, "aclose", None)
    if close is not None:
        try:
            await close()
        except Exception:  # the stream failed already; its error was sent
            pass


__all__ = ["StreamTimeout", "check_chunk", "next_part", "stream_events"]
