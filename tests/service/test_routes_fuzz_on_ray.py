"""A property-based fuzz of every route ``relayllm serve`` answers, against its OpenAPI
description (docs/reference/openapi.json, written by docs/gen_openapi.py): schemathesis
generates requests from the description (valid ones, and ones that break it) and sends them
to a real service on the echo backend (a subprocess, as a user runs it) with two projects'
keys and the admin key.

Every answer is checked: no 5xx, no request without an answer within :data:`TIMEOUT_S` (a
timeout is a failure), the status, content type, headers and body as described, and no
project shown another's objects (an id one project created never appears in an answer to the
other). After the fuzz, each project's ids are asked for by the other (404), every listing
answers, and a normal batch completes.

Bounded: :data:`EXAMPLES` requests per operation, mode and key (``RELAYLLM_FUZZ_SCALE``
multiplies them: docs/reliability.md has the longer run), no shrinking, a fixed seed, no
example database. Every failure is collected (one per operation, check and status, the
smallest request kept) and written to the log; the test fails on any outside :data:`KNOWN`.
``POST /console/login`` is left out: each refused key counts against the address's sign-ins,
and past their limit every request of the run would be refused (its tests are the console's).
"""

from __future__ import annotations

import copy
import json
import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
from batch_api import ADMIN_KEY, PROJECT_KEYS, chat_lines, client, serve_echo, submit, wait
from support import REPO, cli

pytestmark = pytest.mark.usefixtures("ray_session")

schemathesis = pytest.importorskip("schemathesis")

SPEC = REPO / "docs" / "reference" / "openapi.json"
DEPLOYMENTS = "deployments:\n  - name: echo\n    backend: echo\n"
#: Requests per operation, generation mode and key.
EXAMPLES = 40 * int(os.environ.get("RELAYLLM_FUZZ_SCALE", "1"))
#: The fuzz's time, shared out among the operations (a slow machine sends fewer examples).
BUDGET_S = 90.0 * int(os.environ.get("RELAYLLM_FUZZ_SCALE", "1"))
#: How long one request may go unanswered before it counts as a hang.
TIMEOUT_S = 15.0
SKIPPED = {"POST /console/login"}
#: Failures still expected (operation, check, status), each with the reason it stays.
KNOWN: dict[tuple[str, str, int | None], str] = {
    ("GET /v1/organization/usage/completions", "Undocumented Content-Type", 400): "a request "
    "head longer than uvicorn reads is refused by uvicorn itself, in plain text, before the app",
}
WHO = {**PROJECT_KEYS, "admin": ADMIN_KEY}
ID = re.compile(r"\b(?:file-[A-Za-z0-9]+|batch_[A-Za-z0-9]+)\b")


@dataclass
class Findings:
    """The failures of the run, one per (operation, check, status), the smallest request of
    each kept; and the ids each project created."""

    found: dict[tuple[str, str, int | None], dict[str, Any]] = field(default_factory=dict)
    owned: dict[str, set[str]] = field(default_factory=lambda: {p: set() for p in PROJECT_KEYS})
    requests: Counter[str] = field(default_factory=Counter)

    def add(self, operation: str, check: str, status: int | None, request: str, said: str):
        key = (operation, check, status)
        kept = self.found.get(key)
        if kept is None or len(request) < len(kept["request"]):
            self.found[key] = {"request": request, "said": said[:600]}

    def report(self) -> str:
        lines = []
        for (operation, check, status), seen in sorted(self.found.items(), key=str):
            lines.append(
                f"- {operation} -> {status}: {check}\n  {seen['request']}\n  {seen['said']}"
            )
        return "\n".join(lines)


def _curl(case: Any, who: str) -> str:
    text = case.as_curl_command(headers={"Authorization": f"Bearer ${who.upper()}_KEY"})
    return text if len(text) < 1500 else text[:1500] + "..."


