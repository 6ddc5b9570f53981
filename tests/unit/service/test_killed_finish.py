"""The runner's finish killed from outside at the two moments where a publish could go wrong,
with no hook in the product: mid-``put`` (a ``.part-`` file half written) and between storing
the bytes and recording them (the test holds the job store's write lock, so the finish waits
at its last write, and is SIGKILLed there). The finish runs in a real subprocess on a real
SQLite store; its work file is a FIFO the test feeds, which stands for a slow disk: the put
stops where the test stops writing. The next claim publishes every line once and leaves no
bytes, no ``.part-`` file behind. And the built wheel ships no test hook at all."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest
from support import REPO

from relayllm_service.runner.job import BatchJob
from relayllm_service.store.files import CHUNK, PART, FileStorage

CHAT = "/v1/chat/completions"
#: Work-file lines: more than two of the put's pieces, so it can stop between them.
LINES = 40_000

KILLED_FINISH = """
import sys
from relayllm_service.store.files import FileStorage
from relayllm_service.runner.job import BatchJob
from relayllm_service.settings import ServiceSettings
from relayllm_service.store.sqlite import SQLiteJobStore

state, batch_id, claim = sys.argv[1], sys.argv[2], int(sys.argv[3])
settings = ServiceSettings(state_dir=state)
store = SQLiteJobStore(settings.store_path)
job = BatchJob(settings, store, FileStorage.from_uri(settings.files_location), batch_id, claim,
               deployments=lambda: ["echo"])
job.finish(job.update(), "completed")
print("not killed")
"""


def output_line(i: int) -> str:
    return json.dumps({"id": f"x{i}", "custom_id": f"r{i}", "response": {}, "error": None})


def new_batch(service, n: int):
    settings, store, storage = service
    body = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
    data = b"".join(
        json.dumps({"custom_id": f"r{i}", "method": "POST", "url": CHAT, "body": body}).encode()
        + b"\n"
        for i in range(n)
    )
    record = store.add_file("alpha", filename="in.jsonl", purpose="batch", bytes=len(data))
    storage.put(record.id, [data])
    return store.create_batch("alpha", input_file_id=record.id, endpoint=CHAT)


def job(service, batch_id: str, claim: int) -> BatchJob:
    settings, store, storage = service
    return BatchJob(settings, store, storage, batch_id, claim, deployments=lambda: ["echo"])


def wait_for(condition, what: str, process: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, (what, process.communicate())
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def holds(pid: int, path: str) -> bool:
    """Whether process ``pid`` has ``path`` open."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == path:
                return True
        except OSError:
            continue
    return False


def stored(storage: FileStorage) -> list[str]:
    return sorted(os.listdir(storage._base))


