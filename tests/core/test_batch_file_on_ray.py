"""``relayllm batch`` at scale (relayllm.batch.run, relayllm.batch.scan): a file read from
disk in blocks, run on several stage actors, resumed by custom_id; and
:func:`relayllm.run_batch_file`, on a running deployment or on a deployments file's. On a real
local Ray cluster and the echo backend (a real Serve deployment); the kill-and-resume of the
command itself is in test_cli.py."""

import io
import json

import pytest
from support import SHARED_ECHO, echo_deployment

import relayllm
from relayllm.batch import ray_job
from relayllm.batch import scan as batch_file
from relayllm.batch.stop import StopCheck, clear_stop, raise_stop
from relayllm.blocks import stage_batch
from relayllm.errors import ConfigError

pytestmark = pytest.mark.usefixtures("ray_session")

ECHO = SHARED_ECHO  # the `echo` fixture's deployment: the session's, shared
NAME = ECHO["name"]


def chat(i: int, **body) -> str:
    body = {"messages": [{"role": "user", "content": f"hello {i}"}], **body}
    line = {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
    return json.dumps(line)


def run(path, concurrency=2, done=None, batch_size=16, deployment=NAME, compute="tasks"):
    scan = batch_file.scan_batch_file(str(path), stage_batch(batch_size), done)
    out, err = io.StringIO(), io.StringIO()
    fields = {"batch_size": batch_size, "concurrency": concurrency, "compute": compute}
    counts = ray_job.run_scanned(scan, [deployment], deployment, out, err, fields, done)
    return (
        scan,
        counts,
        [json.loads(x) for x in out.getvalue().splitlines()],
        [json.loads(x) for x in err.getvalue().splitlines()],
    )


@pytest.fixture
def busy_echo():
    """Ray Data gives a block to the least busy stage actor: when the echo answers faster
    than the file is read, the first actor is free again for every block and does them all
    (as CI saw). Calls that take 0.2 s keep it busy, so the second actor gets blocks too;
    and the run waits for the whole pool before it dispatches, so the second has started."""
    from ray.data import DataContext

    context = DataContext.get_current()
    before = context.wait_for_min_actors_s
    context.wait_for_min_actors_s = 120
    with echo_deployment("bf-busy-echo", options={"delay_s": 0.2}):
        yield "bf-busy-echo"
    context.wait_for_min_actors_s = before


def test_a_multi_block_file_runs_on_several_stage_actors_in_order(busy_echo, tmp_path):
    from openai.types import CreateEmbeddingResponse
    from openai.types.chat import ChatCompletion

    n = 1500
    lines = [chat(i, max_tokens=8, temperature=0.5) for i in range(n)]
    lines[7] = '{"custom_id": "cut", '  # bad at a glance: the scan writes it
    lines[700] = chat(700, n=0)  # bad in its body: found in the stage actor
    lines[1400] = json.dumps(
        {"custom_id": "e", "url": "/v1/embeddings", "body": {"input": "a bb"}}
    )  # another task: a group of its own
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines[:900]) + "\n\n" + "\n".join(lines[900:]))  # a blank line
    scan, counts, out, err = run(path, deployment=busy_echo, compute="actors")
    assert len(scan.chunks) > 1, "one chunk: the file would run as one block"
    assert counts == {"total": n, "completed": n - 2, "failed": 2}
    # Input order within the group, every line once; the embedding group runs after.
    assert [r["custom_id"] for r in out] == [
        f"c{i}" for i in range(n) if i not in (7, 700, 1400)
    ] + ["e"]
    assert [(e["custom_id"], e["error"]["line"]) for e in err] == [(None, 8), ("c700", 701)]
    # found unchecked in the stage actor, reported as the full checks word it
    assert err[1]["error"]["code"] == "invalid_request"
    assert err[1]["error"]["message"] == "line 701: body.n is invalid: 0"
    for r in out[:-1]:
        body = ChatCompletion.model_validate(r["response"]["body"])
        assert body.choices[0].message.content == f"hello {r['custom_id'][1:]}"
    CreateEmbeddingResponse.model_validate(out[-1]["response"]["body"])
    # request ids are "<processor>-<stage actor>-<n>": more than one actor did the chat lines
    actors = {r["response"]["request_id"].split("-")[1] for r in out[:-1]}
    assert len(actors) == 2, actors


def test_scoring_lines_are_gathered_across_blocks(echo, tmp_path):
    lines = []
    for i in range(300):
        documents = [f"doc {i} {j}" for j in range(1 + i % 5)]
        url = "/v1/rerank" if i % 2 else "/v1/score"
        body = (
            {"query": f"doc {i}", "documents": documents, "top_n": 2}
            if i % 2
            else {"text_1": f"doc {i}", "text_2": documents}
        )
        lines.append(json.dumps({"custom_id": f"s{i}", "url": url, "body": body}))
    lines.append(json.dumps({"custom_id": "bad", "url": "/v1/score", "body": {"text_1": "q"}}))
    path = tmp_path / "score.jsonl"
    path.write_text("\n".join(lines) + "\n")
    scan, counts, out, err = run(path, batch_size=8)
    assert len(scan.chunks) > 1
    assert counts == {"total": 301, "completed": 300, "failed": 1}
    assert [r["custom_id"] for r in out] == [f"s{i}" for i in range(300)]
    for i, r in enumerate(out):
        body = r["response"]["body"]
        pairs = 1 + i % 5
        if i % 2:
            assert len(body["results"]) == min(2, pairs)
        else:
            assert [d["index"] for d in body["data"]] == list(range(pairs))
    assert err[0]["custom_id"] == "bad" and "needs" in err[0]["error"]["message"]


