"""The ``relayllm`` command, driven in subprocesses against a real Ray cluster on the echo
backend: run, batch, deploy/status/shutdown across drivers, backends, bad input.

The cluster is started here with ``ray start --head`` in a private temp dir (so no other
``ray.init()`` on the machine finds it) and stopped at the end of the module.
"""

import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import CLI_TIMEOUT, RELAYLLM, cli, ray_head_node, wait_for, wait_started

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module", autouse=True)
def head_node():
    """Starts ``ray start --head`` as the module begins, so the cluster boots while the tests
    that need none run; stops it at the end."""
    with ray_head_node("rlcli-") as node:
        yield node


def drivers(head_node) -> set[str]:
    """The drivers that ever connected to this module's cluster: Ray writes a log file per
    driver process into the session's folder, under the cluster's private temp dir."""
    _, log, _ = head_node
    return {p.name for p in log.parent.glob("session_*/logs/python-core-driver-*.log")}


@pytest.fixture(scope="module")
def cluster(head_node):
    """The environment of a driver of the (now running) cluster."""
    head, log, env = head_node
    wait_started(head, log)
    return env


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


TWO_STEPS = """\
deployments:
  - name: {name}
    backend: echo
    options: {{mode: reverse}}
input:
  path: questions.jsonl
  id_column: id
steps:
  - name: answer
    deployment: {name}
    messages:
      - {{role: user, content: "{{question}}"}}
    output_column: answer
  - name: shorter
    deployment: {name}
    prompt: "short {{answer}}"
    sampling_params: {{max_tokens: 2}}
    output_column: short
output:
  path: out/answers.jsonl
"""


def questions(tmp_path: Path, n: int) -> None:
    write(
        tmp_path / "questions.jsonl",
        "".join(json.dumps({"id": i, "question": f"alpha beta q{i}"}) + "\n" for i in range(n)),
    )


# -- without a cluster --------------------------------------------------------------------


def test_help_everywhere():
    from click.testing import CliRunner

    from relayllm.cli import main

    top = cli("--help", check=0).stdout  # the installed console script
    commands = ["run", "batch", "deploy", "status", "shutdown", "backends"]
    assert all(c in top for c in commands)
    for command in commands:  # in-process: a subprocess each would only cost time
        result = CliRunner().invoke(main, [command, "--help"], prog_name="relayllm")
        assert result.exit_code == 0 and result.output.startswith(f"Usage: relayllm {command}"), (
            result.output
        )


def test_backends_lists_installed_backends_with_options():
    listed = json.loads(cli("backends", "--json", check=0).stdout)
    echo = next(b for b in listed if b["name"] == "echo")
    options = {o["name"]: o for o in echo["options"]}
    assert (
        options["mode"]["type"] == "Literal['echo', 'reverse']"
        and options["mode"]["default"] == "echo"
    )
    assert options["delay_s"]["type"] == "float (>= 0)" and options["delay_s"]["default"] == 0.0
    assert (
        options["fail_marker"]["type"] == "str | None"
        and "fail" in options["fail_marker"]["description"]
    )
    assert (
        echo["tasks"] == ["chat", "classify", "completion", "embedding", "score"]
        and echo["engine_installed"] is True
    )
    for item in listed:  # adapters installed from entry points name their distribution
        if item["distribution"]:
            assert item["version"] == importlib.metadata.version(item["distribution"])
    text = cli("backends", "echo", check=0).stdout
    assert text.startswith("echo  (relayllm.testing.echo (in code))")
    assert "mode" in text and 'default "echo"' in text
    unknown = cli("backends", "nosuch", check=2)
    assert "unknown backend 'nosuch'; installed backends:" in unknown.stderr


def test_batch_rejects_duplicate_ids_and_unroutable_models_up_front(tmp_path):
    config = write(
        tmp_path / "two.yaml",
        """\
deployments:
  - {name: alpha, backend: echo}
  - {name: beta, backend: echo}
input: {rows: [{q: x}]}
steps: [{name: s, deployment: alpha, prompt: "{q}", output_column: a}]
""",
    )
    line = {"method": "POST", "url": "/v1/completions", "body": {"prompt": "hi"}}
    dup = write(
        tmp_path / "dup.jsonl", "".join(json.dumps({**line, "custom_id": c}) + "\n" for c in "abca")
    )
    done = cli("batch", dup, "--config", config, "--output", tmp_path / "o.jsonl", check=2)
    assert "duplicate custom_id values, nothing was run: 'a' on lines 1, 4" in done.stderr
    mixed = write(
        tmp_path / "mixed.jsonl",
        "".join(
            json.dumps({**line, "custom_id": str(i), "body": {"prompt": "hi", "model": m}}) + "\n"
            for i, m in enumerate(["alpha", "gpt-4o", "llama"])
        ),
    )
    done = cli("batch", mixed, "--config", config, "--output", tmp_path / "o.jsonl", check=2)
    assert "mixes model values" in done.stderr and "['gpt-4o', 'llama'] do not" in done.stderr
    assert not (tmp_path / "o.jsonl").exists(), "nothing may be written when the file is rejected"
    both = cli(
        "batch",
        mixed,
        "--deployment",
        "x",
        "--config",
        config,
        "--output",
        tmp_path / "o.jsonl",
        check=2,
    )
    assert "exactly one of --deployment" in both.stderr


