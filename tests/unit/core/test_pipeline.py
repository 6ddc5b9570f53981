"""Pipeline files: the model, errors that name file/line/field, templates, writers (no cluster;
reading inputs as datasets and a real run: tests/core/test_pipeline_on_ray.py)."""

import csv
import difflib
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from samples import ONE_STEP, parse
from support import REPO

import relayllm
from relayllm.pipelines import PipelineError, load_pipeline
from relayllm.pipelines.outputs import RowWriter
from relayllm.pipelines.templates import render, template_fields

# Registered for each test and removed after it (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("echo_backend")

ROOT = REPO
EXAMPLES = ROOT / "examples"


def problem(text, tmp_path):
    with pytest.raises(PipelineError) as info:
        parse(text, tmp_path, "bad.yaml").check_backends()
    return str(info.value)


# -- the examples -------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_is_a_valid_pipeline(path):
    pipeline = load_pipeline(path)
    assert pipeline.spec.steps
    for step in pipeline.spec.steps:
        assert step.deployment in [d.name for d in pipeline.spec.deployments]
    if pipeline.spec.input.path:
        paths = pipeline.input_paths()
        assert all(Path(p).is_file() for p in paths)


def test_examples_cover_the_tutorial():
    names = {p.name for p in EXAMPLES.glob("*.yaml")}
    assert {
        "questions.yaml",
        "prompts.yaml",
        "sentiment.yaml",
        "multiturn.yaml",
        "multiturn-openai.yaml",
        "multiturn-sglang.yaml",
    } <= names
    questions = load_pipeline(EXAMPLES / "questions.yaml").spec
    assert len(questions.input.rows) == 4
    assert [s.deployment for s in questions.steps] == ["smollm", "smollm"]
    sentiment = load_pipeline(EXAMPLES / "sentiment.yaml").spec.steps[0]
    assert sentiment.response_format["type"] == "json_schema"
    assert sentiment.output_column == "label" and sentiment.output_json_field == "label"
    multiturn = load_pipeline(EXAMPLES / "multiturn.yaml").spec
    assert [s.name for s in multiturn.steps] == ["answer", "critique", "rewrite"]
    assert len({s.deployment for s in multiturn.steps}) == 1


def _deployments_block(lines):
    start = lines.index("deployments:\n")
    end = next(i for i in range(start + 1, len(lines)) if lines[i][:1].isalpha())
    return start, end


@pytest.mark.parametrize("other", ["multiturn-openai.yaml", "multiturn-sglang.yaml"])
def test_swapping_the_backend_changes_only_the_deployment_block(other):
    base = (EXAMPLES / "multiturn.yaml").read_text().splitlines(keepends=True)
    swapped = (EXAMPLES / other).read_text().splitlines(keepends=True)
    start, end = _deployments_block(base)
    start2, end2 = _deployments_block(swapped)
    assert base[:start] == swapped[:start2] and base[end:] == swapped[end2:], "".join(
        difflib.unified_diff(base, swapped)
    )
    a, b = load_pipeline(EXAMPLES / "multiturn.yaml").spec, load_pipeline(EXAMPLES / other).spec
    assert a.model_dump(exclude={"deployments"}) == b.model_dump(exclude={"deployments"})
    assert [d.name for d in a.deployments] == [d.name for d in b.deployments]
    assert a.deployments[0].backend != b.deployments[0].backend


# -- errors name the file, the line and the field -------------------------------------------


def test_unknown_key_names_line_and_field(tmp_path):
    text = ONE_STEP.replace(
        "    output_column: answer", "    output_column: answer\n    temprature: 0.5"
    )
    assert (
        problem(text, tmp_path) == f"{tmp_path / 'bad.yaml'}:14: steps[0].temprature: unknown key"
    )


def test_step_naming_an_undeclared_deployment(tmp_path):
    message = problem(ONE_STEP.replace("deployment: echo-a", "deployment: echo-b"), tmp_path)
    assert (
        "bad.yaml:9: steps[0].deployment: unknown deployment 'echo-b'; declared deployments: echo-a"
        in message
    )


def test_missing_template_column_points_at_the_template(tmp_path):
    message = problem(ONE_STEP.replace('content: "{question}"', 'content: "{questoin}"'), tmp_path)
    assert (
        "bad.yaml:12: steps[0].messages[0].content: column 'questoin' is not in the input"
        in message
    )
    assert "columns: id, question" in message


def test_step_processor_settings_reach_the_processor(tmp_path):
    text = ONE_STEP + "    token_budget: 2000\n    order_by_prefix: true\n    batch_size: 16\n"
    text += "    compute: actors\n"
    config = parse(text, tmp_path).spec.steps[0].processor_config()
    assert (config.token_budget, config.order_by_prefix, config.batch_size) == (2000, True, 16)
    assert config.compute == "actors"
    default = parse(ONE_STEP, tmp_path, "default.yaml").spec.steps[0].processor_config()
    assert (default.token_budget, default.order_by_prefix, default.batch_size) == (None, False, 64)
    assert default.compute == "tasks"


def test_a_later_step_may_use_an_earlier_output_column(tmp_path):
    text = (
        ONE_STEP
        + """\
  - name: shorter
    deployment: echo-a
    prompt: "Shorter: {answer} {nope}"
    output_column: short
"""
    )
    message = problem(text, tmp_path)
    assert "steps[1].prompt: column 'nope'" in message and "'answer'" not in message


def test_missing_required_key_and_wrong_type(tmp_path):
    text = ONE_STEP.replace("    output_column: answer\n", "    batch_size: lots\n")
    message = problem(text, tmp_path)
    assert "bad.yaml:8: steps[0].output_column: required key is missing" in message
    assert "bad.yaml:13: steps[0].batch_size: Input should be a valid integer" in message


