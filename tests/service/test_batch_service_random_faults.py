"""Exactly once under many faults: small batches on echo run by the real runner actor (the one
``relayllm serve`` starts), killed from outside at random moments, Ray starting a new runner
process each time; the batches are created in the job store as the gateway creates them.

Each kill point is one of:

- ``anytime``: SIGKILL after a random delay (in validation, mid-block, mid-finish...);
- ``in-flight``: SIGKILL once the deployment has computed rows since the last restart, so
  lines are in flight;
- ``lock``: the test holds the job store's write lock for a random moment (the runner waits
  at its next write: a block's counts, a claim, a finish's reservation or publication), then
  SIGSTOP, the lock released, SIGKILL: the runner dies without that write;
- ``finishing``: SIGSTOP then SIGKILL as soon as a batch is seen finalizing, wherever its
  finish is (reserving its file ids, storing the bytes, publishing them);
- ``finishing-lock``: the lock held as in ``lock``, once a batch is finalizing (the finish
  waits at its reservation or its publication, its bytes stored or not);
- ``upload``: a process writing an upload as the gateway does (a new file id, the body a
  piece at a time) SIGKILLed mid-body, its ``.part-`` file dated back past the age at which
  the runner takes such a file for a killed writer's, then the runner SIGKILLed: the next
  runner's sweep on start must remove it.

Every kind lands at least once in a run; the rest of the kill points are drawn at random.

After each kill, every batch that ended is checked: its files whole JSON lines, each custom_id
exactly once across its output and error files, each answer echo's answer to its own line,
``request_counts`` equal to the files. At the end (every batch ended, the last runner has
run): the storage holds exactly the files the store records (no orphan bytes, no ``.part-``
file) and no work directory is left. A failure names the invariant it broke and the seed;
``RELAYLLM_FAULT_SEED`` replays a run, ``RELAYLLM_FAULT_KILLS`` sets the number of kill
points: 10 by default (each kind once and four more at random: CI's run, where each kill point
is a new runner's start), more for a longer hunt before a release."""

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter

import pytest

pytestmark = pytest.mark.usefixtures("ray_session")

CHAT = "/v1/chat/completions"
PROJECT = "alpha"
DEPLOYMENT = "faults-echo"
KINDS = ("anytime", "in-flight", "lock", "finishing", "finishing-lock", "upload")
#: The gateway's upload, cut mid-body: the first piece written, the rest never arrives.
UPLOAD = """
import sys, time
from relayllm_service.store.files import FileStorage
from relayllm_service.ids import new_file_id
writer = FileStorage.from_uri(sys.argv[1]).writer(new_file_id())
writer.write(b'{"custom_id": "cut", "method": "POST", "url": ')
print("written", flush=True)
time.sleep(600)
"""


def rows_of(name):
    from relayllm.deployments import handle_for

    return handle_for(name).info.remote().result(timeout_s=30)["rows"]


def lines_for(prefix, n, rng):
    """``n`` request lines; about one in eight fails where it runs (its messages not a list),
    so the error file has lines too."""
    lines = []
    for i in range(n):
        content = f"line {i} words" if rng.random() > 0.125 else "not a list"
        messages = [{"role": "user", "content": content}] if content != "not a list" else content
        body = {"model": DEPLOYMENT, "messages": messages}
        lines.append({"custom_id": f"{prefix}-{i}", "method": "POST", "url": CHAT, "body": body})
    return lines