# -- on the cluster -----------------------------------------------------------------------


def test_bad_pipeline_files_fail_before_any_engine_starts(cluster, head_node, tmp_path):
    questions(tmp_path, 3)
    good = TWO_STEPS.format(name="never-started")
    cases = {
        "unknown-key.yaml": (
            good.replace("    output_column: short", "    output_column: short\n    temprature: 1"),
            "unknown-key.yaml:19: steps[1].temprature: unknown key",
        ),
        "missing-column.yaml": (
            good.replace("{{question}}", "{{questoin}}").replace("{question}", "{questoin}"),
            "missing-column.yaml:12: steps[0].messages[0].content: column 'questoin' "
            "is not in the input (columns: id, question)",
        ),
        "undeclared.yaml": (
            good.replace(
                "    deployment: never-started\n    prompt", "    deployment: other\n    prompt"
            ),
            "undeclared.yaml:15: steps[1].deployment: unknown deployment 'other'",
        ),
        "no-input.yaml": (
            good.replace("path: questions.jsonl", "path: missing/questions.jsonl"),
            "no-input.yaml:6: input.path: 'missing/questions.jsonl' does not exist",
        ),
        "bad-option.yaml": (
            good.replace("{mode: reverse}", "{mode: loud}"),
            "bad-option.yaml:4: deployments[0].options.mode: Input should be 'echo' or 'reverse'",
        ),
    }
    cases["nope.yaml"] = (None, "nope.yaml: cannot read the pipeline file")
    # Files that are not UTF-8, or an input with no rows: the file (and line) named, no traceback.
    latin1 = good.replace("short {answer}", "court {answer} caf\xe9").encode("latin-1")
    cases["latin1.yaml"] = (
        latin1,
        "latin1.yaml:16: not UTF-8 text (invalid continuation byte: byte 0xe9)",
    )
    rows = '{"id": 1, "question": "ok"}\n{"id": 2, "question": "caf\xe9"}\n'
    (tmp_path / "latin1.jsonl").write_bytes(rows.encode("latin-1"))
    cases["latin1-input.yaml"] = (
        good.replace("path: questions.jsonl", "path: latin1.jsonl"),
        f"{tmp_path / 'latin1.jsonl'}:2: not UTF-8 text",
    )
    write(tmp_path / "empty.jsonl", "")
    cases["empty-input.yaml"] = (
        good.replace("path: questions.jsonl", "path: empty.jsonl"),
        f"empty-input.yaml:6: input.path: {tmp_path / 'empty.jsonl'} has no rows (an empty file?)",
    )
    connected = drivers(head_node)
    running = {}
    for name, (text, _) in cases.items():  # in parallel: each is a short-lived process
        if isinstance(text, bytes):
            (tmp_path / name).write_bytes(text)
        path = write(tmp_path / name, text) if isinstance(text, str) else tmp_path / name
        running[name] = subprocess.Popen(
            [RELAYLLM, "run", str(path)],
            env=cluster,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    for name, process in running.items():
        _, stderr = process.communicate(timeout=CLI_TIMEOUT)
        assert process.returncode == 2, (name, stderr[-3000:])
        assert cases[name][1] in stderr, (name, stderr[-3000:])
        assert "Traceback" not in stderr
    # Every file was refused before its process connected to the cluster: no new driver...
    assert drivers(head_node) == connected
    # ...where a command that connects does leave one (what the check above would have seen).
    cli("status", env=cluster, check=0)
    assert len(drivers(head_node) - connected) == 1
    assert not (tmp_path / "out").exists()
    # (test_deploy_status_and_shutdown... checks that 'never-started' never ran on the cluster.)


def test_run_writes_every_row_and_prints_a_summary_per_step(cluster, tmp_path):
    questions(tmp_path, 30)
    pipeline = write(tmp_path / "p.yaml", TWO_STEPS.format(name="run-echo"))
    done = cli("run", pipeline, env=cluster, cwd=tmp_path, check=0)
    rows = jsonl(tmp_path / "out" / "answers.jsonl")
    assert [r["id"] for r in rows] == list(range(30))
    for r in rows:
        assert r["answer"] == f"q{r['id']} beta alpha"  # echo in reverse mode
        assert r["short"] == "alpha beta"  # "short q.. beta alpha" reversed, cut to 2 tokens
        versions = {"answer_weight_version": None, "short_weight_version": None}  # no update
        assert r["error"] is None and {k: r[k] for k in versions} == versions
        assert set(r) == {"id", "question", "answer", "short", "error", *versions}
    summary = {
        line.split()[0]: line.split()
        for line in done.stderr.splitlines()
        if line.split()[:1] in (["answer"], ["shorter"], ["total"])
    }
    # step, deployment, rows, errors, input tokens, output tokens, rows/s, tokens/s, wall
    assert summary["answer"][1:6] == ["run-echo", "30", "0", "90", "90"]
    assert summary["shorter"][1:6] == ["run-echo", "30", "0", "120", "60"]
    assert summary["total"][1:5] == ["30", "0", "210", "150"]
    assert float(summary["answer"][6]) > 0 and summary["answer"][8].endswith("s")
    assert "30 rows written to" in done.stderr
    # With no price set, the engine's line shows its time and no cost (priced: the --json test).
    line = next(s for s in done.stderr.splitlines() if s.startswith("run-echo (steps answer, "))
    assert "engine time" in line and "cost" not in line, line
    # (The run started 'run-echo', so it stops it: test_deploy_status_and_shutdown... checks.)


def test_run_json_prints_the_summary_as_one_object(cluster, tmp_path):
    questions(tmp_path, 12)
    # Each engine call takes 0.1 s (echo's delay_s): the run's engine time is at least that.
    slow = TWO_STEPS.format(name="json-echo").replace(
        "{mode: reverse}", "{mode: reverse, delay_s: 0.1}"
    )
    pipeline = write(tmp_path / "p.yaml", slow)
    priced = {**cluster, "RELAYLLM_ENGINE_HOUR_COST": "json-echo=3600"}  # a second's price: 1
    done = cli("run", pipeline, "--json", env=priced, cwd=tmp_path, check=0)
    summary = json.loads(done.stdout)  # stdout holds the object alone; the table is not printed
    engine = summary["engines"]["json-echo"]  # the engine's busy seconds, summed over replicas
    assert engine["engine_s"] >= 0.1
    assert engine["cost_estimate"] == pytest.approx(engine["engine_s"], abs=1e-3)
    steps = {s["step"]: s for s in summary["steps"]}
    assert list(steps) == ["answer", "shorter"]
    assert [steps["answer"][k] for k in ("deployment", "rows", "errors")] == ["json-echo", 12, 0]
    assert steps["shorter"]["input_tokens"] == 48 and steps["shorter"]["output_tokens"] == 24
    # Each step's engine time is its rows' (what the usage ledger charges a batch line): the
    # two steps' together are the engine's busy time over the run.
    assert all(s["engine_s"] > 0 for s in steps.values()), steps
    together = steps["answer"]["engine_s"] + steps["shorter"]["engine_s"]
    assert together == pytest.approx(engine["engine_s"], abs=0.01), (steps, engine)
    assert summary["rows"] == 12 and summary["errors"] == 0 and summary["wall_s"] > 0
    assert "total" not in done.stderr.split()
    # (--json with --output -, refused: tests/unit/core/test_cli_run.py.)


def test_run_resume_does_only_the_rows_missing_from_the_output(cluster, tmp_path):
    questions(tmp_path, 30)
    pipeline = write(tmp_path / "p.yaml", TWO_STEPS.format(name="resume-echo"))
    # What a run killed mid-way leaves: ten whole rows (marked, to tell them from recomputed
    # ones) and a last line cut short.
    out = tmp_path / "out" / "answers.jsonl"
    kept = [
        {"id": i, "question": f"alpha beta q{i}", "answer": "kept", "short": "kept", "error": None}
        for i in range(10)
    ]
    write(out, "".join(json.dumps(r) + "\n" for r in kept) + '{"id": 10, "question": "alp')

    done = cli("run", pipeline, "--resume", env=cluster, cwd=tmp_path, check=0)
    rows = jsonl(out)  # every line parses: the cut line is gone
    assert sorted(r["id"] for r in rows) == list(range(30))
    assert rows[:10] == kept
    assert all(r["answer"] == f"q{r['id']} beta alpha" for r in rows[10:])
    steps = {
        line.split()[0]: line.split()
        for line in done.stderr.splitlines()
        if line.split()[:1] in (["answer"], ["shorter"])
    }
    assert steps["answer"][2] == steps["shorter"][2] == "20"  # the engine saw only the missing rows
    assert "20 rows written to" in done.stderr and "(10 rows were already there" in done.stderr

    again = cli("run", pipeline, "--resume", env=cluster, cwd=tmp_path, check=0)  # nothing left
    assert jsonl(out) == rows and "0 rows written to" in again.stderr

    # Without input.id_column a row is known by its input columns (the one id policy of
    # relayllm.pipelines.resume): the same kept rows are found, the rest run.
    no_id = write(
        tmp_path / "no-id.yaml",
        TWO_STEPS.format(name="resume-echo").replace("  id_column: id\n", ""),
    )
    by_content = tmp_path / "out" / "by-content.jsonl"
    write(by_content, "".join(json.dumps(r) + "\n" for r in kept))
    done = cli("run", no_id, "--resume", "--output", by_content, env=cluster, cwd=tmp_path, check=0)
    assert [r["id"] for r in jsonl(by_content)] == list(range(30))
    assert jsonl(by_content)[:10] == kept and "(10 rows were already there" in done.stderr
    # (An output --resume cannot append to, refused: tests/unit/core/test_cli_run.py.)


def test_run_resume_retry_errors_runs_the_error_rows_again(cluster, tmp_path):
    questions(tmp_path, 20)
    pipeline = write(tmp_path / "p.yaml", TWO_STEPS.format(name="retry-echo"))
    out = tmp_path / "out" / "answers.jsonl"
    kept = [
        {"id": i, "question": f"alpha beta q{i}", "answer": "kept", "short": "kept", "error": None}
        for i in range(10)
    ]
    failed = [
        {
            "id": i,
            "question": f"alpha beta q{i}",
            "answer": None,
            "short": None,
            "error": "step 'answer': deployment 'retry-echo' failed after 4 attempts",
        }
        for i in range(10, 15)
    ]
    write(out, "".join(json.dumps(r) + "\n" for r in kept + failed))

    done = cli("run", pipeline, "--resume", "--retry-errors", env=cluster, cwd=tmp_path, check=0)
    rows = jsonl(out)
    assert sorted(r["id"] for r in rows) == list(range(20)), "each row once: error rows replaced"
    assert rows[:10] == kept
    assert all(r["error"] is None and r["answer"] == f"q{r['id']} beta alpha" for r in rows[10:])
    assert "10 rows written to" in done.stderr  # 5 error rows + 5 never run
    # (--retry-errors without --resume, refused: tests/unit/core/test_cli_run.py.)


def _batch_lines() -> tuple[list[str], dict[str, str]]:
    """50 lines: 45 good ones (chat, completion, embeddings; models alpha and beta) and 5 bad."""
    lines, bad = [], {}
    for i in range(45):
        model = "alpha" if i % 2 else "beta"
        if i < 35:
            line = {
                "custom_id": f"req-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": model,
                    "messages": [{"role": "user", "content": f"one two {i}"}],
                    "max_tokens": 16,
                },
            }
        elif i < 40:
            line = {
                "custom_id": f"req-{i}",
                "method": "POST",
                "url": "/v1/completions",
                "body": {"model": model, "prompt": f"three four {i}"},
            }
        else:
            line = {
                "custom_id": f"req-{i}",
                "method": "POST",
                "url": "/v1/embeddings",
                "body": {"model": model, "input": "a bb ccc"},
            }
        lines.append(json.dumps(line))
    lines.insert(3, '{"custom_id": "broken", "method": "POST", ')
    bad["line 4"] = "not valid JSON"
    lines.insert(
        10, json.dumps({"method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}})
    )
    bad["line 11"] = "'custom_id' must be a non-empty string"
    lines.insert(
        20,
        json.dumps(
            {
                "custom_id": "img",
                "method": "POST",
                "url": "/v1/images/generations",
                "body": {"prompt": "a cat"},
            }
        ),
    )
    bad["line 21"] = "'url' '/v1/images/generations' is not supported"
    lines.insert(
        30,
        json.dumps(
            {
                "custom_id": "no-msgs",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "alpha", "messages": []},
            }
        ),
    )
    bad["line 31"] = "'messages' must be a non-empty list"
    lines.insert(
        40,
        json.dumps(
            {
                "custom_id": "n2",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "beta", "n": 0, "messages": [{"role": "user", "content": "x"}]},
            }
        ),
    )
    bad["line 41"] = "body.n is invalid"
    return lines, bad


