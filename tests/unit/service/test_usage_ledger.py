"""The usage ledger without Ray: a batch's output lines charged per model and minute, once
across a kill and a new claim (the work file carried over as the runner does), never by a
replaced claim; online requests recorded; the Usage API's buckets, groups, filters and pages;
the ledger turned off (``ServiceSettings.record_usage``) records nothing."""

from __future__ import annotations

import asyncio
import json
import os
import shutil

import pytest

from relayllm_service.errors import InvalidRequestError, ServiceError, StaleClaimError
from relayllm_service.gateway.usage_api import completions_page, metered
from relayllm_service.runner.job import BatchJob
from relayllm_service.settings import ServiceSettings
from relayllm_service.tenancy.usage import UsageLedger, Use, line_use, migrate, use_of

CHAT = "/v1/chat/completions"
T0 = 1_700_000_000 - 1_700_000_000 % 86400  # a UTC midnight


def output_line(i: int, model: str = "echo", created: int = T0, cached: int = 0) -> str:
    usage = {"prompt_tokens": 10 + i, "completion_tokens": i, "total_tokens": 10 + 2 * i}
    if cached:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    body = {"object": "chat.completion", "model": model, "created": created, "usage": usage}
    line = {"id": f"b{i}", "custom_id": f"r{i}", "response": {"status_code": 200, "body": body}}
    return json.dumps(line) + "\n"


def new_batch(service, project: str = "alpha"):
    settings, store, storage = service
    data = b'{"custom_id": "r0", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'
    record = store.add_file(project, filename="in.jsonl", purpose="batch", bytes=len(data))
    storage.put(record.id, [data])
    return store.create_batch(project, input_file_id=record.id, endpoint=CHAT)


@pytest.fixture
def ledger(service):
    settings, _, _ = service
    ledger = UsageLedger(settings.store_path, clock=lambda: T0 + 3600)
    yield ledger
    ledger.close()


def totals(ledger: UsageLedger, batch_id: str) -> Use:
    found = ledger.batch_totals(batch_id).values()
    return sum(found, Use(0)) if found else Use(0)


def file_sums(path) -> Use:
    """The usage in an output file, summed the way a client would from its lines."""
    total = Use(0)
    with open(path, encoding="utf-8") as lines:
        for text in lines:
            total = total + use_of(json.loads(text)["response"]["body"]["usage"])
    return total


def test_a_blocks_lines_are_charged_per_model_and_minute(service, ledger, tmp_path):
    _, store, _ = service
    batch = new_batch(service)
    claim = store.claim(batch.id, "r")
    work = tmp_path / "out.jsonl"
    work.write_text(
        output_line(1)
        + output_line(2, created=T0 + 59)
        + output_line(3, created=T0 + 60)
        + output_line(4, model="other", cached=5)
    )
    assert ledger.charge_lines(batch.id, claim, str(work)) == 4
    rows = {(r["model"], r["minute"]): r for r in ledger.rows(T0, T0 + 3600)}
    assert sorted(rows) == [("echo", T0), ("echo", T0 + 60), ("other", T0)]
    first = rows["echo", T0]
    assert (first["project"], first["batch_id"], first["requests"]) == ("alpha", batch.id, 2)
    assert (first["input_tokens"], first["output_tokens"]) == (11 + 12, 1 + 2)
    assert rows["other", T0]["cached_tokens"] == 5
    assert totals(ledger, batch.id) == file_sums(work)
    assert ledger.charge_lines(batch.id, claim, str(work)) == 0  # nothing new: nothing charged


def test_a_line_cut_short_waits_for_its_newline(service, ledger, tmp_path):
    _, store, _ = service
    batch = new_batch(service)
    claim = store.claim(batch.id, "r")
    work = tmp_path / "out.jsonl"
    whole, cut = output_line(1), output_line(2)
    work.write_text(whole + cut[:20])
    assert ledger.charge_lines(batch.id, claim, str(work)) == 1
    work.write_text(whole + cut)
    assert ledger.charge_lines(batch.id, claim, str(work)) == 1
    assert totals(ledger, batch.id) == file_sums(work)


