"""``relayllm run PIPELINE.yaml``: deploy what the pipeline needs, run its steps, write."""

from __future__ import annotations

import time

import click

from relayllm.cli.common import (
    address_option,
    connect,
    handle_errors,
    table,
    verbose_option,
)
from relayllm.cli.output import RowWriter, output_format, stdout_sink
from relayllm.cli.progress import Console
from relayllm.errors import ConfigError


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
    "missing from it, by the input's id_column; for a run that was stopped or killed.",
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
      relayllm run examples/multiturn.yaml --resume   # needs input.id_column
      relayllm run examples/multiturn.yaml --resume --retry-errors
    """
    if retry_errors and not resume:
        raise ConfigError(
            "--retry-errors goes with --resume: it re-runs the error rows of an output"
        )
    summary = run_pipeline_file(
        pipeline_file,
        input_path,
        output_path,
        limit,
        keep_deployments,
        address,
        verbose,
        resume=resume,
        retry_errors=retry_errors,
    )
    click.echo(format_summary(summary), err=True)


def run_pipeline_file(
    pipeline_file,
    input_path,
    output_path,
    limit,
    keep_deployments,
    address,
    verbose,
    sink=None,
    resume=False,
    console=None,
    retry_errors=False,
):
    """The whole ``run`` command (``pipeline_file`` may be a parsed Pipeline); ``relayllm
    demo`` calls it with its own ``sink``."""
    from relayllm import pipeline as pl

    startup = time.monotonic()
    pipeline = (
        pipeline_file if isinstance(pipeline_file, pl.Pipeline) else pl.load_pipeline(pipeline_file)
    )
    pipeline.check_backends()
    if input_path or pipeline.spec.input.path is not None:  # files exist, columns match
        paths = pipeline.input_paths(input_path)
        columns = pl.peek_columns(paths, pipeline.input_format(paths))
        if columns == []:
            empty = f"{', '.join(paths)} has no rows (an empty file?): nothing to run"
            raise (
                ConfigError(f"--input: {empty}")
                if input_path
                else pipeline.error(("input", "path"), empty)
            )
        if columns is not None:
            pipeline.check_columns(columns)
    writer, done = None, set()
    if sink is None:
        writer, where, done = _writer(pipeline, output_path, resume, retry_errors)
        sink = writer or stdout_sink
    else:
        where = None

    console = console or Console()
    connect(address, verbose, console=console)
    dataset = pl.open_dataset(pipeline, input_path, limit)
    if done:
        from relayllm.resume import skip_done

        dataset = skip_done(dataset, pipeline.spec.input.id_column, done)
    total = pl.count_rows(pipeline, input_path, limit)
    if total is not None and done:
        total = max(total - len(done), 0)
    started = deploy_with_progress(console, pipeline, address)
    startup_s = time.monotonic() - startup
    steps = [(s.name, s.deployment) for s in pipeline.spec.steps]
    console.say(
        f"running {len(steps)} step(s) on {total if total is not None else 'the'} rows"
        + (f" ({len(done)} already in the output)" if done else "")
    )
    try:
        with console.steps(steps, total) as progress:
            summary = pl.execute(
                pipeline,
                dataset,
                sink,
                progress=lambda s: progress.add_tokens([step.output_tokens for step in s.steps]),
            )
    finally:
        if writer is not None:
            writer.close()
        if not keep_deployments and started:
            import relayllm

            for name in started:
                relayllm.shutdown(name)
    summary.output = where
    summary.already_done = len(done)
    summary.startup_s = startup_s
    return summary


def deploy_with_progress(console: Console, pipeline, address) -> list[str]:
    """Start (or reuse by name) every deployment of ``pipeline``, saying so as it goes;
    returns the names this call started."""
    import relayllm
    from relayllm.pipeline import check_fit

    running = {r.name for r in relayllm.list_deployments(address=address)}
    check_fit(pipeline, running)  # before any engine starts: the whole pipeline fits at once
    started = []
    for config in pipeline.spec.deployments:
        what = f"{config.name!r} ({config.backend}{_model_of(config)})"
        if config.name in running:
            console.say(f"using the running deployment {what}")
            relayllm.deploy(config, address=address)  # checks that its config is the same
            continue
        with console.phase(
            f"deploying {what}: starting its engine", f"deployment {config.name!r} ready"
        ):
            relayllm.deploy(config, address=address)
        started.append(config.name)
    return started


def _model_of(config) -> str:
    model = config.options.get("model") or config.options.get("model_path")
    return f", model {model}" if model else ""


def _writer(pipeline, output_path, resume=False, retry_errors=False):
    """The output's writer (None: stdout), its path, and with ``resume`` the ids of the rows a
    stopped run already wrote there (the writer then appends)."""
    spec = pipeline.spec.output
    if output_path == "-" or (output_path is None and spec is None):
        if resume:
            raise ConfigError("--resume needs an output file (not stdout) to resume")
        return None, None, set()
    # Relative to the current directory, like --output (input paths are relative to the
    # pipeline file: they are its data; outputs belong to whoever runs it).
    path = output_path or spec.path
    fmt = output_format(path, None if output_path else spec.format)
    columns = spec.columns if spec else None
    done = set()
    if resume:
        id_column = pipeline.spec.input.id_column
        if not id_column:
            raise ConfigError(
                "--resume needs input.id_column in the pipeline: the column that "
                "identifies a row in the input and in the output"
            )
        if columns and id_column not in columns:
            raise ConfigError(f"--resume needs the id column {id_column!r} in output.columns")
        if retry_errors and columns and "error" not in columns:
            raise ConfigError("--retry-errors needs the 'error' column in output.columns")
        if fmt != "jsonl":
            raise ConfigError(f"--resume appends to a .jsonl output; {path} is {fmt}")
        from relayllm.resume import drop_error_rows, jsonl_ids

        done = jsonl_ids(path, id_column)  # first: it also trims a line cut short by a kill
        if retry_errors:
            drop_error_rows(path)
            done = jsonl_ids(path, id_column)
    try:  # created now, so an unwritable path fails before any engine starts
        return RowWriter(path, fmt, columns, append=resume), path, done
    except OSError as exc:
        raise ConfigError(f"cannot write the output {path}: {exc.strerror or exc}") from None


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
    return (
        f"\n{text}{where}\n(tokens/s counts output tokens; a step's wall time runs from its "
        f"first row to its last; start-up is connecting, deploying and engines starting; "
        f"total is the whole command)"
    )
