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

import json
import os
import re
import time
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
EXAMPLES = 12 * int(os.environ.get("RELAYLLM_FUZZ_SCALE", "1"))
#: How long one request may go unanswered before it counts as a hang.
TIMEOUT_S = 15.0
SKIPPED = {"POST /console/login"}
#: Failures still expected (operation, check, status), each with the reason it stays.
KNOWN: dict[tuple[str, str, int | None], str] = {}
WHO = {**PROJECT_KEYS, "admin": ADMIN_KEY}
ID = re.compile(r"\b(?:file-[A-Za-z0-9]+|batch_[A-Za-z0-9]+)\b")


@dataclass
class Findings:
    """The failures of the run, one per (operation, check, status), the smallest request of
    each kept; and the ids each project created."""

    found: dict[tuple[str, str, int | None], dict[str, Any]] = field(default_factory=dict)
    owned: dict[str, set[str]] = field(default_factory=lambda: {p: set() for p in PROJECT_KEYS})
    requests: int = 0

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


def _fuzz(url: str, findings: Findings, deadline: float) -> None:
    import requests
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
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.label in SKIPPED:
            continue
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            for who in WHO:
                send = _sender(operation, mode, who, base, session, checks, findings, deadline)
                send()


def _sender(operation, mode, who, base, session, checks, findings, deadline):
    """The hypothesis test that sends ``operation``'s requests in ``mode`` with ``who``'s key."""
    import requests
    from hypothesis import HealthCheck, Phase, given, settings
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
    @given(case=operation.as_strategy(generation_mode=mode))
    def send(case: Any) -> None:
        if time.monotonic() > deadline:
            return
        findings.requests += 1
        request = _curl(case, who)
        try:
            response = case.call(base_url=base, session=session, headers=auth, timeout=TIMEOUT_S)
        except requests.Timeout:
            findings.add(label, "no answer (timeout)", None, request, "")
            return
        except requests.ConnectionError as exc:
            findings.add(label, "connection failed", None, request, str(exc))
            return
        try:
            case.validate_response(response, checks=checks, headers=auth)
        except FailureGroup as group:
            for failure in group.exceptions:
                said = f"{failure.message} | body: {response.text[:300]}"
                findings.add(label, failure.title, response.status_code, request, said)
        except Failure as failure:
            said = f"{failure.message} | body: {response.text[:300]}"
            findings.add(label, failure.title, response.status_code, request, said)
        _isolation(findings, label, who, response)

    return send


def _isolation(findings: Findings, label: str, who: str, response: Any) -> None:
    """Record what a project created; an id another project created, in a 2xx answer to this
    one, is a leak."""
    if who not in findings.owned or not 200 <= response.status_code < 300:
        return
    if response.headers.get("content-type", "").startswith("application/json"):
        text = response.text
        if label in ("POST /v1/files", "POST /v1/batches"):
            findings.owned[who].add(json.loads(text)["id"])
        others = set().union(*(ids for p, ids in findings.owned.items() if p != who))
        leaked = sorted(set(ID.findall(text)) & others)
        if leaked:
            findings.add(label, "another project's object", response.status_code, who, str(leaked))


def test_every_route_answers_as_described_under_fuzzing(service):
    findings = Findings()
    began = time.monotonic()
    _fuzz(service, findings, deadline=began + 150 * int(os.environ.get("RELAYLLM_FUZZ_SCALE", "1")))
    spent = time.monotonic() - began
    print(f"\nfuzz: {findings.requests} requests in {spent:.0f} s, {len(findings.found)} failures")
    print(findings.report())
    alpha, beta = client(service, PROJECT_KEYS["alpha"]), client(service, PROJECT_KEYS["beta"])
    import openai

    # Each project's objects, asked for by the other: not found; in no listing of the other.
    for own, other in (("alpha", beta), ("beta", alpha)):
        for item in sorted(findings.owned[own]):
            read = other.files.retrieve if item.startswith("file-") else other.batches.retrieve
            with pytest.raises(openai.NotFoundError):
                read(item)
        listed = {f.id for f in other.files.list()} | {b.id for b in other.batches.list()}
        assert not listed & findings.owned[own]
    assert any(findings.owned.values()), "the fuzz created nothing: the uploads never succeeded"
    # The service is well after: every listing answers, a normal batch completes.
    admin = client(service, ADMIN_KEY)
    for api in (alpha, beta, admin):
        api.batches.list()
        api.files.list()
    done = wait(alpha, submit(alpha, chat_lines(3)).id)
    assert done.status == "completed" and done.request_counts.completed == 3, done
    unexpected = {k: v for k, v in findings.found.items() if k not in KNOWN}
    assert not unexpected, f"{len(unexpected)} failures:\n{findings.report()}"