class Service:
    """The state the gateway and the runner share: the job store and the file storage."""

    def __init__(self, settings):
        from relayllm_service.store.files import FileStorage
        from relayllm_service.store.sqlite import SQLiteJobStore

        self.settings = settings
        self.store = SQLiteJobStore(settings.store_path)
        self.storage = FileStorage.from_uri(settings.files_location)
        self.inputs: dict[str, list[dict]] = {}  # batch id -> its lines

    def create(self, lines):
        data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
        record = self.store.add_file(PROJECT, filename="in.jsonl", purpose="batch", bytes=len(data))
        self.storage.put(record.id, [data])
        batch = self.store.create_batch(PROJECT, input_file_id=record.id, endpoint=CHAT)
        self.inputs[batch.id] = lines
        return batch.id

    def batch(self, batch_id):
        return self.store.get_batch(PROJECT, batch_id)

    def read(self, file_id, context):
        if file_id is None:
            return []
        with self.storage.open(file_id) as source:
            texts = [text for text in source if text.strip()]
        try:
            return [json.loads(text) for text in texts]
        except ValueError as cut:
            raise AssertionError(f"{context}: a file of whole JSON lines: {file_id}") from cut

    def check_ended(self, batch_id, context):
        """The invariants of one ended batch; a failure names the one it broke."""
        batch = self.batch(batch_id)
        context = f"{context}, batch {batch_id}"
        assert batch.status == "completed", f"{context}: completed, not {batch.status}"
        output = self.read(batch.output_file_id, context)
        errors = self.read(batch.error_file_id, context)
        lines = {line["custom_id"]: line for line in self.inputs[batch_id]}
        ids = Counter(x["custom_id"] for x in output + errors)
        twice = sorted(i for i, n in ids.items() if n > 1)
        assert not twice, f"{context}: each custom_id exactly once: written twice {twice}"
        lost = sorted(set(lines) - set(ids))
        assert not lost, f"{context}: each custom_id exactly once: lost {lost}"
        assert set(ids) == set(lines), f"{context}: only the input's custom_ids: {ids}"
        for answer in output:
            asked = lines[answer["custom_id"]]["body"]["messages"][0]["content"]
            said = answer["response"]["body"]["choices"][0]["message"]["content"]
            assert said == asked, f"{context}: each body its own line's answer: {answer}"
        for refused in errors:
            asked = lines[refused["custom_id"]]["body"]["messages"]
            assert asked == "not a list", f"{context}: only bad lines refused: {refused}"
        counts = batch.request_counts
        assert (counts.total, counts.completed, counts.failed) == (
            len(lines),
            len(output),
            len(errors),
        ), f"{context}: request_counts equal to the files: {counts}, {len(output)}+{len(errors)}"


def new_pid(runner, old, timeout=120):
    """The pid of the runner's process once Ray has started one other than ``old``."""
    import ray

    deadline = time.monotonic() + timeout
    while True:
        try:
            pid = ray.get(runner.pid.remote(), timeout=30)
            if pid != old:
                return pid
        except (ray.exceptions.ActorUnavailableError, ray.exceptions.RayActorError):
            pass  # restarting
        assert time.monotonic() < deadline, "Ray did not start the runner again"
        time.sleep(0.1)