def test_batch_of_50_lines_with_5_bad_ones(cluster, tmp_path):
    lines, bad = _batch_lines()
    assert len(lines) == 50
    requests = write(tmp_path / "requests.jsonl", "\n".join(lines) + "\n")
    config = write(
        tmp_path / "two.yaml",
        """\
deployments:
  - {name: alpha, backend: echo}
  - {name: beta, backend: echo, options: {mode: reverse}}
input: {rows: [{q: x}]}
steps: [{name: s, deployment: alpha, prompt: "{q}", output_column: a}]
""",
    )
    done = cli(
        "batch",
        requests,
        "--config",
        config,
        "--output",
        tmp_path / "out.jsonl",
        "--errors",
        tmp_path / "err.jsonl",
        env=cluster,
        check=0,
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "request_counts": {"total": 50, "completed": 45, "failed": 5}
    }
    assert "Warning" not in done.stderr, done.stderr  # Ray's deprecations are not the user's
    out, err = jsonl(tmp_path / "out.jsonl"), jsonl(tmp_path / "err.jsonl")
    assert len(out) == 45 and len(err) == 5
    assert sorted(r["custom_id"] for r in out) == sorted(f"req-{i}" for i in range(45))
    for e in err:
        where = f"line {e['error']['line']}"
        assert e["response"] is None and e["error"]["message"].startswith(where + ":")
        assert bad.pop(where) in e["error"]["message"]
    assert not bad, f"no error line for {bad}"
    for r in out:
        i = int(r["custom_id"].split("-")[1])
        response = r["response"]
        assert (
            response["status_code"] == 200
            and r["error"] is None
            and r["id"].startswith("batch_req_")
        )
        body = response["body"]
        reverse = i % 2 == 0  # model beta is the reversing deployment
        if i < 35:
            words = ["one", "two", str(i)]
            assert body["object"] == "chat.completion"
            assert body["choices"][0]["message"] == {
                "role": "assistant",
                "content": " ".join(words[::-1] if reverse else words),
                "refusal": None,  # OpenAI's schema requires it, null when absent
            }
            assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
        elif i < 40:
            assert (
                body["object"] == "text_completion" and body["choices"][0]["text"].count(" ") == 2
            )
        else:
            assert body["object"] == "list" and body["data"][0]["embedding"][:3] == [1.0, 2.0, 3.0]
        # the deployment's name, as the online endpoints answer (not the engine's own name)
        assert body["model"] == ("beta" if reverse else "alpha")
    # The summary's tokens per deployment are the sums of its output lines' usage.
    for name in ("alpha", "beta"):
        bodies = [r["response"]["body"] for r in out]
        usage = [b["usage"] for b in bodies if b["model"] == name]
        prompt = sum(u.get("prompt_tokens", 0) for u in usage)
        completion = sum(u.get("completion_tokens", 0) for u in usage)
        assert prompt and completion
        said = f"{name}: {prompt:,} prompt + {completion:,} completion tokens"
        assert said in done.stderr, done.stderr


