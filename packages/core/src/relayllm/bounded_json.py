"""One JSON reader for every door that parses a client's JSON: the HTTP bodies of both servers
(:func:`relayllm.http.app.json_body`) and the lines of a batch file
(:func:`relayllm.batch.format.parse_envelope`).

Python's ``json`` recurses once per level of nesting and raises ``RecursionError`` on a deep
enough document; a document a few hundred levels deep parses but then breaks the code that
walks it. So a document deeper than :data:`MAX_DEPTH` is refused before it is parsed. The
check runs on every request: a document with fewer brackets than the limit cannot be too
deep (two ``count`` calls); only one with more has its strings removed and its brackets
summed, all in C loops.

JSON's ``\\uXXXX`` escapes can spell half of a surrogate pair alone, which Python decodes to
a string that cannot be encoded as UTF-8: stored, it breaks every answer that renders it. A
document with such a string is refused, naming where it is (only a document with a surrogate
escape is walked for it).
"""

from __future__ import annotations

import json
import re
from array import array
from itertools import accumulate
from typing import Any

from relayllm.errors import RelayLLMError

#: The deepest nesting of arrays and objects a document may have (a JSON schema in a request
#: nests a few levels per level of the schema it describes).
MAX_DEPTH = 128

#: A ``\\u`` escape of a surrogate, and of a pair of them (high, then low).
_SURROGATE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_PAIR = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}")
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}:,]', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")


class JsonTextError(RelayLLMError, ValueError):
    """A document this reader refuses; ``param``: where in it (None: the document)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param = message, param


class TooDeepError(JsonTextError):
    """Nested deeper than the limit."""


class NotJsonError(JsonTextError):
    """Not JSON, or not UTF-8; ``reason``: why, without the words "not valid JSON"."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class UnencodableTextError(JsonTextError):
    """A string that cannot be encoded as UTF-8 (a lone surrogate); ``param`` names it."""


def depth(text: str | bytes) -> int:
    """How deep ``text``'s arrays and objects nest, its strings left out: exact for JSON, an
    estimate for other text."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    # Escaped backslashes, then escaped quotes (only a string has either), then every other
    # piece between quotes is outside the strings.
    data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside = b"".join(data.split(b'"')[0::2])
    steps = array("b", outside.translate(None, _NOT_BRACKETS).translate(_STEPS))
    return max(accumulate(steps, initial=0))


def too_deep(text: str, max_depth: int = MAX_DEPTH) -> bool:
    """Whether ``text`` nests deeper than ``max_depth``; cheap for text with fewer brackets."""
    if text.count("[") + text.count("{") <= max_depth:
        return False
    return depth(text) > max_depth


def unencodable_path(value: Any, path: str = "") -> str | None:
    """Where the first string (key or value) that cannot be encoded as UTF-8 is in ``value``
    (``messages[0].content``; ``""``: ``value`` itself), or None. Iterative: any depth."""
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            if not encodes(item):
                return where
        elif isinstance(item, dict):
            for key, child in reversed(list(item.items())):
                name = f"{where}.{key}" if where else str(key)
                if isinstance(key, str) and not encodes(key):
                    return where or "(a key)"
                stack.append((name, child))
        elif isinstance(item, list | tuple):
            stack.extend((f"{where}[{i}]", child) for i, child in reversed(list(enumerate(item))))
    return None


def encodes(text: str) -> bool:
    """Whether ``text`` can be encoded as UTF-8 (no lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def may_hold_unencodable(text: str) -> bool:
    """Whether a value parsed from ``text`` may hold a string that cannot be encoded as UTF-8
    (cheap: only then is it worth a walk)."""
    return not encodes(text) or _lone_surrogate_escape(text)


def top_level_strings(text: str, keys: tuple[str, ...]) -> dict[str, str] | None:
    """The string values of ``keys`` in the object ``text`` holds, read without parsing it
    (for a document too deep to parse: who it is, to report it); None if ``text`` is no
    object. A token at a time: only for the lines that need it."""
    found: dict[str, str] = {}
    level, state, key = 0, "key", None
    for match in _TOKEN.finditer(text):
        token = match.group()
        if level == 0 and token != "{":
            return None
        if token in "[{":
            level += 1
            if level > 1 and state == "value":
                state = "after"  # an array or object value: not a string
        elif token in "]}":
            level -= 1
            if level == 0:
                break
        elif level != 1:
            continue
        elif token == ",":
            state, key = "key", None
        elif token == ":":
            state = "value" if state == "colon" else "after"
        elif state == "key":
            key, state = _string(token), "colon"
        elif state == "value":
            if key in keys and key not in found:
                found[key] = _string(token)
                if len(found) == len(keys):
                    break
            state = "after"
    return found


def _string(token: str) -> str:
    try:
        value = json.loads(token)
    except ValueError:
        return ""
    return value if isinstance(value, str) else ""


def _lone_surrogate_escape(text: str) -> bool:
    """Whether the JSON ``text`` holds a ``\\u`` escape of half a surrogate pair: its escaped
    backslashes replaced first (``\\\\ud800`` is no escape; a placeholder, not nothing, so
    two halves around one are not taken for a pair), then its pairs removed."""
    if "\\ud" not in text and "\\uD" not in text:
        return False
    escapes = text.replace("\\\\", "__")
    return _SURROGATE.search(_PAIR.sub("", escapes)) is not None


def check_text(value: Any, param: str) -> None:
    """Refuse (:class:`UnencodableTextError`) a value with text that cannot be encoded as
    UTF-8 (a query parameter, a form field, a filename), naming ``param``."""
    where = unencodable_path(value, param)
    if where is not None:
        raise UnencodableTextError(
            f"{where or 'the document'} holds text that cannot be encoded as UTF-8 (a lone "
            "surrogate)",
            where or None,
        )


def loads(data: str | bytes, *, max_depth: int = MAX_DEPTH, check_strings: bool = True) -> Any:
    """``json.loads`` of a UTF-8 document no deeper than ``max_depth`` whose strings all
    encode as UTF-8 (``check_strings=False``: left to the caller, with
    :func:`may_hold_unencodable` and :func:`unencodable_path`); :class:`JsonTextError` (a
    ``ValueError``) otherwise."""
    if isinstance(data, bytes | bytearray | memoryview):
        try:  # strict: text decoded from UTF-8 holds no lone surrogate of its own
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            reason = f"not UTF-8 text ({exc.reason} at byte {exc.start})"
            raise NotJsonError(reason, reason) from None
        raw_surrogates = False
    else:
        text = data
        raw_surrogates = not encodes(text)
    if too_deep(text, max_depth):
        raise TooDeepError(f"nested deeper than {max_depth} levels of arrays and objects")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        reason = f"{exc.msg} (column {exc.colno})"
        raise NotJsonError(f"not valid JSON: {reason}", reason) from None
    except RecursionError:  # text the depth estimate misread: json's own limit
        raise TooDeepError(f"nested deeper than {max_depth} levels of arrays and objects") from None
    if check_strings and (raw_surrogates or _lone_surrogate_escape(text)):
        check_text(value, "")
    return value


__all__ = [
    "encodes",
    "MAX_DEPTH",
    "JsonTextError",
    "NotJsonError",
    "TooDeepError",
    "UnencodableTextError",
    "check_text",
    "depth",
    "loads",
    "may_hold_unencodable",
    "too_deep",
    "top_level_strings",
    "unencodable_path",
]