def hold_lock(path):
    lock = sqlite3.connect(path, isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")
    return lock


def cut_upload(service):
    """An upload's writer SIGKILLed mid-body; its ``.part-`` file, dated back as if the
    hour had passed, is left for the next runner's sweep. Returns the file's name."""
    from relayllm_service.runner.loop import PART_MAX_AGE_S
    from relayllm_service.store.files import PART

    location = service.settings.files_location
    before = set(os.listdir(location))
    writer = subprocess.Popen(
        [sys.executable, "-c", UPLOAD, location], stdout=subprocess.PIPE, text=True
    )
    try:
        assert writer.stdout.readline().strip() == "written", "the upload's first piece"
    finally:
        writer.kill()
        writer.wait()
    [part] = [name for name in set(os.listdir(location)) - before if PART in name]
    old = time.time() - PART_MAX_AGE_S - 60
    os.utime(os.path.join(location, part), (old, old))
    return part


def kill_once(kind, pid, service, rng, moved):
    """One kill point of ``kind`` on the runner ``pid``; returns what it landed on."""
    if kind == "upload":
        part = cut_upload(service)
        os.kill(pid, signal.SIGKILL)
        return f"upload ({part} left)"
    if kind == "anytime":
        time.sleep(rng.uniform(0.0, 2.0))
        os.kill(pid, signal.SIGKILL)
        return kind
    if kind == "in-flight":
        deadline = time.monotonic() + 8
        while not moved() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(pid, signal.SIGKILL)
        return kind if moved() else "in-flight (none seen)"
    landed = kind
    if kind.startswith("finishing"):
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            if any(r.status == "finalizing" or r.pending_files for r in service.store.unfinished()):
                break
            time.sleep(0.002)
        else:
            landed = f"{kind} (none seen)"
        if kind == "finishing":  # stopped at once wherever the finish is: reserve, put, publish
            os.kill(pid, signal.SIGSTOP)
            os.kill(pid, signal.SIGKILL)
            return landed
    lock = hold_lock(service.settings.store_path)
    try:
        time.sleep(rng.uniform(0.05, 0.6))  # the runner reaches its next write and waits
        os.kill(pid, signal.SIGSTOP)
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    os.kill(pid, signal.SIGKILL)
    return landed


def test_random_kills_keep_every_line_exactly_once(ray_session, tmp_path, capsys):
    import relayllm
    from relayllm_service.runner.actor import start_runner, stop_runner
    from relayllm_service.settings import ServiceSettings
    from relayllm_service.store.files import PART

    seed = int(os.environ.get("RELAYLLM_FAULT_SEED") or random.SystemRandom().randrange(1 << 32))
    kills = int(os.environ.get("RELAYLLM_FAULT_KILLS") or 10)
    with capsys.disabled():
        print(f"\nrandom faults: RELAYLLM_FAULT_SEED={seed} RELAYLLM_FAULT_KILLS={kills}")
    rng = random.Random(seed)
    relayllm.deploy(
        relayllm.DeploymentConfig(name=DEPLOYMENT, backend="echo", options={"delay_s": 0.05})
    )
    (tmp_path / "state").mkdir()
    settings = ServiceSettings(
        state_dir=str(tmp_path / "state"), batch_size=2, max_batches=2, poll_s=0.5
    )
    service = Service(settings)
    runner = start_runner(settings)
    ended: set[str] = set()
    landed: list[str] = []
    pid = None
    began = time.monotonic()
    # Every kind at least once, the rest at random, in a random order.
    kinds = list(KINDS)[:kills] + [rng.choice(KINDS) for _ in range(kills - len(KINDS))]
    rng.shuffle(kinds)
    try:
        for point, kind in enumerate(kinds):
            while len(set(service.inputs) - ended) < 2:
                service.create(lines_for(f"b{len(service.inputs)}", rng.randrange(3, 20), rng))
            pid = new_pid(runner, pid)  # the runner Ray started anew
            runner.wake.remote()
            start = rows_of(DEPLOYMENT)
            settle = time.monotonic() + 15  # the new runner at work before the next fault
            while rows_of(DEPLOYMENT) == start and time.monotonic() < settle:
                time.sleep(0.05)
            start = rows_of(DEPLOYMENT)
            where = kill_once(kind, pid, service, rng, lambda s=start: rows_of(DEPLOYMENT) > s)
            landed.append(where)
            context = f"seed {seed}, kill point {point} ({where})"
            for batch_id in set(service.inputs) - ended:
                if service.batch(batch_id).terminal:
                    service.check_ended(batch_id, context)
                    ended.add(batch_id)
        new_pid(runner, pid)
        runner.wake.remote()
        deadline = time.monotonic() + 120
        while set(service.inputs) - ended and time.monotonic() < deadline:
            for batch_id in set(service.inputs) - ended:
                if service.batch(batch_id).terminal:
                    service.check_ended(batch_id, f"seed {seed}, after the last kill")
                    ended.add(batch_id)
            time.sleep(0.2)
        left = set(service.inputs) - ended
        assert not left, f"seed {seed}: every batch ends: {left} left unfinished"
        recorded = {f.id for f in service.store.list_files(PROJECT, limit=10000).data}
        # The last runner sweeps on start, in its loop's thread: a moment after it answers.
        deadline = time.monotonic() + 30
        while True:
            stored = set(os.listdir(settings.files_location))
            parts = [name for name in stored if PART in name]
            if not parts or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert not parts, f"seed {seed}: no .part- file left: {parts}"
        orphans, missing = sorted(stored - recorded), sorted(recorded - stored)
        assert not orphans, f"seed {seed}: no orphan bytes (stored, not recorded): {orphans}"
        assert not missing, f"seed {seed}: every recorded file stored: {missing}"
        work = os.listdir(settings.work_dir)
        assert work == [], f"seed {seed}: no work directory left: {work}"
        assert len(landed) == kills
    finally:
        stop_runner(settings.runner_name)
        service.store.close()
        relayllm.shutdown(DEPLOYMENT)
    with capsys.disabled():
        took = time.monotonic() - began
        print(f"random faults: {kills} kill points in {took:.0f} s, {len(ended)} batches: {landed}")
