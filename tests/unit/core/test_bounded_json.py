"""The one JSON reader of every door: a document nested deeper than 128 levels is refused
before it is parsed (Python's json raises RecursionError on a deep one), a string that cannot
be encoded as UTF-8 is refused naming where it is, and an ordinary document reads as
``json.loads`` reads it."""

from __future__ import annotations

import json

import pytest

from relayllm import bounded_json
from relayllm.bounded_json import NotJsonError, TooDeepError, UnencodableTextError


def nested(levels: int, kind: str = "array") -> str:
    if kind == "array":
        return "[" * levels + "]" * levels
    return '{"a":' * levels + "1" + "}" * levels


@pytest.mark.parametrize(
    ("levels", "kind"), [(100_000, "array"), (50_000, "object"), (129, "array"), (129, "object")]
)
def test_a_document_nested_deeper_than_128_levels_is_refused(levels, kind):
    with pytest.raises(TooDeepError, match="deeper than 128 levels"):
        bounded_json.loads(nested(levels, kind))


@pytest.mark.parametrize("kind", ["array", "object"])
def test_a_document_128_levels_deep_is_read(kind):
    assert bounded_json.loads(nested(128, kind)) == json.loads(nested(128, kind))
    assert bounded_json.depth(nested(128, kind)) == 128


def test_brackets_in_strings_do_not_count_escaped_quotes_and_backslashes_included():
    text = json.dumps({"a": "[[[[" * 100 + '\\"]]' + "\\", "b": ['"{{{{' * 100]})
    assert bounded_json.depth(text) == 2
    assert bounded_json.loads(text) == json.loads(text)


def test_wide_but_shallow_documents_with_many_brackets_are_read():
    text = json.dumps({"input": [[i, i + 1] for i in range(5000)]})
    assert bounded_json.loads(text) == json.loads(text)


def test_a_lone_surrogate_is_refused_naming_its_place():
    with pytest.raises(UnencodableTextError) as refused:
        bounded_json.loads('{"messages": [{"role": "user", "content": "a\\udc80"}]}')
    assert refused.value.param == "messages[0].content"
    with pytest.raises(UnencodableTextError) as refused:
        bounded_json.loads('{"metadata": {"k": "\\ud800"}}')
    assert refused.value.param == "metadata.k"
    with pytest.raises(UnencodableTextError):
        bounded_json.loads('{"\\udfff": 1}')  # a key


def test_a_surrogate_pair_is_one_character_not_a_refusal():
    assert bounded_json.loads('{"e": "\\ud83d\\ude00"}') == {"e": "\U0001f600"}
    assert bounded_json.loads(b'{"e": "\\uD83D\\uDE00"}') == {"e": "\U0001f600"}


def test_a_high_surrogate_followed_by_another_high_one_is_refused():
    with pytest.raises(UnencodableTextError):
        bounded_json.loads('["\\ud83d\\ud83d\\ude00"]')


def test_bytes_that_are_not_utf8_are_refused_even_as_encoded_surrogates():
    with pytest.raises(NotJsonError, match="not UTF-8"):
        bounded_json.loads(b'{"k": "\xed\xb3\x80"}')  # what json.loads(bytes) would let in
    with pytest.raises(NotJsonError, match="not valid JSON"):
        bounded_json.loads(b"{nope")


def test_strings_unchecked_on_request_for_a_caller_that_walks_them_itself():
    value = bounded_json.loads('{"a": "\\udc80"}', check_strings=False)
    assert bounded_json.may_hold_unencodable('{"a": "\\udc80"}')
    assert bounded_json.unencodable_path(value) == "a"


def test_the_envelope_of_a_document_too_deep_to_parse_is_read_from_its_top_level():
    text = (
        '{"custom_id": "r\\"1", "body": {"custom_id": "inner", "m": '
        + nested(1000)
        + '}, "url": "/v1/chat/completions"}'
    )
    found = bounded_json.top_level_strings(text, ("custom_id", "url", "method"))
    assert found == {"custom_id": 'r"1', "url": "/v1/chat/completions"}
    assert bounded_json.top_level_strings(nested(1000), ("custom_id",)) is None


def test_an_escaped_backslash_before_a_u_is_no_escape_and_hides_no_lone_surrogate():
    # the text "\ud83d" (a backslash, then letters) and a lone low surrogate after it
    with pytest.raises(UnencodableTextError):
        bounded_json.loads('["\\\\ud83d\\ude00"]')
    assert bounded_json.loads('["\\\\ud800"]') == ["\\ud800"]  # letters, not an escape


def test_random_strings_of_surrogates_backslashes_and_quotes_are_judged_as_python_judges():
    """Refused exactly when a string holds a lone surrogate, whatever escapes surround it."""
    import random

    rng = random.Random(53)
    pieces = ["\ud83d", "\ude00", "\U0001f600", "\\", '"', "u", "d83d", "a", "[", "é"]
    for _ in range(3000):
        text = json.dumps(["".join(rng.choice(pieces) for _ in range(rng.randrange(1, 7)))])
        value = json.loads(text)  # an escaped high then low surrogate: one character
        if bounded_json.unencodable_path(value) is not None:
            with pytest.raises(UnencodableTextError):
                bounded_json.loads(text.encode())
        else:
            assert bounded_json.loads(text.encode()) == value
            assert bounded_json.loads(json.dumps(value, ensure_ascii=False).encode()) == value


class _Replica:
    """What the HTTP front needs of a replica, for bodies refused before any row is made."""

    backend_name = "still"
    deployment = {"name": "still"}

    def __init__(self):
        self.rows = []

    def engine_info(self):
        return {"model": "still"}

    async def serve_http_row(self, row):
        self.rows.append(row)
        raise AssertionError("a refused body reached the replica")


@pytest.mark.parametrize("route", ["chat/completions", "completions", "embeddings"])
@pytest.mark.parametrize(
    "raw",
    [b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 50_000 + b"1" + b"}" * 50_000],
    ids=["arrays", "objects"],
)
def test_the_deployments_http_front_reads_bodies_with_this_reader(route, raw):
    """The front's door (a deployment's own HTTP routes), not only the gateway's."""
    import asyncio

    pytest.importorskip("starlette")
    from starlette.requests import Request

    from relayllm.serving.http_config import HttpConfig
    from relayllm.serving.http_front import HttpFront

    replica = _Replica()
    front = HttpFront(replica, HttpConfig(), "still")
    scope = {
        "type": "http",
        "method": "POST",
        "path": f"/v1/{route}",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
    }
    sent = [raw]

    async def receive():
        return {"type": "http.request", "body": sent.pop() if sent else b"", "more_body": False}

    response = asyncio.run(front(Request(scope, receive)))
    error = json.loads(response.body)["error"]
    assert response.status_code == 400 and "nested deeper than 128" in error["message"]
    assert replica.rows == []
