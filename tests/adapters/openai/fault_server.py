"""A small OpenAI-compatible HTTP server that fails on command, for the fault tests.

It speaks enough of the API for the adapter (/v1/chat/completions, /v1/completions,
/v1/embeddings, /v1/models) and "answers" by echoing the prompt's words, so token counts grow
with the input like a real model's; it honours ``max_tokens`` (or ``max_completion_tokens``),
``stop`` and the repetition penalties (each word once), so the kit sees the adapter send them.
It runs on loopback and records when each request arrived: in a thread of the test process
(:class:`FaultServer`), or in a process of its own (:class:`FaultServerProcess`) for the tests
that measure request times, so the test process's own work (its GIL) cannot delay or bunch
the times it records.

Faults are asked for in the row's own text, so they follow the row through batching and
retries: ``fault=KIND[:ARG][*TIMES]`` makes the first TIMES attempts (default 1) at that exact
text fail with KIND:

- ``429:S`` -- 429 with ``Retry-After: S``        - ``500`` -- 500 with an error body
- ``slow:S`` -- answer after S seconds            - ``malformed`` -- 200 with broken JSON
- ``400`` -- 400 with an error message, on every attempt (a permanent error)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FAULT = re.compile(
    r"fault=(?P<kind>429|500|400|slow|malformed)(?::(?P<arg>[\d.]+))?(?:\*(?P<times>\d+))?"
)
EMBEDDING_SIZE = 8
#: The control paths of a server in its own process (never recorded as requests).
CONTROL = "/_fault_server/"
BAD_REQUEST_MESSAGE = "this row is rejected by the fault server on purpose"


@dataclass
class Record:
    """One request as the server saw it; recorded on arrival, completed when answered (a
    slow answer's record is there while the client has already given up on it)."""

    at: float  # time.monotonic() on arrival
    path: str
    text: str
    authorized: bool
    status: int | None = None
    done: float | None = None  # time.monotonic() when the answer was ready


class FaultServer:
    def __init__(
        self,
        *,
        model: str = "fault-model",
        api_key: str | None = None,
        echo_auth_in_errors: bool = False,
    ) -> None:
        self.model = model
        self.api_key = api_key
        # A careless endpoint that quotes the request's Authorization header in its 400
        # message: the adapter must still keep the key out of the row's error.
        self.echo_auth_in_errors = echo_auth_in_errors
        self.records: list[Record] = []
        self.dead = False  # kill()ed: every request is dropped
        self._attempts: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> FaultServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def kill(self) -> None:
        """Stop as a crashed server does: kept-alive connections stop answering too (a plain
        stop() leaves their handler threads serving)."""
        self.dead = True
        self.stop()

    def reset(self) -> None:
        with self._lock:
            self.records.clear()
            self._attempts.clear()

    def requests_for(self, marker: str, path: str | None = None) -> list[Record]:
        with self._lock:
            return [
                r for r in self.records if marker in r.text and (path is None or r.path == path)
            ]

    # -- answering ---------------------------------------------------------------------------

    def answer(
        self, path: str, body: dict[str, Any], auth: str | None
    ) -> tuple[int, dict[str, str], bytes]:
        text = _text_of(body)
        authorized = self.api_key is None or auth == f"Bearer {self.api_key}"
        record = Record(time.monotonic(), path, text, authorized)
        with self._lock:
            self.records.append(record)
            self._attempts[(path, text)] += 1
            attempt = self._attempts[(path, text)]
        status, headers, payload = self._decide(path, body, text, attempt, authorized, auth)
        record.status, record.done = status, time.monotonic()
        return status, headers, payload

    def _decide(self, path, body, text, attempt, authorized, auth):
        if not authorized:
            return _error(401, "invalid API key", "invalid_api_key")
        if path == "/v1/models":
            return _json(
                200,
                {
                    "object": "list",
                    "data": [
                        {
                            "id": self.model,
                            "object": "model",
                            "created": 0,
                            "owned_by": "relayllm-tests",
                        }
                    ],
                },
            )
        fault = FAULT.search(text)
        if fault:
            kind, arg = fault["kind"], fault["arg"]
            times = int(fault["times"] or 1)
            if kind == "400":
                message = BAD_REQUEST_MESSAGE
                if self.echo_auth_in_errors:
                    message += f" (you sent Authorization: {auth})"
                return _error(400, message, "invalid_request")
            if attempt <= times:
                if kind == "429":
                    status, headers, payload = _error(429, "slow down", "rate_limit_exceeded")
                    return status, {**headers, "Retry-After": arg or "1"}, payload
                if kind == "500":
                    return _error(500, "the fault server broke on purpose", "server_error")
                if kind == "malformed":
                    return (
                        200,
                        {"Content-Type": "application/json"},
                        b'{"id": "cmpl-1", "choices": [{',
                    )
                if kind == "slow":
                    time.sleep(float(arg or 1))
        return self._healthy(path, body, text)

    def _healthy(self, path, body, text):
        words = text.split()
        if path == "/v1/embeddings":
            vector = ([float(len(w)) for w in words] + [0.0] * EMBEDDING_SIZE)[:EMBEDDING_SIZE]
            return _json(
                200,
                {
                    "object": "list",
                    "model": body.get("model"),
                    "data": [{"object": "embedding", "index": 0, "embedding": vector}],
                    "usage": {"prompt_tokens": len(words), "total_tokens": len(words)},
                },
            )
        if path not in ("/v1/chat/completions", "/v1/completions"):
            return _error(404, f"no route {path}", "not_found")
        if body.get("model") != self.model:
            return _error(404, f"model {body.get('model')!r} does not exist", "model_not_found")
        out, finish = words, "stop"
        if body.get("presence_penalty") or body.get("frequency_penalty"):
            # A penalised model repeats itself less: each word once.
            out = list(dict.fromkeys(out))
        limit = body.get("max_tokens") or body.get("max_completion_tokens")
        if limit and len(out) > limit:
            out, finish = out[:limit], "length"
        text = " ".join(out)
        stop = body.get("stop")
        for marker in [stop] if isinstance(stop, str) else stop or []:
            if marker and marker in text:  # the answer ends before a stop sequence
                text, finish = text[: text.index(marker)], "stop"
        usage = {
            "prompt_tokens": len(words),
            "completion_tokens": len(text.split()),
            "total_tokens": len(words) + len(text.split()),
        }
        if path == "/v1/completions":
            choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
            return _json(
                200,
                {
                    "id": "cmpl-1",
                    "object": "text_completion",
                    "created": 0,
                    "model": self.model,
                    "choices": [choice],
                    "usage": usage,
                },
            )
        choice = {
            "index": 0,
            "finish_reason": finish,
            "message": {"role": "assistant", "content": text},
        }
        return _json(
            200,
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": self.model,
                "choices": [choice],
                "usage": usage,
            },
        )