def test_deploy_status_and_shutdown_across_driver_processes(cluster, tmp_path):
    questions(tmp_path, 12)
    shared = write(tmp_path / "shared.yaml", TWO_STEPS.format(name="shared-echo"))
    deployed = cli("deploy", shared, env=cluster, check=0)
    assert "shared-echo: RUNNING (backend echo)" in deployed.stdout
    # A file with a `deployments:` section and nothing else (no input, no steps) is deployed
    # too, as `batch --config` and `serve` take such a file.
    engines = write(
        tmp_path / "engines.yaml", "deployments:\n  - name: only-engines\n    backend: echo\n"
    )
    deployed = cli("deploy", engines, env=cluster, check=0)
    assert "only-engines: RUNNING (backend echo)" in deployed.stdout

    # Each command below is a new driver process that finds the deployments by name.
    status = json.loads(cli("status", "--json", env=cluster, check=0).stdout)
    # Earlier tests' commands stopped what they started; the bad pipelines started nothing.
    assert {d["name"] for d in status} == {"shared-echo", "only-engines"}
    assert [d["status"] for d in status if d["name"] == "only-engines"] == ["RUNNING"]
    entry = next(d for d in status if d["name"] == "shared-echo")
    assert entry["status"] == "RUNNING" and entry["backend"] == "echo" and entry["rows"] == 0
    replica = entry["replica"]

    ran = cli("run", shared, "--limit", "5", "--output", "-", env=cluster, cwd=tmp_path, check=0)
    assert [json.loads(line)["id"] for line in ran.stdout.splitlines()] == [0, 1, 2, 3, 4]

    request = {
        "custom_id": "only",
        "method": "POST",
        "url": "/v1/completions",
        "body": {"prompt": "x y"},
    }
    write(tmp_path / "one.jsonl", json.dumps(request) + "\n")
    batch = cli(
        "batch",
        tmp_path / "one.jsonl",
        "--deployment",
        "shared-echo",
        "--output",
        tmp_path / "o.jsonl",
        env=cluster,
        check=0,
    )
    assert '"completed": 1' in batch.stdout
    assert jsonl(tmp_path / "o.jsonl")[0]["response"]["body"]["choices"][0]["text"] == "y x"
    assert not (tmp_path / "o.errors.jsonl").exists(), "an errors file though nothing failed"
    assert "1 completed -> " in batch.stderr and "; 0 failed\n" in batch.stderr

    table = cli("status", env=cluster, check=0).stdout
    row = next(line.split() for line in table.splitlines() if line.startswith("shared-echo"))
    # Still running (run and batch reuse, never stop, a deployment they did not start), on the
    # same replica, which served 5 rows x 2 steps + 1 batch line.
    assert row[1:3] == ["RUNNING", "echo"] and row[-2:] == [replica, "11"]

    assert (
        cli("shutdown", "shared-echo", env=cluster, check=0).stdout.strip()
        == "stopped: shared-echo"
    )
    cli("shutdown", "only-engines", env=cluster, check=0)
    again = cli("shutdown", "shared-echo", env=cluster)
    assert (
        again.returncode == 1
        and "no relayllm deployment named 'shared-echo' is running" in again.stderr
    )