@pytest.fixture(scope="module")
def service(ray_session, tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    url, address, _ = serve_echo(ray_session, root, DEPLOYMENTS, "--batch-size", 4)
    yield url
    cli("unserve", "--address", address, check=0)


def _fuzz(url: str, findings: Findings, budget_s: float) -> None:
    """Every operation in turn, each with its share of ``budget_s`` (past it, the rest of its
    examples are not sent)."""
    import requests
    from hypothesis.errors import Unsatisfiable
    from schemathesis.specs.openapi import checks as openapi_checks

    checks = [
        schemathesis.checks.not_a_server_error,
        openapi_checks.status_code_conformance,
        openapi_checks.content_type_conformance,
        openapi_checks.response_headers_conformance,
        openapi_checks.response_schema_conformance,
    ]
    schema = schemathesis.openapi.from_path(SPEC)
    base = url.removesuffix("/v1")
    session = requests.Session()
    operations = [r.ok() for r in schema.get_all_operations()]
    operations = [op for op in operations if op.label not in SKIPPED]
    for operation in operations:
        deadline = time.monotonic() + budget_s / len(operations)
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            for who in WHO:
                send = _sender(operation, mode, who, base, session, checks, findings, deadline)
                try:
                    send()
                except Unsatisfiable:  # nothing breaks an operation without parameters
                    assert mode is schemathesis.GenerationMode.NEGATIVE, operation.label


#: How a generated request is bent before it is sent: ``own`` puts ids the key's project
#: created in the path and in a batch's ``input_file_id`` (so creates and reads get past the
#: lookup); ``other`` puts another project's (which must not be found); ``surrogate`` puts a
#: lone surrogate (``"\\udc80"``, which JSON allows as an escape) in one string of the body,
#: ``deep`` one value nested 50,000 objects or 100,000 arrays deep.
TWISTS = (None, None, "own", "other", "surrogate", "deep")
DEEP = ('{"a":' * 50_000 + "1" + "}" * 50_000, "[" * 100_000 + "]" * 100_000)
MARK = "\u0000twisted"


def _sender(operation, mode, who, base, session, checks, findings, deadline):
    """The hypothesis test that sends ``operation``'s requests in ``mode`` with ``who``'s key."""
    import requests
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st
    from schemathesis.core.failures import Failure, FailureGroup

    label, auth = operation.label, {"Authorization": f"Bearer {WHO[who]}"}

    @settings(
        max_examples=EXAMPLES,
        phases=[Phase.explicit, Phase.generate],
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        case=operation.as_strategy(generation_mode=mode),
        twist=st.sampled_from(TWISTS),
        pick=st.integers(0, 1 << 16),
    )
    def send(case: Any, twist: str | None, pick: int) -> None:
        if time.monotonic() > deadline:
            return
        raw = _twisted(case, twist, pick, who, findings)
        if raw is False:
            return
        findings.requests[label] += 1
        request = _curl(case, who) + (f"  [{twist}: {raw[:200]}]" if raw else "")
        try:
            if raw:
                url = base + case.formatted_path
                headers = {**auth, "Content-Type": "application/json"}
                response = session.request(
                    case.method, url, data=raw.encode("utf-8"), headers=headers, timeout=TIMEOUT_S
                )
            else:
                response = case.call(
                    base_url=base, session=session, headers=auth, timeout=TIMEOUT_S
                )
        except requests.Timeout:
            findings.add(label, "no answer (timeout)", None, request, "")
            return
        except requests.ConnectionError as exc:
            findings.add(label, "connection failed", None, request, str(exc))
            return
        failures: list[Any] = []
        try:
            case.validate_response(response, checks=checks, headers=auth)
        except FailureGroup as group:
            failures = list(group.exceptions)
        except Failure as failure:
            failures = [failure]
        for failure in failures:
            said = f"{failure.message} | body: {response.content[:300]!r}"
            findings.add(label, failure.title, response.status_code, request, said)
        if twist == "other" and 200 <= response.status_code < 300:
            findings.add(label, "another project's object", response.status_code, request, "")
        _isolation(findings, label, who, response)

    return send


def _twisted(case: Any, twist: str | None, pick: int, who: str, findings: Findings):
    """Bend ``case`` as ``twist`` says (see :data:`TWISTS`): the raw JSON text to send in its
    place, None to send it as it is, or False when the twist does not apply to it."""
    if twist in ("own", "other"):
        if who == "admin" and twist == "other":
            return False
        pool = sorted(
            set().union(
                *(ids for p, ids in findings.owned.items() if (p == who) == (twist == "own"))
            )
        )
        ids = {kind: [i for i in pool if i.startswith(kind)] for kind in ("file-", "batch_")}
        names = {"file_id": "file-", "batch_id": "batch_"}
        used = False
        for name, kind in names.items():
            if case.path_parameters and name in case.path_parameters and ids[kind]:
                case.path_parameters[name] = ids[kind][pick % len(ids[kind])]
                used = True
        if isinstance(case.body, dict) and "input_file_id" in case.body and ids["file-"]:
            case.body["input_file_id"] = ids["file-"][pick % len(ids["file-"])]
            used = True
        return None if used else False
    if twist in ("surrogate", "deep"):
        if case.media_type != "application/json" or not isinstance(case.body, dict):
            return False
        if "input_file_id" in case.body and findings.owned.get(who):
            _twisted(case, "own", pick, who, findings)
        body = copy.deepcopy(case.body)
        if twist == "surrogate" and "input_file_id" in body:
            body["metadata"] = {"note": MARK}  # the batch's metadata, stored if it is accepted
        else:
            _plant(body, pick)
        swap = '"\\udc80"' if twist == "surrogate" else DEEP[pick % 2]
        return json.dumps(body).replace(json.dumps(MARK), swap)
    return None


def _plant(body: dict[str, Any], pick: int) -> None:
    """:data:`MARK` in place of one value of ``body`` (a string one when it has any)."""
    spots: list[tuple[Any, Any]] = []

    def walk(node: Any) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            if isinstance(value, (dict, list)):
                walk(value)
            spots.append((node, key))

    walk(body)
    if not spots:
        body["value"] = MARK
        return
    strings = [(n, k) for n, k in spots if isinstance(n[k], str)]
    node, key = (strings or spots)[pick % len(strings or spots)]
    node[key] = MARK


def _isolation(findings: Findings, label: str, who: str, response: Any) -> None:
    """Record what a project created; an id another project created, in a 2xx answer to this
    one, is a leak."""
    if who not in findings.owned or not 200 <= response.status_code < 300:
        return
    kind = {k.lower(): v for k, v in response.headers.items()}.get("content-type") or ""
    if (kind[0] if isinstance(kind, list) else kind).startswith("application/json"):
        text = response.content.decode("utf-8", "replace")
        if label in ("POST /v1/files", "POST /v1/batches"):
            findings.owned[who].add(json.loads(text)["id"])
        others = set().union(*(ids for p, ids in findings.owned.items() if p != who))
        leaked = sorted(set(ID.findall(text)) & others)
        if leaked:
            findings.add(label, "another project's object", response.status_code, who, str(leaked))


def _after(url: str, findings: Findings) -> None:
    """Each project's objects, asked for by the other, are not found and in none of its
    listings; the service is well after the fuzz: every listing answers, a batch completes."""
    import openai

    alpha, beta = client(url, PROJECT_KEYS["alpha"]), client(url, PROJECT_KEYS["beta"])
    for own, other in (("alpha", beta), ("beta", alpha)):
        for item in sorted(findings.owned[own]):
            read = other.files.retrieve if item.startswith("file-") else other.batches.retrieve
            with pytest.raises(openai.NotFoundError):
                read(item)
        listed = {f.id for f in other.files.list()} | {b.id for b in other.batches.list()}
        assert not listed & findings.owned[own]
    admin = client(url, ADMIN_KEY)
    for api in (alpha, beta, admin):
        api.batches.list()
        api.files.list()
    done = wait(alpha, submit(alpha, chat_lines(3)).id)
    assert done.status == "completed" and done.request_counts.completed == 3, done


@pytest.mark.timeout(600 + 2 * BUDGET_S)  # a longer run (RELAYLLM_FUZZ_SCALE) takes longer
def test_every_route_answers_as_described_under_fuzzing(service):
    findings = Findings()
    # Each project's own file and batch from the start, whatever the fuzz creates: the
    # isolation checks (during and after) always have another project's ids to send, however
    # few uploads a slow run generates.
    for project, key in PROJECT_KEYS.items():
        batch = submit(client(service, key), chat_lines(1, prefix=project))
        findings.owned[project] |= {batch.input_file_id, batch.id}
    began = time.monotonic()
    _fuzz(service, findings, BUDGET_S)
    spent, sent = time.monotonic() - began, sum(findings.requests.values())
    print(f"\nfuzz: {sent} requests in {spent:.0f} s, {len(findings.found)} failures")
    print(dict(findings.requests))
    print(findings.report())
    spec = json.loads(SPEC.read_text(encoding="utf-8"))
    labels = {f"{m.upper()} {p}" for p, item in spec["paths"].items() for m in item} - SKIPPED
    assert {label for label in labels if findings.requests[label] == 0} == set()
    _after(service, findings)
    unexpected = {k: v for k, v in findings.found.items() if k not in KNOWN}
    assert not unexpected, f"{len(unexpected)} failures:\n{findings.report()}"