def test_lines_are_charged_once_across_a_kill_and_the_next_claim(service, ledger):
    """Claim 1 charges a block, writes another and is killed before charging it; claim 2
    starts from a copy of its work file (BatchJob's carry-over), writes the rest and
    finishes: the ledger equals the published output file, and claim 1 can charge no more."""
    settings, store, storage = service
    batch = new_batch(service)
    first = BatchJob(settings, store, storage, batch.id, store.claim(batch.id, "a"), ledger=ledger)
    os.makedirs(first.dir)
    first._carry_over()
    with open(first.output, "a") as out:
        out.write(output_line(1) + output_line(2))
    first.charge()
    with open(first.output, "a") as out:
        out.write(output_line(3))  # written, then killed before its charge
    second = BatchJob(settings, store, storage, batch.id, store.claim(batch.id, "b"), ledger=ledger)
    second._carry_over()
    with open(second.output, "a") as out:
        out.write(output_line(4))
    with pytest.raises(StaleClaimError):
        first.charge()
    store.update(batch.id, second.claim, status="in_progress")
    second.finish(store.update(batch.id, second.claim, status="finalizing"), "completed")
    published = store.get_batch("alpha", batch.id)
    assert published.status == "completed"
    output = tmp_path_of(storage, published.output_file_id)
    assert totals(ledger, batch.id) == file_sums(output)
    assert totals(ledger, batch.id).requests == 4


def tmp_path_of(storage, file_id: str):
    """The published file's bytes, in a file of their own."""
    import tempfile

    with storage.open(file_id) as source, tempfile.NamedTemporaryFile(delete=False) as copy:
        shutil.copyfileobj(source, copy)
    return copy.name


def test_online_requests_are_recorded_apart_from_batches(service, ledger):
    ledger.record("alpha", "echo", Use(1, 7, 2, 3), at=T0 + 61)
    ledger.record("alpha", "echo", Use(1, 1, 0, 1), at=T0 + 119)
    (row,) = ledger.rows(T0, T0 + 3600, batch=False)
    assert (row["batch_id"], row["minute"], row["requests"], row["input_tokens"]) == (
        "",
        T0 + 60,
        2,
        8,
    )
    assert (row["cached_tokens"], row["output_tokens"]) == (2, 4)
    assert ledger.rows(T0, T0 + 3600, batch=True) == []


def test_the_ledger_survives_a_reopen_and_refuses_a_newer_schema(service, ledger):
    settings, _, _ = service
    ledger.record("alpha", "echo", Use(1, 1, 0, 1), at=T0)
    again = UsageLedger(settings.store_path)
    assert len(again.rows(T0, T0 + 60)) == 1
    with again.write() as db:
        db.execute("UPDATE schema_parts SET version = 99 WHERE part = 'usage'")
    again.close()
    with pytest.raises(ServiceError, match="newer relayllm"):
        UsageLedger(settings.store_path)
    with ledger.write() as db:
        migrate(db, "other", 1, {1: "CREATE TABLE other (x INTEGER)"})
        migrate(db, "other", 1, {1: "CREATE TABLE other (x INTEGER)"})  # once only


def test_usage_of_each_body_shape():
    assert use_of({"prompt_tokens": 3, "completion_tokens": 2}) == Use(1, 3, 0, 2)
    responses = {
        "input_tokens": 4,
        "output_tokens": 1,
        "input_tokens_details": {"cached_tokens": 2},
    }
    assert use_of(responses) == Use(1, 4, 2, 1)
    assert use_of({"prompt_tokens": 5, "total_tokens": 5}) == Use(1, 5, 0, 0)  # embeddings
    assert use_of(None) == Use(1, 0, 0, 0)
    assert line_use(json.dumps({"response": None, "error": {"code": "x"}}), T0) is None


