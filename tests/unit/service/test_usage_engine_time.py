"""Engine time per row and in the usage ledger (issue 47), without Ray: each call in a
replica's engine gets its share of the busy time (every moment divided among the calls in the
engine then), the shares add up to the replica's ``engine_busy_s``; a call's share is split
across its rows by their tokens; the ledger charges each line's ``engine_s`` and the Usage API
answers it beside OpenAI's figures; a ledger written before engine time is upgraded in place."""

from __future__ import annotations

import json
import sqlite3

import pytest

from relayllm.openai_body import completion_body, embeddings_body
from relayllm.serving import metrics as metrics_module
from relayllm.serving.metrics import ReplicaMetrics, split_by_tokens
from relayllm_service.gateway.usage_api import completions_page
from relayllm_service.tenancy.usage import UsageLedger, Use, line_use

T0 = 1_700_000_000 - 1_700_000_000 % 86400


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_calls_at_once_share_the_busy_time_and_the_shares_add_up_to_it(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(metrics_module.time, "monotonic", clock)
    m = ReplicaMetrics("d", "echo")
    first, second = m.engine_busy(), m.engine_busy()
    a = first.__enter__()  # 100-101 alone, 101-103 with b, then b alone to 104
    clock.now = 101
    b = second.__enter__()
    clock.now = 102
    assert m.share_now(a) == 1.5 and m.share_now(b) == 0.5  # up to now, still in
    clock.now = 103
    first.__exit__(None, None, None)
    clock.now = 104
    second.__exit__(None, None, None)
    assert (a.seconds, b.seconds) == (2.0, 2.0)
    clock.now = 110
    with m.engine_busy() as c:
        clock.now = 110.5
    assert c.seconds == 0.5 and m.share_now(c) == 0.5
    assert a.seconds + b.seconds + c.seconds == m.engine_busy_s == 4.5


def test_a_calls_time_is_split_across_its_rows_by_their_tokens():
    rows = [
        {"num_input_tokens": 6, "num_generated_tokens": 2},
        {"num_input_tokens": 2, "num_generated_tokens": 0},
        {"error": "no tokens"},
    ]
    assert split_by_tokens(1.0, rows) == [0.8, 0.2, 0.0]
    assert split_by_tokens(0.9, [{}, {}, {}]) == pytest.approx([0.3, 0.3, 0.3])
    assert split_by_tokens(1.0, []) == []


def test_bodies_carry_the_engine_time_beside_the_weight_version():
    row = {"generated_text": "x", "num_input_tokens": 3, "num_generated_tokens": 1}
    assert completion_body("chat", {**row, "engine_s": 0.25}, "m", "r")["engine_s"] == 0.25
    assert completion_body("chat", row, "m", "r")["engine_s"] is None  # never in an engine
    many = [{"embedding": [0.0], "engine_s": 0.5}, {"embedding": [1.0], "engine_s": 0.25}]
    assert embeddings_body(many, "m")["engine_s"] == 0.75


def line(engine_s, created=T0):
    usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    body = {"model": "echo", "created": created, "usage": usage, "engine_s": engine_s}
    return json.dumps({"custom_id": "r", "response": {"status_code": 200, "body": body}})


def test_the_ledger_charges_each_lines_engine_time_and_the_usage_api_answers_it(service):
    settings, store, _ = service
    assert line_use(line(0.125), T0)[2] == Use(1, 3, 0, 1, 0.125)
    assert line_use(line(None), T0)[2].engine_s == 0.0
    ledger = UsageLedger(settings.store_path)
    ledger.record("alpha", "echo", Use(1, 3, 0, 1, 0.5), at=T0)
    ledger.record("alpha", "echo", Use(1, 3, 0, 1, 0.25), at=T0 + 1)
    page = completions_page(ledger, {"start_time": [str(T0)], "bucket_width": ["1d"]}, T0 + 60)
    (result,) = page["data"][0]["results"]
    assert result["engine_s"] == 0.75 and result["num_model_requests"] == 2
    assert result["input_tokens"] == 6 and result["object"].startswith("organization.usage")
    ledger.close()


def test_a_ledger_written_before_engine_time_is_upgraded_in_place(tmp_path):
    path = str(tmp_path / "jobs.sqlite")
    db = sqlite3.connect(path)
    from relayllm_service.tenancy.usage import _MIGRATIONS, migrate

    with db:
        db.execute("CREATE TABLE batches (id TEXT, project TEXT, claim INTEGER)")
        migrate(db, "usage", 1, _MIGRATIONS)  # the tables as version 1 made them
        db.execute("INSERT INTO usage (project, batch_id, model, minute, requests) "
                   "VALUES ('alpha', '', 'echo', ?, 2)", (T0,))  # fmt: skip
    db.close()
    ledger = UsageLedger(path)
    (row,) = ledger.rows(T0, T0 + 60)
    assert (row["requests"], row["engine_s"]) == (2, 0.0)
    ledger.record("alpha", "echo", Use(1, 0, 0, 0, 1.5), at=T0)
    (row,) = ledger.rows(T0, T0 + 60)
    assert (row["requests"], row["engine_s"]) == (3, 1.5)
    ledger.close()