def test_bad_backend_options_name_the_option(tmp_path):
    text = ONE_STEP.replace(
        "    backend: echo\n", "    backend: echo\n    options:\n      mode: loud\n"
    )
    message = problem(text, tmp_path)
    assert "bad.yaml:5: deployments[0].options.mode:" in message and "'echo'" in message


def test_a_step_whose_task_the_deployment_does_not_serve_fails_before_any_engine(tmp_path):
    # Backend.tasks_for(options): this echo deployment serves chat only, like vLLM with
    # task: generate serves no embeddings.
    text = ONE_STEP.replace(
        "    backend: echo\n", "    backend: echo\n    options:\n      tasks: [chat]\n"
    )
    text = text.replace(
        'messages:\n      - role: user\n        content: "{question}"', 'input: "{question}"'
    )
    assert 'input: "{question}"' in text
    message = problem(text, tmp_path)
    assert (
        "steps[0].task" in message and "(backend 'echo') does not serve task 'embedding'" in message
    )


def test_unknown_backend_lists_installed_ones(tmp_path):
    message = problem(ONE_STEP.replace("backend: echo", "backend: nosuch"), tmp_path)
    assert "bad.yaml:3: deployments[0].backend: unknown backend 'nosuch'" in message
    assert "echo" in message


def test_unreadable_input_path(tmp_path):
    text = ONE_STEP.replace(
        '  rows:\n    - {id: 1, question: "hi there"}', "  path: nowhere/rows.jsonl"
    )
    pipeline = parse(text, tmp_path, "bad.yaml")
    with pytest.raises(
        PipelineError, match=r"bad.yaml:5: input.path: 'nowhere/rows.jsonl' does not exist"
    ):
        pipeline.input_paths()


def test_duplicate_keys_and_invalid_yaml(tmp_path):
    message = problem(
        ONE_STEP.replace(
            "    output_column: answer", "    output_column: answer\n    output_column: x"
        ),
        tmp_path,
    )
    assert "bad.yaml:14: steps[0].output_column: duplicate key" in message
    assert "bad.yaml:3: not valid YAML" in problem("deployments:\n  - name: [\n", tmp_path)


def test_template_and_task_must_agree(tmp_path):
    message = problem(
        ONE_STEP.replace("    messages:", "    task: completion\n    messages:"), tmp_path
    )
    assert "steps[0]: task 'completion' reads 'prompt', not 'messages'" in message


def test_invalid_sampling_params_are_caught_at_load(tmp_path):
    message = problem(
        ONE_STEP.replace(
            "    output_column: answer",
            "    output_column: answer\n    sampling_params: {temperature: -1}",
        ),
        tmp_path,
    )
    assert "steps[0].sampling_params: sampling_params.temperature is invalid" in message


def test_environment_variables_fill_deployment_options(tmp_path, monkeypatch):
    text = ONE_STEP.replace(
        "    backend: echo\n",
        "    backend: echo\n    options:\n      mode: ${ECHO_MODE:-echo}\n"
        "      fail_marker: ${RELAYLLM_TEST_MARKER}\n",
    )
    assert (
        "deployments[0].options.fail_marker: environment variable RELAYLLM_TEST_MARKER is not set"
        in problem(text, tmp_path)
    )
    monkeypatch.setenv("RELAYLLM_TEST_MARKER", "BOOM")
    monkeypatch.setenv("ECHO_MODE", "reverse")
    assert parse(text, tmp_path).spec.deployments[0].options == {
        "mode": "reverse",
        "fail_marker": "BOOM",
    }


# -- templates ----------------------------------------------------------------------------


def test_templates():
    assert template_fields("a {x} {{literal}} {y:>3}") == ["x", "y"]
    assert render("Q: {q} {{ok}} n={n:03d}", {"q": "why?", "n": 7}) == "Q: why? {ok} n=007"
    assert render("{d}", {"d": {"a": [1, 2]}}) == '{"a": [1, 2]}'
    with pytest.raises(LookupError, match="no column 'z'"):
        render("{z}", {})
    with pytest.raises(LookupError, match="column 'q' is empty"):
        render("{q}", {"q": None})


# -- writers ------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv", "parquet"])
def test_row_writer_formats(tmp_path, fmt):
    path = tmp_path / f"out.{fmt}"
    writer = RowWriter(str(path), fmt)
    writer(
        [
            {"id": 1, "text": "a", "tags": ["x"], "error": None},
            {"id": 2, "text": None, "tags": [], "error": None},
        ]
    )
    writer([{"id": 3, "text": "c", "tags": ["y", "z"], "error": "boom"}])
    writer.close()
    if fmt == "jsonl":
        rows = [json.loads(line) for line in path.read_text().splitlines()]
    elif fmt == "json":
        rows = json.loads(path.read_text())
    elif fmt == "csv":
        rows = list(csv.DictReader(path.open()))
        assert rows[2] == {"id": "3", "text": "c", "tags": '["y", "z"]', "error": "boom"}
        return
    else:
        rows = pq.read_table(path).to_pylist()
    assert (
        [r["id"] for r in rows] == [1, 2, 3]
        and rows[1]["text"] is None
        and rows[2]["tags"] == ["y", "z"]
    )
    assert [r["error"] for r in rows] == [None, None, "boom"]


def test_run_pipeline_is_exported_keyword_only_and_loaded_on_first_use():
    code = (
        "import sys, relayllm; early = 'relayllm.pipelines' in sys.modules; "
        "from relayllm import run_pipeline; import relayllm.pipelines as p; "
        "print(early, run_pipeline is p.run_pipeline, 'ray' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.split() == ["False", "True", "False"], done.stderr
    with pytest.raises(TypeError):
        relayllm.run_pipeline("p.yaml", "in.jsonl")  # options are keyword-only