# -- a new user's first hour: signs of life, output that survives a kill, quiet logs ---------

SLOW = """\
deployments:
  - name: {name}
    backend: echo
    max_ongoing_requests: {ongoing}
    options: {{delay_s: {delay}}}
input:
  path: questions.jsonl
  id_column: id
steps:
  - name: answer
    deployment: {name}
    messages:
      - {{role: user, content: "{{question}}"}}
    output_column: answer
output:
  path: out/answers.jsonl
"""


def test_run_killed_mid_way_keeps_finished_rows_and_resume_finishes(cluster, tmp_path):
    """Rows reach the disk block by block (1,200 rows: four blocks of 300, each at least one
    stage batch of 256 rows; the stage actor may work on two at once), so a kill loses at most
    the rows in flight; in a pipe the run reports its phases and plain progress lines."""
    n = 1200
    questions(tmp_path, n)
    # A second per call, every call taken at once: a block is three rounds of its two tasks'
    # calls, so the first block shows while the last two are still running. (One call at a
    # time queued the others in Serve's router, where a caller backing off can lose every
    # race: the first block, written first in input order, can come last, after the rest.)
    pipeline = write(tmp_path / "p.yaml", SLOW.format(name="kill-echo", delay=1.0, ongoing=8))
    out = tmp_path / "out" / "answers.jsonl"
    env = {**cluster, "RELAYLLM_PROGRESS_INTERVAL_S": "1"}
    process = subprocess.Popen(
        [RELAYLLM, "run", str(pipeline), "--keep-deployments"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + CLI_TIMEOUT
        while not (out.exists() and out.read_text().count("\n") > 0):
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.2)
        process.send_signal(signal.SIGKILL)  # no clean-up at all: what a kill -9 leaves
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    kept = jsonl(out)
    assert 0 < len(kept) < n, len(kept)
    assert [r["id"] for r in kept] == list(range(len(kept)))  # whole rows, in input order
    for phase in (
        "relayllm: connecting to the Ray cluster at",
        "relayllm: deploying 'kill-echo' (echo)",
        "relayllm: deployment 'kill-echo' ready in",
        "relayllm: running 1 step(s) on 1200 rows",
        "relayllm: step answer: ",
    ):
        assert phase in stderr, (phase, stderr[-3000:])
    assert "Token authentication" not in stderr and "core_worker" not in stderr  # in the log file

    done = cli("run", pipeline, "--resume", env=cluster, cwd=tmp_path, check=0)
    rows = jsonl(out)
    assert sorted(r["id"] for r in rows) == list(range(n)) and rows[: len(kept)] == kept
    assert f"({len(kept)} rows were already there" in done.stderr
    summary = {
        line.split()[0]: line.split()
        for line in done.stderr.splitlines()
        if line.split()[:1] in (["answer"], ["start-up"], ["total"])
    }
    assert summary["answer"][2] == str(n - len(kept))
    assert summary["start-up"][1].endswith("s") and summary["total"][-1].endswith("s")
    # total = start-up + rows, so it is never below the start-up
    assert float(summary["total"][-1][:-1]) >= float(summary["start-up"][1][:-1])
    cli("shutdown", "kill-echo", env=cluster, check=0)


def test_batch_killed_mid_way_resumes_each_custom_id_once(cluster, tmp_path):
    """``relayllm batch`` writes its lines block by block (602 lines in chunks of 64), so a
    kill -9 keeps what finished; --resume runs exactly the lines missing from both files
    (the replica's row count proves nothing was sent twice) and leaves every custom_id once.

    The replica takes every call at once (no queue in Serve's router, where a caller backing
    off can wait behind the others until the last block: the file, written in input order,
    then got all its lines in one go before the kill), and two stage tasks work through the
    ten blocks a second each: the first block is written while most are still to come."""
    from openai.types.chat import ChatCompletion

    n = 600
    lines = [
        json.dumps(
            {
                "custom_id": f"r{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"messages": [{"role": "user", "content": f"a b {i}"}]},
            }
        )
        for i in range(n)
    ]
    lines.insert(5, '{"custom_id": ')  # no custom_id to resume by: known by its line number
    lines.insert(500, lines[0].replace('"r0"', '"bad"').replace('"user"', '"robot"'))
    requests = write(tmp_path / "requests.jsonl", "\n".join(lines) + "\n")
    config = write(tmp_path / "slow.yaml", SLOW.format(name="batch-slow", delay=0.5, ongoing=8))
    cli("deploy", config, env=cluster, cwd=tmp_path, check=0)
    out, err = tmp_path / "out.jsonl", tmp_path / "out.errors.jsonl"
    args = [requests, "--deployment", "batch-slow", "--output", out, "--batch-size", "16"]
    process = subprocess.Popen(
        [RELAYLLM, "batch", *map(str, args), "--concurrency", "1"],
        env=cluster,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + CLI_TIMEOUT
        while not (out.exists() and out.read_text().count("\n") > 0):
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.2)
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    kept = jsonl(out)
    assert 0 < len(kept) < n, len(kept)

    def status() -> dict:
        found = json.loads(cli("status", "--json", env=cluster, check=0).stdout)
        return next(d for d in found if d["name"] == "batch-slow")

    def served() -> int:
        return status()["rows"]

    # The calls the killed run left on the replica still finish there (and count).
    wait_for(lambda: not status().get("ongoing"), "the killed run's calls finished")
    before = served()
    done = cli("batch", *args, "--resume", env=cluster, check=0)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "request_counts": {"total": n + 2, "completed": n, "failed": 2}
    }
    assert served() - before == n - len(kept), "a line already in the output was sent again"
    rows = jsonl(out)
    assert sorted(r["custom_id"] for r in rows) == sorted(f"r{i}" for i in range(n))
    assert rows[: len(kept)] == kept
    for r in rows:
        ChatCompletion.model_validate(r["response"]["body"])
    errors = jsonl(err)
    assert sorted((e["custom_id"] or "", e["error"]["line"]) for e in errors) == [
        ("", 6),
        ("bad", 501),
    ]
    again = cli("batch", *args, "--resume", env=cluster, check=0)  # nothing left: nothing runs
    assert '"completed": 600' in again.stdout and jsonl(out) == rows and jsonl(err) == errors
    cli("shutdown", "batch-slow", env=cluster, check=0)


