"""What users do, done the way they do it, on the real engine: the README's Python snippet as
the README has it, Parquet and CSV inputs through a pipeline file and through
``build_processor``, a deployment with an HTTP front started from a YAML file and found with
``relayllm status`` while ``relayllm run`` works on it, its API key in no log, and the 503 its
front answers once its engine died.

The input tests run on the examples' engine; the HTTP ones on the suite's HTTP deployment (the
one ``relayllm deploy`` started from a file with an ``http:`` section, conftest's
``http_deployed``); the README's snippet deploys and stops an engine of its own.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from support import RELAYLLM, REPO
from vllm_support import (
    DEMO_FIELDS,
    DEPLOYMENT_NAME,
    EXAMPLES,
    HTTP_NAME,
    cli,
    http_key,
    stop,
)

import relayllm

QUESTIONS = [
    {"id": 1, "question": "What is the capital of France?"},
    {"id": 2, "question": "How many days are there in a week?"},
    {"id": 3, "question": "What do bees make?"},
]


def readme_python_snippet() -> str:
    """The first ``python`` block under the README's "The Python API" heading."""
    text = (REPO / "README.md").read_text()
    heading = re.search(r"^## The Python API\b.*$", text, re.MULTILINE)
    assert heading, "README.md has no '## The Python API' section"
    block = re.search(r"^```python\n(.*?)^```$", text[heading.end() :], re.MULTILINE | re.DOTALL)
    assert block, "no python block under the README's Python API heading"
    return block.group(1)


# The snippet's second pass sets no max_tokens: the engine may write up to the context length.
@pytest.mark.timeout(1800)
def test_the_readmes_python_snippet_runs_as_written(env, no_engine, tmp_path):
    """Copied from README.md at test time, run in a fresh interpreter on the tests' cluster: it
    deploys its own engine, runs both passes and shuts the engine down."""
    code = readme_python_snippet()
    assert 'relayllm.shutdown("llm")' in code  # it cleans up after itself, as read here
    script = tmp_path / "snippet.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert done.returncode == 0, done.stderr[-6000:]
    printed = done.stdout.strip().splitlines()[-1]
    # It prints the rows of the second pass: the question, the first answer, the shorter one.
    assert "'question': 'What is the capital of France?'" in printed, printed
    assert "Paris" in printed and "'generated_text': " in printed and "'error': None" in printed
    assert "llm" not in [r.name for r in relayllm.list_deployments()]


# -- inputs: Parquet and CSV, through a pipeline file and through build_processor -------------


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def pipeline_file(path: Path, input_path: Path, content: str) -> Path:
    pipeline = {
        "deployments": [DEMO_FIELDS],  # the examples' deployment: reused, not started again
        "input": {"path": str(input_path), "id_column": "id"},
        "steps": [
            {
                "name": "answer",
                "deployment": DEPLOYMENT_NAME,
                "messages": [{"role": "user", "content": content}],
                "sampling_params": {"temperature": 0.0, "max_tokens": 12},
                "output_column": "answer",
            }
        ],
    }
    path.write_text(json.dumps(pipeline, indent=2))  # JSON is YAML
    return path


def test_parquet_and_csv_inputs_through_a_pipeline_file(env, demo_deployment, tmp_path):
    parquet = write_parquet(tmp_path / "questions.parquet", QUESTIONS)
    config = pipeline_file(tmp_path / "parquet.yaml", parquet, "{question}")
    out = tmp_path / "parquet-out.jsonl"
    cli("run", config, "--output", out, env=env)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == [1, 2, 3]
    assert all(r["error"] is None and r["answer"] for r in rows), rows
    assert "Paris" in rows[0]["answer"], rows[0]

    csv_input = EXAMPLES / "data" / "topics.csv"
    config = pipeline_file(tmp_path / "csv.yaml", csv_input, "Name the form {form} in one word.")
    out = tmp_path / "csv-out.csv"
    cli("run", config, "--output", out, "--limit", "2", env=env)
    import csv

    written = list(csv.DictReader(out.open()))
    assert [r["id"] for r in written] == ["1", "2"]
    assert [r["form"] for r in written] == ["haiku", "limerick"]
    assert all(r["answer"] and not r["error"] for r in written), written


def test_parquet_and_csv_inputs_through_build_processor(demo_deployment, tmp_path):
    import ray

    ray.data.DataContext.get_current().execution_options.preserve_order = True
    processor = relayllm.build_processor(
        relayllm.ProcessorConfig(
            deployment=DEPLOYMENT_NAME, sampling_params={"temperature": 0.0, "max_tokens": 12}
        ),
        preprocess=lambda row: {**row, "messages": [{"role": "user", "content": row["q"]}]},
    )
    parquet = write_parquet(
        tmp_path / "q.parquet", [{"id": r["id"], "q": r["question"]} for r in QUESTIONS]
    )
    rows = processor(ray.data.read_parquet(str(parquet))).take_all()
    assert [r["id"] for r in rows] == [1, 2, 3]
    assert all(r["error"] is None and r["generated_text"] for r in rows), rows
    assert "Paris" in rows[0]["generated_text"]

    topics = ray.data.read_csv(str(EXAMPLES / "data" / "topics.csv")).map(
        lambda row: {"id": row["id"], "q": f"Write a {row['form']} about {row['topic']}."}
    )
    rows = processor(topics).take_all()
    assert sorted(r["id"] for r in rows) == [1, 2, 3, 4, 5, 6], "every row of the CSV, once"
    assert all(r["error"] is None and r["generated_text"] for r in rows), rows


