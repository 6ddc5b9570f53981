"""Batch files without a cluster: resume by custom_id from what the output files hold, and
duplicates found across chunks (runs on the echo backend: tests/core/test_batch_file.py)."""

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