def _in_a_terminal(args, env, cwd, timeout=CLI_TIMEOUT) -> tuple[int, str]:
    """Run the CLI on a pseudo-terminal (120 columns), as a user's terminal would; returns the
    exit code and everything it drew."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    process = subprocess.Popen(
        [RELAYLLM, *map(str, args)],
        env=env,
        cwd=cwd,
        stdin=follower,
        stdout=follower,
        stderr=follower,
        close_fds=True,
    )
    os.close(follower)
    drawn = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 1)
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the process closed the terminal
                break
            if not chunk:
                break
            drawn += chunk
        elif process.poll() is not None:
            break
    os.close(leader)
    return process.wait(timeout=60), drawn.decode("utf-8", "replace")


def test_run_on_a_terminal_draws_a_bar_per_step_and_warns_when_a_step_stalls(cluster, tmp_path):
    questions(tmp_path, 20)
    # One call at a time: the blocks finish one after another.
    pipeline = write(tmp_path / "p.yaml", SLOW.format(name="tty-echo", delay=4, ongoing=1))
    env = {**cluster, "RELAYLLM_STALL_WARNING_S": "1"}
    code, drawn = _in_a_terminal(["run", pipeline], env, tmp_path)
    assert code == 0, drawn[-3000:]
    lines = [part for part in drawn.replace("\r", "\n").split("\n") if part.strip()]
    assert any("deploying 'tty-echo' (echo): starting its engine" in line for line in lines), drawn
    assert any(line.startswith("relayllm: deployment 'tty-echo' ready in") for line in lines)
    bars = [line for line in lines if line.startswith("step answer:")]  # tqdm's bar of the step
    assert bars and any("20/20" in bar and "rows" in bar for bar in bars), bars[-3:]
    # The engine sleeps 4 s on the call: the step waits for it and says so.
    assert any(
        "warning: step answer has made no progress for" in line
        and "its rows are at deployment 'tty-echo'" in line
        for line in lines
    ), drawn[-3000:]
    assert "core_worker" not in drawn and "INFO" not in drawn  # Ray's lines: in the log file
    assert len(jsonl(tmp_path / "out" / "answers.jsonl")) == 20


def test_status_shows_a_deployment_whose_calls_get_no_answer_as_stalled(cluster, tmp_path):
    """A run waits on a deployment that does not answer (a 60 s call): ``relayllm status``,
    from another driver, says which deployment is stuck and for how long."""
    questions(tmp_path, 1)
    # Not one call at a time: info(), which status asks, would wait behind the call.
    pipeline = write(tmp_path / "p.yaml", SLOW.format(name="stuck-echo", delay=60, ongoing=8))
    cli("deploy", pipeline, env=cluster, check=0)
    run = subprocess.Popen(
        [RELAYLLM, "run", str(pipeline)],
        env=cluster,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    env = {**cluster, "RELAYLLM_STALL_WARNING_S": "2"}
    try:
        deadline = time.monotonic() + 120
        while True:  # until the run's call is at the replica, unanswered past the stall limit
            listed = json.loads(cli("status", "--json", env=env, check=0).stdout)
            entry = next(e for e in listed if e["name"] == "stuck-echo")
            if entry.get("activity") == "STALLED":
                assert entry["ongoing"] and entry["seconds_without_answer"] >= 2, entry
                break
            if "ongoing" in entry and not entry["ongoing"]:  # an idle replica is not stalled
                assert entry["activity"] == "idle" and entry["seconds_without_answer"] == 0
            assert run.poll() is None and time.monotonic() < deadline, entry
            time.sleep(0.5)
        shown = cli("status", env=env, check=0)
        row = next(line.split() for line in shown.stdout.splitlines() if "stuck-echo" in line)
        assert row[:5] == ["stuck-echo", "RUNNING", "echo", "echo-echo", "STALLED"], shown.stdout
        assert "warning: stuck-echo: 1 call(s) in progress and no answer for" in shown.stderr
    finally:
        run.kill()
        run.wait(timeout=60)
        cli("shutdown", "stuck-echo", env=cluster, check=0)


def test_batch_with_an_unknown_deployment_gives_cli_advice(cluster, tmp_path):
    line = {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "hi"}}
    requests = write(tmp_path / "r.jsonl", json.dumps(line) + "\n")
    done = cli(
        "batch",
        requests,
        "--deployment",
        "nope",
        "--output",
        tmp_path / "o.jsonl",
        env=cluster,
        check=1,
    )
    assert "no relayllm deployment named 'nope' is running on the Ray cluster at" in done.stderr
    assert "relayllm deploy PIPELINE.yaml --address HOST:PORT" in done.stderr
    assert "relayllm.deploy(" not in done.stderr and "Traceback" not in done.stderr


def test_ci_runs_the_readme_test_command():
    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    command = (root / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert command.startswith("python3 -m venv .venv && . .venv/bin/activate")
    assert command.rsplit(" && ", 1)[-1] == "tox p"  # every environment, side by side
    assert f"\n{command}\n" in readme  # the quick start's second line, as a user types it


def test_python_api_is_quiet_by_default_and_says_where_the_logs_are(cluster, tmp_path):
    """The README's Python API example prints its answer, not Ray's and Serve's INFO lines."""
    script = write(
        tmp_path / "api.py",
        """\
import ray
import relayllm
from relayllm import DeploymentConfig, ProcessorConfig, build_processor

relayllm.deploy(DeploymentConfig(name="api-echo", backend="echo"))
answer = build_processor(ProcessorConfig(deployment="api-echo"),
    preprocess=lambda row: {**row, "messages": [{"role": "user", "content": row["question"]}]})
rows = answer(ray.data.from_items([{"question": "hi there"}])).take_all()
print([row["generated_text"] for row in rows])
relayllm.shutdown("api-echo")
""",
    )
    env = {**cluster, "RELAYLLM_LOG_DIR": str(tmp_path / "logs")}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "['hi there']\n"  # nothing else on stdout
    (log,) = (tmp_path / "logs").iterdir()
    assert f"relayllm: logs of Ray, Serve and the engines: {log}" in done.stderr
    assert "Token authentication" not in done.stderr and " INFO " not in done.stderr, done.stderr
    assert "Connecting to existing Ray cluster" in log.read_text()  # where Ray's INFO lines went