def _text_of(body: dict[str, Any]) -> str:
    if "messages" in body:
        return " ".join(str(m.get("content", "")) for m in body["messages"])
    value = body.get("prompt", body.get("input", ""))
    return value if isinstance(value, str) else json.dumps(value)


def _json(status: int, payload: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    return status, {"Content-Type": "application/json"}, json.dumps(payload).encode()


def _error(status: int, message: str, code: str) -> tuple[int, dict[str, str], bytes]:
    return _json(status, {"error": {"message": message, "type": "fault_server", "code": code}})


def _handler_for(server: FaultServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, like a real endpoint

        def do_GET(self) -> None:
            if server.dead:  # killed: drop the kept-alive connection without an answer
                self.close_connection = True
                return
            if self.path == CONTROL + "records":
                with server._lock:
                    records = [dataclasses.asdict(r) for r in server.records]
                self._reply(*_json(200, {"records": records}))
                return
            self._reply(*server.answer(self.path, {}, self.headers.get("Authorization")))

        def do_POST(self) -> None:
            if server.dead:
                self.close_connection = True
                return
            if self.path == CONTROL + "reset":
                server.reset()
                self._reply(*_json(200, {}))
                return
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except json.JSONDecodeError:
                self._reply(*_error(400, "request body is not JSON", "bad_json"))
                return
            self._reply(*server.answer(self.path, body, self.headers.get("Authorization")))

        def _reply(self, status: int, headers: dict[str, str], payload: bytes) -> None:
            try:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test): nothing to answer

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: the records are the log

    return Handler


class FaultServerProcess:
    """A :class:`FaultServer` in a process of its own, with the same reading side: its
    ``base_url``, ``model``, ``records``, ``requests_for`` and ``reset``. Its times are
    ``time.monotonic()`` of that process: the same system-wide clock as this one's."""

    def __init__(self, *, model: str = "fault-model", api_key_env: str | None = None) -> None:
        self.model = model
        args = [sys.executable, __file__, "--model", model]
        if api_key_env:  # the key stays in the environment, never on a command line
            args += ["--api-key-env", api_key_env]
        self._process = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        line = self._process.stdout.readline().strip() if self._process.stdout else ""
        if not line.startswith("http://"):
            self._process.kill()
            raise RuntimeError(f"the fault server process did not start: {line!r}")
        self.base_url = line

    def _control(self, name: str, body: bytes | None = None) -> dict[str, Any]:
        root = self.base_url.removesuffix("/v1")
        with urllib.request.urlopen(root + CONTROL + name, data=body, timeout=60) as answer:
            return json.loads(answer.read())

    @property
    def records(self) -> list[Record]:
        return [Record(**r) for r in self._control("records")["records"]]

    def requests_for(self, marker: str, path: str | None = None) -> list[Record]:
        return [r for r in self.records if marker in r.text and (path is None or r.path == path)]

    def reset(self) -> None:
        self._control("reset", b"{}")

    def stop(self) -> None:
        self._process.terminate()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description="the fault server, in this process")
    parser.add_argument("--model", default="fault-model")
    parser.add_argument("--api-key-env", help="the variable holding the key it requires")
    args = parser.parse_args()
    key = os.environ[args.api_key_env] if args.api_key_env else None
    server = FaultServer(model=args.model, api_key=key).start()
    print(server.base_url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
