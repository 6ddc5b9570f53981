"""Storage hygiene and hostile input: the ``.part-`` files killed writers leave are swept (a
file id's own at once, the others once old; an upload still arriving is left alone), the
runner sweeps them on start with the work directories of batches that ended, and a line
over the per-line byte limit fails validation with OpenAI's error shape naming the line,
read a piece at a time, never held whole."""

from __future__ import annotations

import io
import json
import os
import time

import pytest
from openai.types.batch import Errors

from relayllm_service.ids import new_file_id
from relayllm_service.runner.validate import Limits, validate_input
from relayllm_service.store.files import CHUNK, PART, FileStorage

CHAT = "/v1/chat/completions"
HOUR = 3600.0


def request(custom_id: str, text: str = "hi") -> bytes:
    body = {"model": "echo", "messages": [{"role": "user", "content": text}]}
    line = {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body}
    return json.dumps(line).encode() + b"\n"


def part(storage: FileStorage, file_id: str, age_s: float = 0.0) -> str:
    """A temporary file as a writer killed mid-write leaves it, last written ``age_s`` ago."""
    name = f"{file_id}{PART}{os.urandom(4).hex()}"
    path = os.path.join(storage._base, name)
    with open(path, "wb") as cut:
        cut.write(b'{"custom_id": "a"')
    when = time.time() - age_s
    os.utime(path, (when, when))
    return name


def listed(storage: FileStorage) -> list[str]:
    return sorted(os.listdir(storage._base))


def test_a_file_ids_parts_are_removed_whatever_their_age_and_nothing_else(tmp_path):
    storage = FileStorage.from_uri(str(tmp_path / "files"))
    mine, other = new_file_id(), new_file_id()
    storage.put(mine, [b"whole\n"])  # the file itself is not a part: it stays
    young = part(storage, mine)
    theirs = part(storage, other)
    assert storage.remove_parts(mine) == [young]
    assert listed(storage) == sorted([mine, theirs])
    with pytest.raises(Exception, match="not a file id"):
        storage.remove_parts("*")  # a client's id never widens the sweep


def test_the_sweep_by_age_leaves_a_part_still_being_written(tmp_path):
    storage = FileStorage.from_uri(str(tmp_path / "files"))
    old = part(storage, new_file_id(), age_s=2 * HOUR)
    writing = storage.writer(new_file_id())
    writing.write(b"arriving")  # an upload whose body is still coming
    kept = storage.writer(new_file_id())
    kept.write(b"x")
    assert storage.remove_parts(older_than_s=HOUR) == [old]
    assert len([name for name in listed(storage) if PART in name]) == 2
    assert writing.commit() == len(b"arriving")  # the sweep did not break it
    kept.abort()
    assert [name for name in listed(storage) if PART in name] == []


def test_the_runner_sweeps_old_parts_and_ended_batches_work_files_on_start(service):
    """What a writer killed mid-upload left in the storage (once old), and the work directory
    of a batch that ended while its runner was being killed; an unfinished batch's work files
    (its next claim resumes from them) and a young part stay."""
    from relayllm_service.runner.loop import PART_MAX_AGE_S, BatchRunner

    settings, store, storage = service
    data = request("a")
    record = store.add_file("alpha", filename="in.jsonl", purpose="batch", bytes=len(data))
    storage.put(record.id, [data])
    ended = store.create_batch("alpha", input_file_id=record.id, endpoint=CHAT)
    running = store.create_batch("alpha", input_file_id=record.id, endpoint=CHAT)
    store.cancel_batch("alpha", ended.id)
    store.update(ended.id, store.claim(ended.id, "x"), status="cancelled")
    for batch_id in (ended.id, running.id):
        os.makedirs(os.path.join(settings.work_dir, batch_id))
        with open(os.path.join(settings.work_dir, batch_id, "out.1.jsonl"), "wb") as out:
            out.write(b"{}\n")
    old = part(storage, new_file_id(), age_s=PART_MAX_AGE_S + 60)
    young = part(storage, new_file_id())
    runner = object.__new__(BatchRunner)  # no loop thread: the sweep called by hand
    runner.settings, runner.store, runner.storage, runner.active = settings, store, storage, {}
    runner._sweep()
    assert sorted(os.listdir(settings.work_dir)) == [running.id]
    assert old not in listed(storage) and young in listed(storage)
    assert record.id in listed(storage)


def test_a_claim_removes_an_input_copy_a_killed_claim_left_cut_short(service):
    from relayllm_service.runner.job import BatchJob

    settings, store, storage = service
    data = request("a")
    record = store.add_file("alpha", filename="in.jsonl", purpose="batch", bytes=len(data))
    storage.put(record.id, [data])
    batch = store.create_batch("alpha", input_file_id=record.id, endpoint=CHAT)
    first = BatchJob(settings, store, storage, batch.id, store.claim(batch.id, "dead"))
    os.makedirs(first.dir)
    with open(f"{first.input}.part-{first.claim}", "wb") as cut:
        cut.write(data[:5])
    second = BatchJob(settings, store, storage, batch.id, store.claim(batch.id, "new"))
    second._carry_over()
    assert os.listdir(second.dir) == []


class Reads(io.BufferedReader):
    """A file that remembers the longest piece any read gave (what validation held)."""

    longest = 0

    def readline(self, size: int | None = -1) -> bytes:
        piece = super().readline(size)
        self.longest = max(self.longest, len(piece))
        return piece


def test_a_line_over_the_limit_fails_validation_naming_it_without_being_held(tmp_path):
    limit = 4 * CHUNK
    huge = request("big", "x" * (8 * limit))  # eight limits long
    path = tmp_path / "in.jsonl"
    path.write_bytes(request("a") + huge + request("b") + request("big2", "y" * limit))
    with Reads(io.FileIO(path)) as source:
        found = validate_input(source, CHAT, Limits(max_line_bytes=limit))
        assert source.longest <= limit + 1  # at most the limit and one byte at a time
    errors = found.errors()
    Errors.model_validate(errors)
    assert [(e["code"], e["line"], e["param"]) for e in errors["data"]] == [
        ("line_too_large", 2, None),
        ("line_too_large", 4, None),
    ]
    assert errors["data"][0]["message"] == (
        f"line 2: the line is larger than the limit of {limit:,} bytes"
    )
    assert found.lines == 4  # the lines after the long one were read and checked


def test_a_line_at_the_limit_passes_and_the_file_limit_still_counts_a_long_lines_bytes():
    line = request("a")
    exact = validate_input(io.BytesIO(line + request("b")), CHAT, Limits(max_line_bytes=len(line)))
    assert exact.ok and exact.lines == 2
    over = validate_input(
        io.BytesIO(line + request("b", "x" * 100)),
        CHAT,
        Limits(max_line_bytes=len(line), max_bytes=len(line) + 50),
    )
    assert [(p["code"], p["line"]) for p in over.problems] == [("file_too_large", 2)]
    # docs/batch-service.md: "a line longer than 64 MiB" fails the batch.
    assert Limits().max_line_bytes == 64 * 1024 * 1024 < Limits().max_bytes
