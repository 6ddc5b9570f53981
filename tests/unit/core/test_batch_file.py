"""Batch files without a cluster: resume by custom_id from what the output files hold, and
duplicates found across chunks (runs on the echo backend: tests/core/test_batch_file_on_ray.py)."""

import json

import pytest

from relayllm.batch import scan as batch_file
from relayllm.errors import ConfigError


def chat(i: int, **body) -> str:
    body = {"messages": [{"role": "user", "content": f"hello {i}"}], **body}
    line = {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
    return json.dumps(line)


def test_resume_skips_what_the_files_hold(tmp_path):
    """No cluster: the scan of a resumed file, after a kill cut the output's last line."""
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join([chat(i) for i in range(10)] + ["not json"]) + "\n")
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    out.write_text(
        "".join(json.dumps({"custom_id": f"c{i}", "error": None}) + "\n" for i in range(4))
        + '{"custom_id": "c4", "resp'  # cut short by the kill
    )
    err.write_text(
        json.dumps({"custom_id": None, "error": {"line": 11}})
        + "\n"
        + json.dumps({"custom_id": "c5", "error": {"line": 6}})
        + "\n"
    )
    done = batch_file.read_done(str(out), str(err), retry_errors=False)
    assert out.read_text().endswith('"error": null}\n'), "the cut line is trimmed"
    assert (done.completed, done.failed) == (4, 2)
    assert len(done.ids) == 5 and "c5" in done.ids and "c4" not in done.ids
    scan = batch_file.scan_batch_file(str(path), 256, done)
    assert scan.already == 6 and scan.to_run == 5 and not scan.bad  # c4, c6..c9
    keys = scan.chunks[0].keys
    assert [i for i, k in enumerate(keys) if k != batch_file.SKIP] == [4, 6, 7, 8, 9]

    retry = batch_file.read_done(str(out), str(err), retry_errors=True)
    assert err.read_text() == "" and (retry.completed, retry.failed) == (4, 0)
    scan = batch_file.scan_batch_file(str(path), 256, retry)
    assert scan.to_run == 6 and [b.line for b in scan.bad] == [11]


def test_duplicates_are_found_across_chunks(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join([chat(i) for i in range(600)] + [chat(3)]) + "\n")
    with pytest.raises(ConfigError, match="'c3' on lines 4, 601"):
        batch_file.scan_batch_file(str(path), 16)


def test_a_stopped_line_is_neither_sent_nor_written_and_an_image_error_is_named(tmp_path):
    """The pieces of a stop inside a block, without a cluster: the stage's preprocess marks
    the lines after the stop flag appears, the postprocess keeps them out of both files, and
    the block writer counts them; a row the image check refused is ``invalid_image_url``."""
    import io

    import pyarrow as pa

    from relayllm.batch.ray_job import Parse, Respond, write_block
    from relayllm.batch.stop import StopCheck

    flag = tmp_path / "stop"
    stop = StopCheck(str(flag))
    parse, respond = Parse("chat", stop), Respond("echo", "echo-echo")
    text = json.dumps(
        {
            "custom_id": "a",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": "hi"}]},
        }
    )
    sent = parse({"line": 1, "text": text})
    assert not sent.get("skip") and sent["messages"]
    flag.touch()
    held = parse({"line": 2, "text": text})
    assert held["skip"] and held["messages"] is None
    assert StopCheck(deadline=0.0)() and not StopCheck()()
    rows = [
        respond({**sent, "generated_text": "hi", "finish_reason": "stop", "error": None}),
        respond({**held, "error": "no messages"}),
        respond({**sent, "error": "messages[0].content[1].image_url: remote images are not "
                 "allowed here: send the image as a data: URL"}),
    ]  # fmt: skip
    out, err = io.StringIO(), io.StringIO()
    assert write_block(pa.Table.from_pylist(rows), out, err) == (1, 1, 1)
    (refused,) = [json.loads(x) for x in err.getvalue().splitlines()]
    assert refused["error"]["code"] == "invalid_image_url"
    assert refused["error"]["message"].startswith("messages[0].content[1].image_url")


def test_a_scoring_line_with_a_stopped_pair_is_not_written():
    """A stop can fall between the pairs of one scoring line: the pairs sent before it are
    dropped with the line, which is written to neither file, so a resumed run does it whole."""
    import io

    from relayllm.batch.pairs import ScoreWriter, StopPairs
    from relayllm.batch.stop import StopCheck

    running, stopped = StopPairs(StopCheck()), StopPairs(StopCheck(deadline=0.0))
    row = {"line": 1, "custom_id": "s", "pairs": 2, "query": "q", "rerank": False, "top_n": 0}
    first = {**running({**row, "pair": 0, "document": "a"}), "score": 0.5, "error": None}
    second = stopped({**row, "pair": 1, "document": "b"})
    assert not first["skip"] and second["skip"] and second["query"] is None
    out, err = io.StringIO(), io.StringIO()
    assert ScoreWriter("echo", "echo")([first, {**second, "error": None}], out, err) == (0, 0, 1)
    assert out.getvalue() == err.getvalue() == ""


def test_a_timeout_is_not_reported_as_a_write_failure(tmp_path, monkeypatch):
    """TimeoutError and ConnectionError are OSErrors: the run's handler for failed writes
    once turned a Serve call that timed out into "cannot write None: None". They pass
    through as they are; a failed write still names the files."""
    import contextlib
    import errno

    from relayllm.batch import run as batch_run

    @contextlib.contextmanager
    def running_deployment(*args):
        yield ["d"], "d"

    monkeypatch.setattr(batch_run, "_deployments", running_deployment)
    path = tmp_path / "in.jsonl"
    path.write_text(chat(0) + "\n")
    out = tmp_path / "out.jsonl"

    class Progress(batch_run.BatchProgress):
        def __init__(self, exc: OSError) -> None:
            self.exc = exc

        def connect(self, address):
            pass

        def running(self, plan):
            raise self.exc

    waited = TimeoutError("no replica of deployment 'd' answered within 60 s")
    for exc in (waited, ConnectionError("the cluster went away")):
        with pytest.raises(type(exc)) as raised:
            batch_run.run_batch_file(path, deployment="d", output=out, progress=Progress(exc))
        assert raised.value is exc
    full = OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(ConfigError, match=r"cannot write .*out\.jsonl or .*: No space left"):
        batch_run.run_batch_file(path, deployment="d", output=out, progress=Progress(full))


def test_the_progress_displays_old_names_still_work_for_a_release(tmp_path, monkeypatch):
    """``BatchHooks`` and ``hooks=`` are ``BatchProgress`` and ``progress=``'s old names: found,
    with a warning, and the display given as ``hooks=`` is the one the run calls."""
    import contextlib

    from relayllm.batch import run as batch_run

    with pytest.warns(DeprecationWarning, match="BatchHooks is renamed BatchProgress"):
        assert batch_run.BatchHooks is batch_run.BatchProgress

    @contextlib.contextmanager
    def running_deployment(*args):
        yield ["d"], "d"

    monkeypatch.setattr(batch_run, "_deployments", running_deployment)
    path = tmp_path / "in.jsonl"
    path.write_text(chat(0) + "\n")
    calls = []

    class Progress(batch_run.BatchProgress):
        def connect(self, address):
            calls.append("connect")
            raise ConnectionError("stop here")

    renamed = r"run_batch_file\(hooks=\) is renamed progress="
    with pytest.warns(DeprecationWarning, match=renamed), pytest.raises(ConnectionError):
        batch_run.run_batch_file(
            path, deployment="d", output=tmp_path / "o.jsonl", hooks=Progress()
        )
    assert calls == ["connect"]
