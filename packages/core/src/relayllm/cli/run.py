"""``relayllm run PIPELINE.yaml``: deploy what the pipeline needs, run its steps, write."""

from __future__ import annotations

import contextlib
import json

import click

from relayllm.cli.common import (
    address_option,
    connect,
    handle_errors,
    table,
    verbose_option,
)
from relayllm.cli.progress import Console
from relayllm.pipelines.run import RunProgress, run_pipeline


@click.command()
@click.argument("pipeline_file", metavar="PIPELINE.yaml", type=click.Path(dir_okay=False))
@click.option(
    "--input",
    "input_path",
    metavar="PATH",
    help="Read rows from PATH instead of the pipeline's input (a file, directory or glob).",
)
@click.option(
    "--output",
    "output_path",
    metavar="PATH",
    help="Write rows to PATH instead of the pipeline's output; '-' for stdout.",
)
@click.option(
    "--limit", type=click.IntRange(min=1), metavar="N", help="Process only the first N rows."
)
@click.option(
    "--resume",
    is_flag=True,
    help="Keep the rows already in the (.jsonl) output and process only the input rows "
    "missing from it (by input.id_column, else by their input columns); for a run that was "
    "stopped or killed.",
)
@click.option(
    "--retry-errors",
    is_flag=True,
    help="With --resume: also run again the rows the output holds with an error "
    "(they are removed from it first).",
)
@click.option(
    "--keep-deployments",
    is_flag=True,
    help="Leave running the deployments this run started (default: stop them at the end; "
    "deployments that were already running are never stopped).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the summary as one JSON object on stdout instead of the table on stderr.",
)
@address_option
@verbose_option
@handle_errors
def run(
    pipeline_file,
    input_path,
    output_path,
    limit,
    resume,
    retry_errors,
    keep_deployments,
    as_json,
    address,
    verbose,
):
    """Run a pipeline file: its steps, in order, on its deployments.

    Deployments already running under the same name and config are reused. Prints a summary
    per step (rows, errors, tokens, rows/s, tokens/s, wall time) at the end. Rows are written
    as their blocks finish; with --resume, a run started again after a stop or a kill does
    only the rows not yet in the output (rows recorded with an error count as done, unless
    --retry-errors).

    \b
    Example:
      relayllm run examples/questions.yaml --output answers.jsonl
      relayllm run examples/multiturn.yaml --resume
      relayllm run examples/multiturn.yaml --resume --retry-errors
      relayllm run examples/echo.yaml --json | jq .steps
    """
    if as_json and output_path == "-":
        raise click.UsageError("--json and --output - both write to stdout: choose one")
    summary = run_pipeline(
        pipeline_file,
        input=input_path,
        output=output_path,
        limit=limit,
        resume=resume,
        retry_errors=retry_errors,
        keep_deployments=keep_deployments,
        address=address,
        progress=ConsoleProgress(Console(), verbose),
    )
    if as_json:
        click.echo(json.dumps(summary_json(summary)))
    else:
        click.echo(format_summary(summary), err=True)


def summary_json(summary) -> dict:
    """The run's summary as the table gives it: per step and in total (seconds, not text)."""
    whole = summary.startup_s + summary.wall_s
    steps = [
        {
            "step": s.name,
            "deployment": s.deployment,
            "rows": s.rows,
            "errors": s.errors,
            "input_tokens": s.input_tokens,
            "output_tokens": s.output_tokens,
            "engine_s": round(s.engine_s, 6),
            "wall_s": round(s.wall_s, 3),
            "rows_per_s": round(s.rows / s.wall_s, 3) if s.wall_s else 0.0,
        }
        for s in summary.steps
    ]
    return {
        "steps": steps,
        "rows": summary.rows,
        "errors": summary.errors,
        "startup_s": round(summary.startup_s, 3),
        "wall_s": round(summary.wall_s, 3),
        "rows_per_s": round(summary.rows / whole, 3) if whole else 0.0,
        "output": summary.output,
        "already_done": summary.already_done,
        "deployments_started": list(summary.started),
        "engines": summary.engines,
    }


