"""The one duplicate check of a batch file's custom_ids (``batch/custom_ids.py``), a digest
and a line number per line: repeats found with their first and repeated lines among many ids,
no false repeat among 200k distinct ones, and both of its users (the service's validation, the
driver's scan) still failing a file on a repeat with their codes and messages. And the ids a
resumed run skips, as a set of digests: exactly the ids written, no other."""

from __future__ import annotations

import io
import json
import random

import pytest

from relayllm.batch.custom_ids import IdLines, IdSet, digest, ids_on_lines
from relayllm.batch.scan import scan_batch_file
from relayllm.errors import ConfigError
from relayllm_service.runner.validate import Limits, validate_input

CHAT = "/v1/chat/completions"


def line(custom_id: str, url: str = CHAT) -> str:
    body = {"messages": [{"role": "user", "content": "hi"}]}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def reference(ids: list[str]) -> list[tuple[int, int]]:
    """(line, first line) of every repeat, by a plain dict: what the digests must find."""
    first: dict[str, int] = {}
    found = []
    for number, custom_id in enumerate(ids, start=1):
        seen = first.setdefault(custom_id, number)
        if seen != number:
            found.append((number, seen))
    return found


def repeats_of(ids: list[str]) -> list[tuple[int, int]]:
    seen = IdLines()
    for number, custom_id in enumerate(ids, start=1):
        seen.add(custom_id, number)
    lines, firsts = seen.repeats()
    return list(zip(lines.tolist(), firsts.tolist(), strict=True))


def test_repeats_are_found_with_their_first_line_among_many_ids():
    rng = random.Random(7)
    ids = [f"request-{i}" for i in range(30_000)]
    for _ in range(200):  # repeats anywhere later, some ids three times or more
        at = rng.randrange(1, len(ids) + 1)
        ids.insert(at, ids[rng.randrange(at)])
    expected = reference(ids)
    assert len(expected) == 200
    assert repeats_of(ids) == expected
    assert repeats_of(["a", "b", "a", "c", "a", "b"]) == [(3, 1), (5, 1), (6, 2)]


def test_the_line_numbers_are_the_ones_given_not_the_order_added():
    seen = IdLines()
    for number, custom_id in [(2, "x"), (5, "y"), (9, "x"), (40, "x"), (41, "y")]:
        seen.add(custom_id, number)  # blank and id-less lines have no entry
    lines, firsts = seen.repeats()
    assert (lines.tolist(), firsts.tolist()) == ([9, 40, 41], [2, 2, 5])


def test_no_false_repeat_among_200k_distinct_ids():
    ids = [f"request-{i}" for i in range(100_000)]
    ids += [f"{i:08x}-\u00e9\u4e2d-{i}" for i in range(100_000)]  # non-ASCII, other lengths
    assert len(set(ids)) == len(ids)
    seen = IdLines()
    for number, custom_id in enumerate(ids, start=1):
        seen.add(custom_id, number)
    lines, firsts = seen.repeats()
    assert len(seen) == 200_000 and len(lines) == 0 and len(firsts) == 0
    seen.add("request-99999", 200_001)  # and one real repeat among them is found
    lines, firsts = seen.repeats()
    assert (lines.tolist(), firsts.tolist()) == ([200_001], [100_000])


def test_ids_that_differ_only_in_surrogates_or_case_are_distinct():
    ids = ["\ud83d\ude00", "\U0001f600", "\ud800", "A", "a", "a "]  # JSON allows lone surrogates
    assert len({digest(i) for i in ids}) == len(ids)
    assert repeats_of(ids) == []
    assert repeats_of([*ids, "\ud800"]) == [(7, 3)]


def test_the_ids_of_the_lines_reported_are_read_again():
    text = [line("a").encode(), b"\n", line("b").encode(), b"{bad", line("c").encode()]
    assert ids_on_lines(iter(text), {1, 2, 4, 5}) == {1: "a", 5: "c"}
    assert ids_on_lines(iter(text), set()) == {}


def validate(text: str, stream=io.BytesIO, limits: Limits | None = None):
    found = validate_input(stream(text.encode()), CHAT, limits)
    data = (found.errors() or {"data": []})["data"]
    return [(e["code"], e["line"], e["param"]) for e in data], data


