"""Every script kept in benchmarks/ is one that docs/benchmarks.md runs, and it still takes the
command each committed results file records for it: a refactor that breaks a script's imports or
renames an option fails here, in seconds, and a script no results file names (one nobody runs)
fails too. Every script kept also has a toy run, named below: the echo scripts run at toy size
on a cluster (tests/core), the engine scripts' parts that need no engine run here
(test_benchmark_measures.py: their workloads, and each committed run summarised again), and
benchmarks/nodes.py runs on the vLLM engine in its tier. A script added without one fails here.

The parser is the script's own: ``main()`` builds it and parses the recorded arguments, and the
parse is stopped there (nothing is measured and nothing is written)."""

import argparse
import importlib
import json
import re
import shlex
import sys

import pytest
from support import REPO

BENCHMARKS = REPO / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

#: Not measuring scripts: the shared helpers.
NOT_MEASURING = {"_common"}
SCRIPTS = sorted(p.stem for p in BENCHMARKS.glob("*.py") if p.stem not in NOT_MEASURING)
RESULTS = {p.stem: json.loads(p.read_text()) for p in sorted(BENCHMARKS.glob("results/*.json"))}


#: Each script kept, and the test file that runs it at toy size (by name: an import or a run).
TOY_RUNS = {
    "overhead": "tests/core/test_benchmark_smoke.py",
    "routing": "tests/core/test_benchmark_smoke.py",
    "scaleout": "tests/core/test_benchmark_smoke.py",
    "userpath": "tests/core/test_benchmark_smoke.py",
    "batch_file": "tests/core/test_benchmark_scripts.py",
    "batch_service": "tests/core/test_benchmark_scripts.py",
    "engine": "tests/unit/core/test_benchmark_measures.py",
    "online_batch": "tests/unit/core/test_benchmark_measures.py",
    "nodes": "tests/adapters/vllm/test_node_lost_vllm.py",
}


class Parsed(Exception):
    def __init__(self, namespace: argparse.Namespace) -> None:
        self.namespace = namespace


def parse(command: str, monkeypatch) -> tuple[str, argparse.Namespace]:
    """The script a recorded command runs, and what the script's own parser makes of it."""
    python, path, *args = shlex.split(command)
    assert python == "python" and path.startswith("benchmarks/"), command
    script = path.removeprefix("benchmarks/").removesuffix(".py")
    module = importlib.import_module(script)
    real = argparse.ArgumentParser.parse_args

    def stop_after_parsing(self, args=None, namespace=None):
        raise Parsed(real(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stop_after_parsing)
    monkeypatch.setattr(sys, "argv", [path, *args])
    with pytest.raises(Parsed) as parsed:
        module.main()
    return script, parsed.value.namespace


def test_every_script_kept_is_one_a_committed_result_was_measured_with():
    run = {shlex.split(data["command"])[1] for data in RESULTS.values()}
    unrun = [name for name in SCRIPTS if f"benchmarks/{name}.py" not in run]
    assert SCRIPTS and not unrun, f"no results file names these scripts: {unrun}"


def test_every_script_kept_has_a_toy_run_in_a_test():
    assert sorted(TOY_RUNS) == SCRIPTS, "a script kept needs a toy run (or its fold)"
    for script, test in TOY_RUNS.items():
        text = (REPO / test).read_text()
        # Imported (its functions called in-process), run by the file's ``run`` helper, or
        # named as the script's path.
        runs = rf'^import {script}\b|\brun\(tmp_path, "{script}"|"{script}\.py"'
        assert re.search(runs, text, re.MULTILINE), f"{test} does not run benchmarks/{script}.py"


@pytest.mark.parametrize("name", sorted(RESULTS))
def test_the_script_still_takes_the_command_its_result_records(name, monkeypatch):
    command = RESULTS[name]["command"]
    script, namespace = parse(command, monkeypatch)
    assert script in SCRIPTS, f"results/{name}.json was measured by a script that is gone"
    # A results file named on the command line is this one: the page finds it by that name.
    if "--results-name" in command or "--name " in command:
        written = getattr(namespace, "results_name", None) or getattr(namespace, "name", None)
        assert written == name, (command, written)


def test_an_option_a_script_does_not_have_is_refused(monkeypatch, capsys):
    # The check above would pass on a parser that accepts anything: this one must not.
    with pytest.raises(SystemExit):
        parse("python benchmarks/overhead.py --no-such-option 1", monkeypatch)
    assert "--no-such-option" in capsys.readouterr().err


def test_every_results_file_kept_is_one_a_docs_page_cites():
    # benchmarks/results/ keeps the latest run of each question a page shows; a run no page
    # cites (a history, a probe) stays in git history instead.
    pages = "\n".join(p.read_text() for p in sorted((REPO / "docs").glob("*.md")))
    uncited = [name for name in RESULTS if f"results/{name}.json" not in pages]
    assert not uncited, f"no docs page cites these results files: {uncited}"


def test_every_command_the_benchmarks_page_reproduces_has_its_results_file():
    text = (REPO / "docs" / "benchmarks.md").read_text()
    named = re.findall(r"# -> results/([\w.-]+)\.json", text)
    assert named and sorted(named) == sorted(RESULTS), "docs/benchmarks.md's Reproduce list"