# -- a deployment with an HTTP front, from a YAML file ----------------------------------------


def post(url: str, body: dict, key: str | None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=300) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        text = err.read().decode(errors="replace")
        try:
            return err.code, json.loads(text)
        except ValueError:  # not the front's JSON error (Serve's proxy, say)
            return err.code, {"raw": text}


def status_entry(env) -> dict:
    status = json.loads(cli("status", "--json", env=env).stdout)
    return next(d for d in status if d["name"] == HTTP_NAME)


def test_deploy_a_file_with_http_then_the_openai_client_while_relayllm_run_works(
    env, http_deployed, http_deployment, tmp_path
):
    """``relayllm deploy http.yaml``, the front's URL read from ``relayllm status``, and an
    OpenAI-client request answered while ``relayllm run http.yaml`` is running on the same
    deployment (one engine, one replica)."""
    import openai

    path, deployed = http_deployed
    assert f"{HTTP_NAME}: RUNNING (backend vllm)" in deployed.stdout, deployed.stdout
    entry = status_entry(env)
    url = entry["url"]
    assert url and url.endswith(f"/{HTTP_NAME}/v1"), entry
    assert url in cli("status", env=env).stdout  # the table shows it too
    before = http_deployment.handle().info.remote().result(timeout_s=120)

    out = tmp_path / "run.jsonl"
    run = subprocess.Popen(
        [RELAYLLM, "run", str(path), "--output", str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        handle = http_deployment.handle()
        deadline = time.monotonic() + 600
        while handle.info.remote().result(timeout_s=60)["ongoing"] == 0:  # the run reached it
            assert run.poll() is None, run.communicate()
            assert time.monotonic() < deadline, "relayllm run never reached the deployment"
            time.sleep(0.1)
        client = openai.OpenAI(base_url=url, api_key=http_key(), max_retries=0)
        reply = client.chat.completions.create(
            model=HTTP_NAME,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            temperature=0.0,
            max_tokens=8,
        )
        answered_while_running = run.poll() is None
        stdout, stderr = run.communicate(timeout=900)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, stderr[-4000:]
    assert "Paris" in reply.choices[0].message.content, reply
    assert answered_while_running, "the run had ended before the HTTP request was answered"
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 6 and all(r["error"] is None and r["answer"] for r in rows), rows
    after = http_deployment.handle().info.remote().result(timeout_s=120)
    assert after["replica_id"] == before["replica_id"] and after["engine_starts"] == 1
    assert after["rows_by_class"]["batch"] == before["rows_by_class"]["batch"] + 6
    assert after["rows_by_class"]["interactive"] == before["rows_by_class"]["interactive"] + 1
    # Without the key, or with another one: refused.
    ask = {"model": HTTP_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert post(url + "/chat/completions", ask, None)[0] == 401
    assert post(url + "/chat/completions", ask, "sk-not-the-key")[0] == 401


def test_the_http_api_key_is_in_no_log_line(http_deployment, ray_session):
    """Every file of the Ray session's logs (Serve's proxy and replicas, the engine's own
    lines), after requests with the key, without it and with a wrong one."""
    key = http_key()
    info = http_deployment.handle().info.remote().result(timeout_s=120)
    url = info["http"]["url"] + "/chat/completions"
    ask = {"model": HTTP_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert post(url, ask, key)[0] == 200
    assert post(url, ask, "sk-not-the-key")[0] == 401
    time.sleep(2)  # let the replica's lines reach their files
    session = Path(ray_session._private.worker._global_node.get_session_dir_path())
    logs = {
        str(p.relative_to(session)): p.read_text(errors="replace")
        for p in (session / "logs").rglob("*")
        if p.is_file() and p.suffix in (".log", ".out", ".err", ".txt", ".json", "")
    }
    everything = "\n".join(logs.values())
    # The replica's own lines were among those read (else "not found" proves nothing).
    assert HTTP_NAME in everything and "vLLM" in everything, sorted(logs)[:20]
    leaks = [name for name, text in logs.items() if key in text]
    assert not leaks, f"the API key appears in: {leaks}"


@pytest.mark.kills_engine
def test_the_http_front_answers_503_once_its_engine_died(http_deployment):
    """The engine under the front is killed (as the OOM killer would): a request gets 503 and an
    OpenAI error body saying so, not a hang, a 200 or a 500. (Then the deployment is removed.)"""
    import psutil

    key = http_key()
    handle = http_deployment.handle()
    info = handle.info.remote().result(timeout_s=120)
    url = info["http"]["url"] + "/chat/completions"
    ask = {"model": HTTP_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    assert post(url, ask, key)[0] == 200
    engine = psutil.Process(info["pid"]).children(recursive=True)
    assert engine, "the replica has no engine process to kill"
    for proc in engine:
        proc.kill()
    # Dead (a zombie until the replica reaps it), and no health check has run yet: the
    # replica is still the one answering the front.
    deadline = time.monotonic() + 10
    while any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in engine):
        assert time.monotonic() < deadline, "the engine processes did not die"
        time.sleep(0.1)
    try:
        status, body = post(url, ask, key)
        assert status == 503, (status, body)
        assert body["error"]["type"] == "server_error" and "engine" in body["error"]["message"]
    finally:
        stop(HTTP_NAME)