class _Unseekable(io.RawIOBase):
    """A stream that cannot go back (as an object store's might be)."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        return self._data.readinto(buffer)


def unseekable(data: bytes):
    return io.BufferedReader(_Unseekable(data))


def test_validation_fails_a_repeat_naming_the_id_and_both_lines():
    codes, data = validate("\n".join([line("x"), line("y"), "", line("x")]) + "\n")
    assert codes == [("duplicate_custom_id", 4, "custom_id")]
    assert data[0]["message"] == "line 4: custom_id 'x' repeats line 1; each must be unique"
    codes, data = validate("\n".join([line("x"), line("y"), "", line("x")]), unseekable)
    assert codes == [("duplicate_custom_id", 4, "custom_id")]
    assert data[0]["message"] == "line 4: its custom_id repeats line 1; each must be unique"


def test_validation_lists_the_files_first_problems_in_line_order():
    """Repeats found at the end of the pass are merged in line order, a line's repeat before
    its other problem, and the list is cut at max_errors as a line-by-line check cuts it."""
    lines = [
        line("a"),
        line("b"),
        line("a"),  # 3: repeat
        "{bad",  # 4
        line("b", url="/v1/embeddings"),  # 5: repeat, then another endpoint
        line("c"),
        line("a"),  # 7: repeat
        "{bad",  # 8
    ]
    codes, _ = validate("\n".join(lines))
    assert codes == [
        ("duplicate_custom_id", 3, "custom_id"),
        ("invalid_json", 4, None),
        ("duplicate_custom_id", 5, "custom_id"),
        ("mismatched_endpoint", 5, "url"),
        ("duplicate_custom_id", 7, "custom_id"),
        ("invalid_json", 8, None),
    ]
    codes, data = validate("\n".join(lines), limits=Limits(max_errors=4))
    assert codes == [
        ("duplicate_custom_id", 3, "custom_id"),
        ("invalid_json", 4, None),
        ("duplicate_custom_id", 5, "custom_id"),
        ("mismatched_endpoint", 5, "url"),
        ("too_many_errors", None, None),
    ]
    assert "(line 5)" in data[-1]["message"]
    codes, _ = validate("\n".join(lines), limits=Limits(max_errors=2))
    assert codes[:2] == [("duplicate_custom_id", 3, "custom_id"), ("invalid_json", 4, None)]
    assert codes[2][0] == "too_many_errors"


def test_validation_finds_a_repeat_far_apart_in_a_large_file():
    text = "\n".join(line(f"r{i}") for i in range(20_000)) + "\n" + line("r123") + "\n"
    codes, data = validate(text)
    assert codes == [("duplicate_custom_id", 20_001, "custom_id")]
    assert "'r123' repeats line 124" in data[0]["message"]


def test_the_scan_rejects_repeats_naming_the_first_ten_ids_and_counting_the_rest(tmp_path):
    path = tmp_path / "in.jsonl"
    ids = [f"c{i}" for i in range(30)]
    ids += [f"c{i}" for i in range(14, -1, -1)]  # 15 repeated ids, c14 repeated first
    ids += ["c14"]
    path.write_text("\n".join(line(i) for i in ids) + "\n")
    with pytest.raises(ConfigError) as caught:
        scan_batch_file(str(path))
    message = str(caught.value)
    assert "duplicate custom_id values, nothing was run: 'c14' on lines 15, 31, 46; " in message
    named = [f"'c{i}' on lines {i + 1}, {45 - i}" for i in range(13, 4, -1)]
    assert "; ".join(named) in message
    assert "'c4'" not in message and message.endswith("(and 5 more)")
    assert len(scan_batch_file(str(path), check_ids=False).chunks) == 1, (
        "check_ids=False (the runner, after validation) leaves the check out"
    )


def test_the_scan_and_validation_agree_on_which_lines_repeat(tmp_path):
    """The ids of bad lines count too (a wrong url), as both did with their tables."""
    lines = [line("a"), line("b", url="/v1/nope"), "{bad", line("b"), line("a")]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=r"'b' on lines 2, 4; 'a' on lines 1, 5$"):
        scan_batch_file(str(path))
    codes, _ = validate("\n".join(lines))
    assert [(c, n) for c, n, _ in codes if c == "duplicate_custom_id"] == [
        ("duplicate_custom_id", 4),
        ("duplicate_custom_id", 5),
    ]


def test_the_set_of_ids_written_holds_exactly_those_ids():
    written = [f"request-{i}" for i in range(0, 200_000, 2)]
    ids = IdSet(b"".join(digest(i) for i in written + written[:10]))  # repeats count once
    assert len(ids) == 100_000 and ids
    assert all(f"request-{i}" in ids for i in range(0, 200_000, 2))
    assert not any(f"request-{i}" in ids for i in range(1, 200_000, 2))
    assert None not in ids and 4 not in ids and "" not in ids
    empty = IdSet()
    assert len(empty) == 0 and not empty and "request-0" not in empty
    assert not empty.has_digest(digest("request-0"))


def test_a_digest_found_across_two_of_the_set_is_not_in_it():
    """The set is one bytes object searched in the digest's bucket: a match that straddles
    two digests of that bucket is not one of them."""
    first = b"\x01\x01" + b"\x07" * 12 + b"\x01\x01"
    second = b"\x01\x01" + b"\x09" * 14
    ids = IdSet(first + second)
    across = first[14:] + second[:14]  # in the same bucket (0x0101), starting at byte 14
    assert (first + second).find(across) == 14
    assert ids.has_digest(first) and ids.has_digest(second)
    assert not ids.has_digest(across)
    edges = IdSet(b"\x00" * 16 + b"\xff" * 16)  # the first and the last bucket
    assert edges.has_digest(b"\x00" * 16) and edges.has_digest(b"\xff" * 16)
    assert not edges.has_digest(b"\x00" * 15 + b"\x01")
