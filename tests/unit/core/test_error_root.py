"""One error root: every public exception the packages define is a RelayLLMError (read from
their source, so the adapters whose engines this environment lacks are held too), and every
refusal a server sends reaches OpenAI's envelope one way (relayllm.http.errors.refusal_of)."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import pytest

from relayllm.errors import RelayLLMError
from relayllm.http.errors import HttpError, Refusal, UnauthorizedError, refusal_of

REPO = Path(__file__).resolve().parents[3]
SOURCES = [*REPO.glob("packages/*/src/**/*.py"), *REPO.glob("examples/*/**/*.py")]
BUILTIN = {
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException)
}
WARNINGS = {n for n in BUILTIN if issubclass(getattr(builtins, n), Warning)}


def _classes() -> dict[str, tuple[str, list[str]]]:
    """Every class by name: where it is and the names of its bases."""
    found: dict[str, tuple[str, list[str]]] = {}
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = [
                    b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "")
                    for b in node.bases
                ]
                found[node.name] = (f"{path.relative_to(REPO)}:{node.lineno}", bases)
    return found


def _closure(classes: dict[str, tuple[str, list[str]]], roots: set[str]) -> set[str]:
    members = set(roots)
    while True:
        more = {n for n, (_, bases) in classes.items() if n not in members and members & set(bases)}
        if not more:
            return members
        members |= more


def test_every_public_exception_is_a_relayllm_error():
    classes = _classes()
    exceptions = _closure(classes, BUILTIN) - BUILTIN
    warnings = _closure(classes, WARNINGS | {"Warning"})
    rooted = _closure(classes, {"RelayLLMError"})
    assert {"HttpError", "QuotaError", "MalformedResponse", "DemoModelError"} <= exceptions
    outside = sorted(
        f"{classes[name][0]} {name}"
        for name in exceptions - rooted - warnings
        if not name.startswith("_")
    )
    assert not outside, "public exceptions outside RelayLLMError:\n" + "\n".join(outside)


def test_the_walk_sees_a_root_left_out():
    classes = {"Good": ("a", ["RelayLLMError"]), "Bad": ("b", ["ValueError"])}
    assert _closure(classes, BUILTIN) - BUILTIN - _closure(classes, {"RelayLLMError"}) == {"Bad"}


class _NotFound(Refusal, LookupError):
    status = 404
    code = "not_found"


@pytest.mark.parametrize(
    ("error", "status", "code", "param"),
    [
        (HttpError(429, "slow down", code="rate_limit_exceeded"), 429, "rate_limit_exceeded", None),
        (UnauthorizedError("the API key is not valid"), 401, "invalid_api_key", None),
        (_NotFound("no batch 'batch_x'"), 404, "not_found", None),
    ],
)
def test_a_refusal_is_an_http_error_one_way(error, status, code, param):
    answer = refusal_of(error)
    assert isinstance(answer, HttpError) and isinstance(error, RelayLLMError)
    assert (answer.status, answer.code, answer.param) == (status, code, param)
    assert answer.body()["error"]["message"] == str(error)


def test_an_error_nothing_expected_is_no_refusal():
    assert refusal_of(OSError("/srv/x: disk I/O error")) is None
    assert refusal_of(RelayLLMError("internal")) is None