def query(**params):
    return {k: v if isinstance(v, list) else [str(v)] for k, v in params.items()}


@pytest.fixture
def filled(ledger):
    ledger.record("alpha", "echo", Use(1, 10, 1, 5), at=T0 + 10)
    ledger.record("alpha", "big", Use(1, 20, 0, 6), at=T0 + 3700)
    ledger.record("beta", "echo", Use(1, 30, 0, 7), at=T0 + 7300)
    ledger.record("beta", "echo", Use(1, 1, 0, 1), at=T0 + 86400 + 5)
    return ledger


def test_without_an_end_the_current_second_is_in(ledger):
    """A request recorded in the first second of a minute, read in that same second: ends
    are excluded, and an end of "now" in whole seconds would leave it out."""
    ledger.record("alpha", "echo", Use(1, 4, 0, 2), at=T0 + 120)
    page = completions_page(ledger, query(start_time=T0, bucket_width="1m"), T0 + 120)
    assert [b["results"][0]["num_model_requests"] for b in page["data"] if b["results"]] == [1]


def test_usage_buckets_sum_within_each_and_list_empty_ones(filled):
    page = completions_page(
        filled, query(start_time=T0, end_time=T0 + 4 * 3600, bucket_width="1h"), 0
    )
    assert page["object"] == "page" and not page["has_more"] and page["next_page"] is None
    starts = [b["start_time"] for b in page["data"]]
    assert starts == [T0, T0 + 3600, T0 + 7200, T0 + 10800]
    numbers = [
        [(r["num_model_requests"], r["input_tokens"]) for r in b["results"]] for b in page["data"]
    ]
    assert numbers == [[(1, 10)], [(1, 20)], [(1, 30)], []]
    first = page["data"][0]["results"][0]
    assert first["object"] == "organization.usage.completions.result"
    assert (first["input_cached_tokens"], first["output_tokens"], first["project_id"]) == (
        1,
        5,
        None,
    )
    day = completions_page(filled, query(start_time=T0, end_time=T0 + 2 * 86400), 0)
    assert [[r["input_tokens"] for r in b["results"]] for b in day["data"]] == [[60], [1]]


def test_usage_groups_and_filters(filled):
    page = completions_page(
        filled,
        query(start_time=T0, end_time=T0 + 86400, **{"group_by[]": ["project_id", "model"]}),
        0,
    )
    got = [(r["project_id"], r["model"], r["input_tokens"]) for r in page["data"][0]["results"]]
    assert got == [("alpha", "big", 20), ("alpha", "echo", 10), ("beta", "echo", 30)]
    only = completions_page(
        filled, query(start_time=T0, end_time=T0 + 86400, models="echo", project_ids="beta"), 0
    )
    assert [r["input_tokens"] for r in only["data"][0]["results"]] == [30]
    online = completions_page(
        filled, query(start_time=T0, end_time=T0 + 86400, batch="true", group_by="batch"), 0
    )
    assert online["data"][0]["results"] == []


def test_usage_pages_follow_next_page_to_the_end(filled):
    base = query(start_time=T0, end_time=T0 + 4 * 3600, bucket_width="1h", limit=3)
    first = completions_page(filled, base, 0)
    assert first["has_more"] and len(first["data"]) == 3
    second = completions_page(filled, {**base, "page": [first["next_page"]]}, 0)
    assert not second["has_more"]
    assert [b["start_time"] for b in second["data"]] == [T0 + 3 * 3600]


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({}, "start_time"),
        ({"start_time": T0, "bucket_width": "1w"}, "bucket_width"),
        ({"start_time": T0, "end_time": T0}, "end_time"),
        ({"start_time": T0, "bucket_width": "1d", "limit": 32}, "limit"),
        ({"start_time": T0, "group_by": "user_id"}, "group_by"),
        ({"start_time": T0, "api_key_ids": "k"}, "api_key_ids"),
        ({"start_time": T0, "page": "nope"}, "page"),
        ({"start_time": "soon"}, "start_time"),
    ],
)
def test_usage_refuses_what_it_cannot_answer(filled, params, param):
    with pytest.raises(InvalidRequestError) as caught:
        completions_page(filled, query(**params), T0 + 86400)
    assert caught.value.param == param