class ConsoleProgress(RunProgress):
    """A run's progress on the console: connecting, each engine starting, the steps' bars."""

    def __init__(self, console: Console, verbose: bool = False) -> None:
        self.console, self.verbose = console, verbose

    def connect(self, address):
        connect(address, self.verbose, console=self.console)

    @contextlib.contextmanager
    def deploying(self, config, running):
        what = f"{config.name!r} ({config.backend}{_model_of(config)})"
        if running:
            self.console.say(f"using the running deployment {what}")
            yield
            return
        with self.console.phase(
            f"deploying {what}: starting its engine", f"deployment {config.name!r} ready"
        ):
            yield
        said = engine_ready_line(config.name)
        if said:
            self.console.say(said)

    @contextlib.contextmanager
    def running(self, pipeline, total, already_done):
        steps = [(s.name, s.deployment) for s in pipeline.spec.steps]
        self.console.say(
            f"running {len(steps)} step(s) on {total if total is not None else 'the'} rows"
            + (f" ({already_done} already in the output)" if already_done else "")
        )
        with self.console.steps(steps, total) as progress:
            yield lambda s: progress.add_tokens([step.output_tokens for step in s.steps])


def engine_ready_line(name: str) -> str | None:
    """The line "'NAME': engine ready in N s (phase N s, ...)" from the deployment's
    ``info()``, for backends that report ``engine_ready_s`` (the time from the replica's start
    to a serving engine); None for the others, or when the replica does not answer at once."""
    import relayllm

    try:
        info = relayllm.get_deployment(name).handle().info.remote().result(timeout_s=30)
    except Exception:  # a line of progress is not worth failing the run for
        return None
    ready = info.get("engine_ready_s")
    if ready is None:
        return None
    phases = info.get("engine_start_phases") or {}
    detail = ", ".join(
        f"{key.removesuffix('_s').replace('_', ' ')} {value:.1f} s"
        for key, value in phases.items()
        if isinstance(value, (int, float))
    )
    return f"{name!r}: engine ready in {ready:.1f} s" + (f" ({detail})" if detail else "")


def _model_of(config) -> str:
    model = config.options.get("model") or config.options.get("model_path")
    return f", model {model}" if model else ""


def format_summary(summary) -> str:
    """Per-step rows, then start-up (connecting, deploying, engines starting) and the total:
    the command's whole time, start-up included, and its rates over that time."""
    rows = []
    for s in summary.steps:
        rows.append(
            [
                s.name,
                s.deployment,
                s.rows,
                s.errors,
                s.input_tokens,
                s.output_tokens,
                f"{s.rate(s.rows):.1f}",
                f"{s.rate(s.output_tokens):.1f}",
                f"{s.wall_s:.1f}s",
            ]
        )
    output_tokens = sum(s.output_tokens for s in summary.steps)
    whole = summary.startup_s + summary.wall_s
    rows.append(["start-up", "", "", "", "", "", "", "", f"{summary.startup_s:.1f}s"])
    rows.append(
        [
            "total",
            "",
            summary.rows,
            summary.errors,
            sum(s.input_tokens for s in summary.steps),
            output_tokens,
            f"{summary.rows / whole if whole else 0:.1f}",
            f"{output_tokens / whole if whole else 0:.1f}",
            f"{whole:.1f}s",
        ]
    )
    text = table(
        [
            "step",
            "deployment",
            "rows",
            "errors",
            "input tokens",
            "output tokens",
            "rows/s",
            "tokens/s",
            "wall",
        ],
        rows,
        right=range(2, 9),
    )
    where = f"\n{summary.rows} rows written to {summary.output}" if summary.output else ""
    if summary.already_done:
        where += f" ({summary.already_done} rows were already there and were not run again)"
    engines = getattr(summary, "engines", None)
    if engines:
        from relayllm.pipelines.engine_figures import summary_lines

        steps: dict[str, list[str]] = {}
        for s in summary.steps:
            steps.setdefault(s.deployment, []).append(s.name)
        where += "\n" + summary_lines(engines, steps)
    return (
        f"\n{text}{where}\n(tokens/s counts output tokens; a step's wall time runs from its "
        f"first row to its last; start-up is connecting, deploying and engines starting; "
        f"total is the whole command)"
    )
