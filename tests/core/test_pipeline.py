"""Pipeline files on a real cluster: inputs read as datasets, and a real run on the echo
backend (the file model and its errors: tests/unit/core/test_pipeline.py)."""

import json

import pytest

import relayllm
from relayllm.pipelines import PipelineError, deployed, load_pipeline, parse_pipeline
from relayllm.pipelines.inputs import open_dataset
from relayllm.pipelines.run import execute

pytestmark = pytest.mark.usefixtures("ray_session")

GOOD = """\
deployments:
  - name: echo-a
    backend: echo
input:
  rows:
    - {id: 1, question: "hi there"}
steps:
  - name: answer
    deployment: echo-a
    messages:
      - role: user
        content: "{question}"
    output_column: answer
"""


def parse(text, tmp_path, name="p.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return load_pipeline(path)


def test_input_from_a_glob_or_a_directory(tmp_path):
    for n in range(2):
        (tmp_path / "data").mkdir(exist_ok=True)
        (tmp_path / "data" / f"part{n}.jsonl").write_text(
            "".join(json.dumps({"id": 10 * n + i, "question": "q"}) + "\n" for i in range(3))
        )
    for path in ("data/*.jsonl", "data"):
        pipeline = parse(
            GOOD.replace('  rows:\n    - {id: 1, question: "hi there"}', f"  path: {path}"),
            tmp_path,
        )
        paths = pipeline.input_paths()
        assert pipeline.input_format(paths) == "jsonl"
        assert sorted(r["id"] for r in open_dataset(pipeline).take_all()) == [0, 1, 2, 10, 11, 12]
    (tmp_path / "t.csv").write_text("id,topic\n1,snow\n")
    pipeline = parse(
        GOOD.replace('  rows:\n    - {id: 1, question: "hi there"}', "  path: t.csv"), tmp_path
    )
    with pytest.raises(
        PipelineError, match=r"column 'question' is not in the input \(columns: id, topic\)"
    ):
        open_dataset(pipeline)
    nothing = parse(
        GOOD.replace('  rows:\n    - {id: 1, question: "hi there"}', "  path: none/*.jsonl"),
        tmp_path,
    )
    with pytest.raises(PipelineError, match="input.path: no file matches 'none/\\*.jsonl'"):
        nothing.input_paths()


# -- a real run on the echo backend ---------------------------------------------------------


def test_three_steps_share_one_deployment_with_exact_counts(tmp_path):
    rows = "\n".join(
        json.dumps(
            {
                "id": i,
                "question": f"q{i} " + "w " * i + ("BOOM" if i % 10 == 3 else ""),
                "meta": f'{{"label": "x{i}"}}' if i % 5 else "not json",
                "prompt": "an input column",
            }
        )
        for i in range(40)
    )
    (tmp_path / "rows.jsonl").write_text(rows + "\n")
    text = """\
deployments:
  - name: pipe-echo
    backend: echo
    options: {fail_marker: BOOM}
input: {path: rows.jsonl, id_column: id}
steps:
  - name: answer
    deployment: pipe-echo
    prompt: "{question}"
    output_column: answer
  - name: label
    deployment: pipe-echo
    messages: [{role: user, content: "{meta}"}]
    output_column: label
    output_json_field: label
    batch_size: 7
  - name: again
    deployment: pipe-echo
    prompt: "{answer} done"
    output_column: again
"""
    pipeline = parse_pipeline(text, "run.yaml", tmp_path)
    pipeline.check_backends()
    before = {r.name for r in relayllm.list_deployments()}
    with deployed(pipeline, keep=True) as started:  # shut down below, after its info is read
        pass
    assert started == ([] if "pipe-echo" in before else ["pipe-echo"])
    out: list[dict] = []
    try:
        summary = execute(pipeline, open_dataset(pipeline), out.extend)
        handle = relayllm.get_deployment("pipe-echo").handle()
        info = handle.info.remote().result(timeout_s=60)
    finally:
        relayllm.shutdown("pipe-echo")

    boom = {i for i in range(40) if i % 10 == 3}  # the engine refuses these (step 1)
    not_json = {i for i in range(40) if i % 5 == 0}  # step 2 cannot parse these
    assert [r["id"] for r in out] == list(range(40))
    assert all(not any(k.startswith("__relayllm") for k in r) for r in out)
    # The steps' own prompt/messages are gone; an input column of the same name is kept.
    assert all(r["prompt"] == "an input column" and "messages" not in r for r in out)
    for r in out:
        i = r["id"]
        if i in boom:
            assert r["error"].startswith("step 'answer': echo engine refused the row")
            assert r["answer"] is None and r["label"] is None and r["again"] is None
        elif i in not_json:
            assert r["error"].startswith("step 'label': the answer is not JSON")
            assert r["answer"] == r["question"].strip() and r["again"] is None
        else:
            assert (
                r["error"] is None and r["label"] == f"x{i}" and r["again"] == r["answer"] + " done"
            )
    answer, label, again = summary.steps
    assert (answer.rows, answer.errors) == (40, len(boom))
    assert (label.rows, label.errors) == (40, len(boom | not_json))
    assert (again.rows, again.errors) == (40, len(boom | not_json))
    assert summary.errors == len(boom | not_json)
    # Echo counts whitespace-separated words (and none for a row it refuses).
    words = sum(len(r["question"].split()) for r in out if r["id"] not in boom)
    assert answer.input_tokens == answer.output_tokens == words
    assert all(s.wall_s > 0 and s.rate(s.rows) > 0 for s in summary.steps)
    # One replica served all three steps; skipped rows were never sent.
    assert info["rows"] == 40 + (40 - len(boom)) + (40 - len(boom | not_json))
