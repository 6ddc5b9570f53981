"""``relayllm run``'s flags that do not go together are refused before anything connects: the
exit code and the message a user reads, with no cluster (the run on a cluster:
tests/core/test_cli.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from relayllm.cli import main

PIPELINE = """\
deployments:
  - {name: flags-echo, backend: echo}
input: {path: questions.jsonl, id_column: id}
steps:
  - {name: answer, deployment: flags-echo, prompt: "{question}", output_column: answer}
output: {path: out/answers.jsonl}
"""


@pytest.fixture
def pipeline(tmp_path: Path, echo_backend, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    rows = "".join(json.dumps({"id": i, "question": f"q{i}"}) + "\n" for i in range(3))
    (tmp_path / "questions.jsonl").write_text(rows)
    path = tmp_path / "p.yaml"
    path.write_text(PIPELINE)
    return path


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--resume", "--output", "-"], "--resume needs an output file"),
        (["--resume", "--output", "a.csv"], "--resume appends to a .jsonl output"),
        (["--retry-errors"], "--retry-errors goes with --resume"),
        (["--json", "--output", "-"], "--json and --output - both write to stdout"),
    ],
)
def test_flags_that_do_not_go_together_are_refused_before_anything_runs(pipeline, flags, message):
    done = CliRunner().invoke(main, ["run", str(pipeline), *flags], prog_name="relayllm")
    assert done.exit_code == 2, (done.exit_code, done.output, done.exception)
    assert message in done.output and "Traceback" not in done.output, done.output
    assert not (pipeline.parent / "out").exists() and not (pipeline.parent / "a.csv").exists()
