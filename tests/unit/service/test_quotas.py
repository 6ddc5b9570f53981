"""Quotas per project without Ray: each limit refuses the request over it with nothing
written and other projects unaffected, counts shared by every store on the state (racing
creates through two stores never pass a limit together), the token estimate's arithmetic and
the quotas file's errors."""

from __future__ import annotations

import io
import json
import threading

import pytest

from relayllm.errors import ConfigError
from relayllm_service.store.sqlite import SQLiteJobStore
from relayllm_service.tenancy.quotas import (
    Quota,
    QuotaError,
    Quotas,
    read_quotas,
)
from relayllm_service.tenancy.tokens import estimate_tokens

CHAT = "/v1/chat/completions"


def upload(store, project="alpha", size=10):
    return store.add_file(project, filename="in.jsonl", purpose="batch", bytes=size)


def create(store, project="alpha", file_id=None):
    file_id = file_id or upload(store, project).id
    return store.create_batch(project, input_file_id=file_id, endpoint=CHAT)


def files_of(store, project):
    return [f.id for f in store.list_files(project).data]


def test_files_and_stored_bytes_refuse_an_upload_over_them_and_write_nothing(service):
    _, store, _ = service
    Quotas.install(store, {"alpha": Quota(files=2, stored_bytes=100)})
    upload(store, size=60)
    with pytest.raises(QuotaError) as over:
        upload(store, size=41)
    assert (over.value.status, over.value.code) == (400, "storage_limit_exceeded")
    assert "100" in over.value.message
    upload(store, size=40)
    before = files_of(store, "alpha")
    with pytest.raises(QuotaError) as over:
        upload(store, size=0)
    assert over.value.code == "file_limit_exceeded"
    assert files_of(store, "alpha") == before  # nothing written
    for _ in range(3):
        upload(store, "beta", size=1000)  # no quota of its own: unaffected
    store.delete_file("alpha", before[0])
    upload(store, size=0)  # room again


def test_every_project_not_named_takes_the_star_quota(service):
    _, store, _ = service
    Quotas.install(store, {"*": Quota(files=1), "alpha": Quota(files=3)})
    upload(store, "beta")
    with pytest.raises(QuotaError):
        upload(store, "beta")
    for _ in range(3):
        upload(store, "alpha")


def test_batches_not_finished_are_limited_and_a_finished_one_frees_its_room(service):
    _, store, _ = service
    Quotas.install(store, {"alpha": Quota(batches=2)})
    first, _ = create(store), create(store)
    with pytest.raises(QuotaError) as over:
        create(store)
    assert (over.value.status, over.value.code) == (429, "batch_limit_exceeded")
    assert len(store.list_batches("alpha").data) == 2  # the refused one is nowhere
    create(store, "beta")
    store.cancel_batch("alpha", first.id)
    claim = store.claim(first.id, "runner")
    store.update(first.id, claim, status="cancelled")
    create(store)


def test_enqueued_tokens_per_deployment_refuse_a_batch_as_openai_does(service):
    settings, store, storage = service
    quotas = Quotas.install(store, {"*": Quota(enqueued_tokens={"echo": 100})})

    def batch_file(project, tokens, model="echo"):
        text = "x" * (tokens * 4)  # docs/batch-service.md: UTF-8 bytes divided by 4
        body = {"model": model, "messages": [{"role": "user", "content": text}]}
        line = {"custom_id": "r", "method": "POST", "url": CHAT, "body": body}
        data = (json.dumps(line) + "\n").encode()
        record = upload(store, project, len(data))
        storage.put(record.id, [data])
        quotas.estimate(store, storage, project, record.id)
        return record.id

    create(store, file_id=batch_file("alpha", 60))
    big = batch_file("alpha", 41)
    with pytest.raises(QuotaError) as over:
        create(store, file_id=big)
    assert (over.value.status, over.value.code) == (429, "token_limit_exceeded")
    assert over.value.headers == {"x-should-retry": "false"}  # the openai client's retries
    assert over.value.message == (
        "Enqueued token limit reached for echo in project alpha. Limit: 100 enqueued tokens. "
        "Please try again once some in_progress batches have been completed."
    )
    assert len(store.list_batches("alpha").data) == 1
    create(store, file_id=batch_file("alpha", 40))  # up to the limit exactly
    create(store, file_id=batch_file("alpha", 500, model="other"))  # another deployment
    create(store, "beta", file_id=batch_file("beta", 100))  # another project's queue


