"""Pipeline files on a real cluster: inputs read as datasets, and a real run on the echo
backend (the file model and its errors: tests/unit/core/test_pipeline.py)."""

import json

import pytest
from samples import ONE_STEP, parse

import relayllm
from relayllm.pipelines import PipelineError, deployed, parse_pipeline
from relayllm.pipelines.inputs import open_dataset
from relayllm.pipelines.run import execute

pytestmark = pytest.mark.usefixtures("ray_session")


def test_input_from_a_glob_or_a_directory(tmp_path):
    for n in range(2):
        (tmp_path / "data").mkdir(exist_ok=True)
        (tmp_path / "data" / f"part{n}.jsonl").write_text(
            "".join(json.dumps({"id": 10 * n + i, "question": "q"}) + "\n" for i in range(3))
        )
    for path in ("data/*.jsonl", "data"):
        pipeline = parse(
            ONE_STEP.replace('  rows:\n    - {id: 1, question: "hi there"}', f"  path: {path}"),
            tmp_path,
        )
        paths = pipeline.input_paths()
        assert pipeline.input_format(paths) == "jsonl"
        assert sorted(r["id"] for r in open_dataset(pipeline).take_all()) == [0, 1, 2, 10, 11, 12]
    (tmp_path / "t.csv").write_text("id,topic\n1,snow\n")
    pipeline = parse(
        ONE_STEP.replace('  rows:\n    - {id: 1, question: "hi there"}', "  path: t.csv"), tmp_path
    )
    with pytest.raises(
        PipelineError, match=r"column 'question' is not in the input \(columns: id, topic\)"
    ):
        open_dataset(pipeline)
    nothing = parse(
        ONE_STEP.replace('  rows:\n    - {id: 1, question: "hi there"}', "  path: none/*.jsonl"),
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


def test_each_step_carries_the_weight_version_that_answered_it_across_an_update(tmp_path):
    """``<output_column>_weight_version`` per step: step 1 and 3 on a deployment updated to
    version 6 before the run, step 2 on one updated to 7 while the run is on it, so a row's
    steps straddle that update: each step's column says which weights answered that step
    (echo's answers start with the checkpoint's tag), null for the rows step 2 answered
    before the update and for the steps a row refused at step 1 skipped."""
    import threading
    import time

    from relayllm.pipelines.transforms import version_column
    from relayllm.testing.echo import write_echo_checkpoint

    n = 60
    rows = [{"id": i, "question": f"q{i}" + (" BOOM" if i == 5 else "")} for i in range(n)]
    text = """\
deployments:
  - name: ver-a
    backend: echo
    options: {fail_marker: BOOM}
  - name: ver-b
    backend: echo
    options: {delay_s: 0.1}
input: {id_column: id, rows: ROWS}
steps:
  - {name: first, deployment: ver-a, prompt: "{question}", output_column: first}
  - {name: second, deployment: ver-b, prompt: "{first} then", output_column: second,
     batch_size: 2}
  - {name: third, deployment: ver-a, prompt: "{second} end", output_column: third}
""".replace("ROWS", json.dumps(rows))
    pipeline = parse_pipeline(text, "ver.yaml", tmp_path)
    assert [version_column(s) for s in pipeline.spec.steps] == [
        "first_weight_version",
        "second_weight_version",
        "third_weight_version",
    ]
    out: list[dict] = []
    with deployed(pipeline, keep=True):
        pass
    try:
        relayllm.control("ver-a").update_weights(
            write_echo_checkpoint(tmp_path / "6", "w6"), version=6
        )
        b = relayllm.get_deployment("ver-b").handle()
        run = threading.Thread(target=execute, args=(pipeline, open_dataset(pipeline), out.extend))
        run.start()
        deadline = time.monotonic() + 120
        while b.info.remote().result(timeout_s=30)["rows"] < 10:
            assert time.monotonic() < deadline and run.is_alive(), "step 2 did not get going"
            time.sleep(0.05)
        relayllm.control("ver-b").update_weights(
            write_echo_checkpoint(tmp_path / "7", "w7"), version=7
        )
        run.join(timeout=300)
        assert not run.is_alive()
    finally:
        relayllm.shutdown("ver-a")
        relayllm.shutdown("ver-b")
    assert sorted(r["id"] for r in out) == list(range(n))
    seen = set()
    for r in out:
        if r["id"] == 5:  # refused at step 1 (by version 6), then skipped by steps 2 and 3
            assert r["error"] and r["first_weight_version"] == "6", r
            assert (r["second_weight_version"], r["third_weight_version"]) == (None, None), r
            continue
        assert r["error"] is None, r
        assert r["first_weight_version"] == "6" and r["first"].startswith("[w6] "), r
        assert r["third_weight_version"] == "6" and r["third"].startswith("[w6] "), r
        second = r["second_weight_version"]
        assert second in (None, "7"), r
        assert r["second"].startswith("[w7] ") == (second == "7"), r  # the weights that answered
        seen.add(second)
    assert seen == {None, "7"}, "the update fell within step 2's rows"