@pytest.mark.parametrize("moment", ["mid-put", "stored-not-recorded"])
def test_a_finish_killed_from_outside_is_published_once_by_the_next_claim(service, moment):
    settings, store, storage = service
    batch = new_batch(service, LINES)
    first = job(service, batch.id, store.claim(batch.id, "dead"))
    first.update(status="in_progress")
    first.update(status="finalizing")
    os.makedirs(first.dir)
    os.mkfifo(first.output)
    content = "".join(output_line(i) + "\n" for i in range(LINES)).encode()
    assert len(content) > 2 * CHUNK
    rest = threading.Event()

    def feed() -> None:  # the finish reads the work file twice: to count it, then to put it
        try:
            with open(first.output, "wb") as fifo:
                fifo.write(content)
            while holds(process.pid, first.output):  # counted to its end, and closed
                time.sleep(0.005)
            with open(first.output, "wb") as fifo:
                fifo.write(content[: CHUNK + 100])  # one piece stored, the next one waits
                rest.wait()
                fifo.write(content[CHUNK + 100 :])
        except BrokenPipeError:
            pass  # the reader was killed first

    process = subprocess.Popen(
        [sys.executable, "-c", KILLED_FINISH, settings.state_dir, batch.id, str(first.claim)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    lock = sqlite3.connect(settings.store_path, isolation_level=None)
    try:
        wait_for(lambda: any(PART in name for name in stored(storage)), "the put", process)
        (pending,) = store.get_batch("alpha", batch.id).pending_files  # reserved first
        if moment == "stored-not-recorded":
            lock.execute("BEGIN IMMEDIATE")  # the finish's last write will wait for it
            rest.set()
            wait_for(lambda: storage.exists(pending), "the bytes stored", process)
            assert not any(PART in name for name in stored(storage))
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=30)
    finally:
        if lock.in_transaction:
            lock.execute("ROLLBACK")
        lock.close()
        if process.poll() is None:
            process.kill()
        rest.set()
        feeder.join(timeout=30)
    assert process.returncode == -signal.SIGKILL
    left = store.get_batch("alpha", batch.id)
    assert left.status == "finalizing" and left.pending_files == (pending,)
    if moment == "mid-put":
        assert not storage.exists(pending)
        assert [name.split(PART)[0] for name in stored(storage) if PART in name] == [pending]
    else:
        assert storage.exists(pending)  # stored, never published
    assert [f.purpose for f in store.list_files("alpha").data] == ["batch"]

    os.unlink(first.output)  # the disk is fast again: the same lines as a plain file
    Path(first.output).write_bytes(content)
    second = job(service, batch.id, store.claim(batch.id, "new"))
    second._carry_over()
    second.finish(second.update(), "completed")
    done = store.get_batch("alpha", batch.id)
    assert done.status == "completed" and done.pending_files == ()
    outputs = [f for f in store.list_files("alpha").data if f.purpose == "batch_output"]
    assert [f.id for f in outputs] == [done.output_file_id]
    with storage.open(done.output_file_id) as published:
        ids = [json.loads(text)["custom_id"] for text in published]
    assert ids == [f"r{i}" for i in range(LINES)]
    assert stored(storage) == sorted([batch.input_file_id, done.output_file_id])  # no orphan
    assert (done.request_counts.completed, done.request_counts.failed) == (LINES, 0)
    assert not os.path.exists(second.dir)


#: What a test hook left in the package would hold: the runner's old marker file
#: (``TEST-HOOK-kill-runner-before-finish``), its constant and function, the words, and a
#: process killing itself.
HOOK_NEEDLES = (b"test-hook", b"test_hook", b"test hook", b"kill-runner")
SELF_KILL = re.compile(rb"os\.kill\(\s*os\.getpid\(\)|raise_signal\(|os\.abort\(")


def service_wheel(tmp_path: Path) -> Path:
    """The service package's wheel, built as ``tox -e package`` builds it (setuptools, the
    package's own pyproject), from a copy of its tree: nothing is written in the clone."""
    source = tmp_path / "service"
    shutil.copytree(
        REPO / "packages" / "service",
        source,
        ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__"),
    )
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", str(tmp_path / "dist"), str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, f"the service wheel did not build:\n{built.stderr[-3000:]}"
    (wheel,) = (tmp_path / "dist").glob("relayllm_service-*.whl")
    return wheel


def test_the_wheel_ships_no_test_hook(tmp_path):
    """Faults are injected from outside: no file of the service's wheel (every one, not only the
    modules: data files and metadata too) names a marker or kills its own process (the
    runner once SIGKILLed itself when a file of a given name was in its state directory:
    anyone who could write there could crash it)."""
    with zipfile.ZipFile(service_wheel(tmp_path)) as wheel:
        names = wheel.namelist()
        assert "relayllm_service/runner/loop.py" in names and len(names) > 30, names
        found = []
        for name in names:
            data = wheel.read(name)
            found += [(name, n.decode()) for n in HOOK_NEEDLES if n in data.lower()]
            found += [(name, m.group().decode()) for m in SELF_KILL.finditer(data)]
    assert found == [], f"a test hook ships in the wheel: {found}"