def test_a_stopped_scoring_group_sends_and_writes_nothing(echo, tmp_path):
    """The batch service's cancel on scoring lines: with the stop flag up, the stage's
    preprocess marks every pair row, none is sent, no line is written (a resumed run finds
    them all undone), and ``on_block`` ends the run at the first block."""
    lines = [
        json.dumps({"custom_id": f"s{i}", "url": "/v1/score",
                    "body": {"text_1": "q", "text_2": [f"d{i}", f"e{i}"]}})
        for i in range(40)
    ]  # fmt: skip
    path = tmp_path / "score.jsonl"
    path.write_text("\n".join(lines) + "\n")
    (tmp_path / "stop").touch()
    scan = batch_file.scan_batch_file(str(path), stage_batch(8))
    out, err, blocks = io.StringIO(), io.StringIO(), []

    class Stopped(Exception):
        pass

    def on_block(completed, failed):
        blocks.append((completed, failed))
        raise Stopped

    fields = {"batch_size": 8, "concurrency": 1}
    stop = StopCheck(str(tmp_path / "stop"))
    before = rows_computed(NAME)
    with pytest.raises(Stopped):
        ray_job.run_scanned(scan, [NAME], NAME, out, err, fields, None, on_block, stop)
    assert blocks == [(0, 0)] and out.getvalue() == err.getvalue() == ""
    assert rows_computed(NAME) == before  # not a pair was sent
    (tmp_path / "stop").unlink()  # the same file, not stopped: every line answered
    scan, counts, answered, _ = run(path, concurrency=1, batch_size=8)
    assert counts["completed"] == 40 and rows_computed(NAME) > before


def test_a_stop_raised_in_the_cluster_reaches_the_stage_workers(echo, tmp_path):
    """The signal a runner raises for stage workers on other nodes (no flag file there): in
    Ray's key-value store, asked by each worker process; raised before the run, no line is
    sent or written; cleared, the same file runs whole."""
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(chat(i) for i in range(40)) + "\n")
    key = f"test-{tmp_path.name}"
    stop = StopCheck(key=key)
    assert not stop()  # not raised yet
    raise_stop(key)
    scan = batch_file.scan_batch_file(str(path), stage_batch(8))
    out, err, blocks = io.StringIO(), io.StringIO(), []

    def on_block(completed, failed):
        blocks.append((completed, failed))
        raise KeyboardInterrupt  # ends the run, as the runner's _Stop does

    fields = {"batch_size": 8, "concurrency": 2}
    before = rows_computed(NAME)
    with pytest.raises(KeyboardInterrupt):
        ray_job.run_scanned(scan, [NAME], NAME, out, err, fields, None, on_block, stop)
    assert blocks == [(0, 0)] and out.getvalue() == err.getvalue() == ""
    assert rows_computed(NAME) == before
    clear_stop(key)
    out = io.StringIO()
    fresh = StopCheck(key=key + "-unraised")
    counts = ray_job.run_scanned(scan, [NAME], NAME, out, err, fields, None, None, fresh)
    assert counts["completed"] == 40 and rows_computed(NAME) == before + 40


def rows_computed(name):
    """Rows the deployment's replica has computed so far (its info() counter)."""
    from relayllm.deployments import handle_for

    return handle_for(name).info.remote().result(timeout_s=30)["rows"]


def test_run_batch_file_on_a_deployments_only_file_starts_and_stops_its_deployment(tmp_path):
    config = tmp_path / "deployments.yaml"
    config.write_text("deployments:\n  - name: bf-own\n    backend: echo\n")
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join([chat(i, max_tokens=1) for i in range(5)] + ["{bad"]) + "\n")
    counts = relayllm.run_batch_file(path, pipeline=config, output=tmp_path / "out.jsonl")
    assert (counts.total, counts.completed, counts.failed) == (6, 5, 1)
    assert counts.errors == str(tmp_path / "out.errors.jsonl")
    assert counts.request_counts() == {"total": 6, "completed": 5, "failed": 1}
    with open(counts.output) as out:
        answers = [json.loads(x)["response"]["body"] for x in out]
    assert [a["choices"][0]["message"]["content"] for a in answers] == ["hello"] * 5
    assert "bf-own" not in [r.name for r in relayllm.list_deployments()]  # it started it

    again = relayllm.run_batch_file(
        path, pipeline=config, output=tmp_path / "out.jsonl", resume=True, retry_errors=True
    )
    assert (again.completed, again.failed) == (5, 1)  # the bad line again, nothing else
    with pytest.raises(ConfigError, match="exactly one of"):
        relayllm.run_batch_file(path, output=tmp_path / "o.jsonl")


def test_relayllm_batch_takes_a_file_that_declares_only_deployments(tmp_path, capsys):
    """Regression: ``--config`` read the file as a whole pipeline, and a file with only
    ``deployments:`` failed with 'input: required key is missing'."""
    from relayllm.cli import main

    config = tmp_path / "deployments.yaml"
    config.write_text("deployments:\n  - name: bf-cli\n    backend: echo\n")
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(chat(i) for i in range(3)) + "\n")
    out = tmp_path / "out.jsonl"
    args = ["batch", str(path), "--config", str(config), "--output", str(out)]
    # In this process, on the session's cluster; verbose, so the command keeps the process's
    # stderr where it is (quiet, it would send it to its log file).
    main.main([*args, "--verbose"], standalone_mode=False)
    printed = capsys.readouterr()
    assert json.loads(printed.out.splitlines()[-1]) == {
        "request_counts": {"total": 3, "completed": 3, "failed": 0}
    }
    assert [json.loads(x)["custom_id"] for x in out.open()] == ["c0", "c1", "c2"]