def test_recording_is_on_unless_the_settings_turn_it_off():
    assert ServiceSettings().record_usage is True
    assert ServiceSettings(record_usage=False).record_usage is False


def test_a_ledger_not_recording_charges_no_line_and_records_no_request(service, tmp_path):
    settings, store, _ = service
    batch = new_batch(service)
    claim = store.claim(batch.id, "r")
    work = tmp_path / "out.jsonl"
    work.write_text(output_line(1) + output_line(2))
    on = UsageLedger(settings.store_path)
    on.record("alpha", "echo", Use(1, 7, 0, 3), at=T0)  # recorded before it was turned off
    off = UsageLedger(settings.store_path, recording=False)
    assert off.charge_lines(batch.id, claim, str(work)) == 0
    off.record("alpha", "echo", Use(1, 5, 0, 5), at=T0)
    assert totals(off, batch.id) == Use(0)
    (row,) = off.rows(T0, T0 + 60)  # what was recorded before is read as ever
    assert (row["requests"], row["input_tokens"]) == (1, 7)
    # Nothing was marked charged: recording on again charges the lines the file holds.
    assert on.charge_lines(batch.id, claim, str(work)) == 2
    on.close()
    off.close()


def test_online_answers_pass_untouched_and_unrecorded_when_not_recording(service):
    from starlette.responses import JSONResponse, StreamingResponse

    settings, _, _ = service
    off = UsageLedger(settings.store_path, recording=False)
    body = {"model": "echo", "usage": {"prompt_tokens": 4, "completion_tokens": 2}}
    answer = JSONResponse(body)
    assert asyncio.run(metered(answer, "alpha", off)) is answer
    assert json.loads(bytes(answer.body)) == body

    async def chunks():
        yield b'data: {"model": "echo", "usage": {"prompt_tokens": 4}}\n\n'

    stream = StreamingResponse(chunks())
    inner = stream.body_iterator
    assert asyncio.run(metered(stream, "alpha", off)).body_iterator is inner  # not read
    assert off.rows(0, T0 * 2) == []
    off.close()


def test_a_stream_is_recorded_before_its_done_goes_out_and_when_left_early(service):
    """The openai client closes the connection once it has read ``[DONE]``, and the server
    then cancels the stream: what it would record after ``[DONE]`` may never run."""
    from starlette.responses import StreamingResponse

    settings, _, _ = service
    ledger = UsageLedger(settings.store_path)
    usage = b'data: {"model": "echo", "usage": {"prompt_tokens": 4}, "engine_s": 0.5}\n\n'

    def online():
        return [(r["requests"], r["input_tokens"], r["engine_s"]) for r in ledger.rows(0, T0 * 2)]

    async def chunks():
        yield b'data: {"model": "echo", "choices": []}\n\n'
        yield usage
        yield b"data: [DONE]\n\n"

    async def read_until_done():
        body = (await metered(StreamingResponse(chunks()), "alpha", ledger)).body_iterator
        async for chunk in body:
            if chunk == b"data: [DONE]\n\n":
                seen = online()
                await body.aclose()  # the client goes; the rest of the stream never runs
                return seen
        raise AssertionError("no [DONE]")

    assert asyncio.run(read_until_done()) == [(1, 4, 0.5)]

    async def read_one_and_leave():
        body = (await metered(StreamingResponse(chunks()), "beta", ledger)).body_iterator
        await anext(body)
        await body.aclose()
        await asyncio.sleep(0)

    asyncio.run(read_one_and_leave())  # recorded from a thread: done once the loop has closed
    assert sorted(online()) == [(1, 0, 0.0), (1, 4, 0.5)]
    ledger.close()