def test_racing_creates_through_two_stores_never_pass_the_limit_together(service):
    settings, store, _ = service
    other = SQLiteJobStore(settings.store_path)
    limits = {"alpha": Quota(batches=3)}
    Quotas.install(store, limits)
    Quotas.install(other, limits)
    inputs = [upload(store).id for _ in range(8)]
    made, refused = [], []

    def attempt(i):
        try:
            made.append(create([store, other][i % 2], file_id=inputs[i]))
        except QuotaError:
            refused.append(i)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    other.close()
    assert (len(made), len(refused)) == (3, 5)
    assert len(store.list_batches("alpha").data) == 3


def test_the_token_estimate_counts_every_prompt_text_per_model():
    lines = [
        {"body": {"model": "a", "messages": [{"role": "user", "content": "abcd" * 3}]}},
        {"body": {"model": "a", "messages": [{"content": [{"type": "text", "text": "abcde"}]}]}},
        {"body": {"model": "b", "prompt": "ab"}},
        {"body": {"model": "b", "input": ["abcd", "abcd"]}},
    ]
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines) + b"not json\n"
    assert estimate_tokens(io.BytesIO(data)) == {"a": 3 + 2, "b": 1 + 2}


def test_the_quotas_file_is_read_and_its_errors_name_it(tmp_path):
    good = tmp_path / "quotas.yaml"
    good.write_text("team-a:\n  batches: 2\n  enqueued_tokens: {echo: 1000}\n'*': {files: 5}\n")
    assert read_quotas(str(good)) == {
        "team-a": Quota(batches=2, enqueued_tokens={"echo": 1000}),
        "*": Quota(files=5),
    }
    assert read_quotas(None) == {}
    bad = tmp_path / "bad.yaml"
    bad.write_text("team-a: {batchez: 2}\n")
    with pytest.raises(ConfigError, match="bad.yaml.*batchez"):
        read_quotas(str(bad))
    bad.write_text("- team-a\n")
    with pytest.raises(ConfigError, match="map project names"):
        read_quotas(str(bad))


def test_online_requests_per_minute_answer_429_with_retry_after_until_the_next_minute(service):
    settings, store, _ = service
    limits = {"alpha": Quota(requests_per_minute=2)}
    other = SQLiteJobStore(settings.store_path)  # two gateways, one count
    one, two = Quotas.install(store, limits), Quotas.install(other, limits)
    minute = 1_700_000_040
    one.admit_request(store.file, "alpha", minute + 1)
    two.admit_request(other.file, "alpha", minute + 2)
    with pytest.raises(QuotaError) as over:
        one.admit_request(store.file, "alpha", minute + 45)
    assert (over.value.status, over.value.kind, over.value.code) == (
        429,
        "requests",
        "rate_limit_exceeded",
    )
    assert over.value.headers == {"Retry-After": "15"}
    assert "Limit 2, Used 2" in over.value.message
    with pytest.raises(QuotaError):  # the other gateway refuses it too
        two.admit_request(other.file, "alpha", minute + 59)
    for _ in range(5):
        one.admit_request(store.file, "beta", minute + 50)  # no quota of its own
    one.admit_request(store.file, "alpha", minute + 60)  # the next minute
    other.close()


def test_the_token_estimate_skips_lines_too_deep_or_not_utf8_instead_of_failing():
    """Python's json raised RecursionError on the deep line, and a lone surrogate failed the
    UTF-8 count: either was a 500 at the batch's create."""
    from relayllm_service.tenancy.tokens import estimate_tokens

    good = {"custom_id": "g", "body": {"model": "echo", "prompt": "x" * (8 * 4)}}
    deep = b'{"custom_id": "d", "body": {"model": "echo", "prompt": ' + b"[" * 50_000
    deep += b"]" * 50_000 + b"}}"
    lone = b'{"custom_id": "s", "body": {"model": "echo", "prompt": "\\udc80"}}'
    data = (json.dumps(good) + "\n").encode() + deep + b"\n" + lone + b"\n"
    assert estimate_tokens(io.BytesIO(data)) == {"echo": 8}
