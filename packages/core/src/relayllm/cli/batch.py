"""``relayllm batch INPUT.jsonl``: an OpenAI Batch API file, run on any relayllm backend."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import click

from relayllm.batch.run import BatchPlan, BatchProgress, default_errors_path
from relayllm.cli.common import (
    address_option,
    check_writable,
    connect,
    fail,
    handle_errors,
    not_running_advice,
    verbose_option,
)
from relayllm.cli.progress import Console
from relayllm.errors import DeploymentNotFoundError

if TYPE_CHECKING:
    from relayllm.deployments import DeploymentConfig


@click.command()
@click.argument("input_file", metavar="INPUT.jsonl", type=click.Path(dir_okay=False))
@click.option("--deployment", metavar="NAME", help="A running deployment to send the requests to.")
@click.option(
    "--config",
    "config_file",
    metavar="DEPLOYMENTS.yaml",
    type=click.Path(dir_okay=False),
    help="Start (or reuse) the deployments this file declares (a pipeline file, or one with "
    "only deployments:) and use them; the ones this run started stop at its end.",
)
@click.option(
    "--output",
    "output_file",
    metavar="OUT.jsonl",
    required=True,
    type=click.Path(dir_okay=False),
    help="Where the response lines go.",
)
@click.option(
    "--errors",
    "errors_file",
    metavar="ERR.jsonl",
    type=click.Path(dir_okay=False),
    help="Where failed lines go, each with its reason (default: OUT.errors.jsonl).",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="Requests per call to the deployment.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Stage actors sending requests at once (the processor's concurrency).",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Keep the lines already in OUT.jsonl and the errors file, run only the others (by "
    "custom_id), and append; for a batch that was stopped or killed.",
)
@click.option(
    "--retry-errors",
    is_flag=True,
    help="With --resume: also run again the lines in the errors file (it is emptied first).",
)
@address_option
@verbose_option
@handle_errors
def batch(
    input_file,
    deployment,
    config_file,
    output_file,
    errors_file,
    batch_size,
    concurrency,
    resume,
    retry_errors,
    address,
    verbose,
):
    """Run an OpenAI Batch API input file (custom_id, method, url, body per line).

    Supported urls: /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses
    (text in, text out), /v1/score, /v1/rerank. Lines that cannot run (not JSON, no
    custom_id, another url...) go to the errors file with the reason; the rest run. A file
    with duplicate custom_ids is rejected before anything runs. A body's "model" that names a
    deployment routes the line there; a file that mixes model values that do not all name
    deployments is rejected. The file is read from disk in blocks and the response lines are
    written (in input order, per deployment) as their blocks finish, so a stopped batch keeps
    what it did: run it again with --resume. Prints OpenAI's request_counts for the whole
    file at the end; exits 0 when the batch ran, even if some lines failed (they are in the
    errors file; none is written when nothing failed).

    \b
    Examples:
      relayllm batch requests.jsonl --deployment smollm --output results.jsonl
      relayllm batch requests.jsonl --config examples/questions.yaml --output results.jsonl
      relayllm batch requests.jsonl --deployment smollm --output results.jsonl --resume
    """
    from relayllm.batch.run import run_batch_file

    if (deployment is None) == (config_file is None):
        fail("give exactly one of --deployment NAME or --config PIPELINE.yaml")
    if retry_errors and not resume:
        fail("--retry-errors goes with --resume: it runs the lines of the errors file again")
    errors_file = errors_file or default_errors_path(output_file)
    check_writable(output_file)
    check_writable(errors_file)
    progress = _ConsoleBatchProgress(Console(), verbose)
    try:
        counts = run_batch_file(
            input_file,
            deployment=deployment,
            pipeline=config_file,
            output=output_file,
            errors=errors_file,
            resume=resume,
            retry_errors=retry_errors,
            batch_size=batch_size,
            concurrency=concurrency,
            address=address,
            progress=progress,
        )
    except DeploymentNotFoundError:
        if deployment is None:
            raise
        import relayllm

        running = [r.name for r in relayllm.list_deployments(address=address)]
        raise DeploymentNotFoundError(not_running_advice(deployment, running, address)) from None
    if not counts.failed and _empty(counts.errors):
        os.remove(counts.errors)  # as OpenAI's Batch API: no error file when nothing failed
        failed = "0 failed"
    else:
        failed = f"{counts.failed} failed -> {counts.errors}"
    click.echo(f"{counts.completed} completed -> {counts.output}; {failed}", err=True)
    for name, used in sorted(counts.tokens.items()):
        prompt, completion = used.get("prompt_tokens", 0), used.get("completion_tokens", 0)
        click.echo(f"{name}: {prompt:,} prompt + {completion:,} completion tokens", err=True)
    if progress.engines:
        click.echo(progress.engines, err=True)
    click.echo(json.dumps({"request_counts": counts.request_counts()}))


def _empty(path: str) -> bool:
    return os.path.isfile(path) and os.path.getsize(path) == 0


class _ConsoleBatchProgress(BatchProgress):
    """The batch's progress on the console: connecting, each engine starting, a bar per group."""

    def __init__(self, console: Console, verbose: bool) -> None:
        from relayllm.cli.run import ConsoleProgress

        self.console, self.verbose = console, verbose
        self.engine_starts = ConsoleProgress(console, verbose)  # engines start as a run's do
        self.engines = ""  # the run's prefix-cache figures, by deployment (when reported)

    def connect(self, address: str | None) -> None:
        connect(address, self.verbose, console=self.console)

    def deploying(self, config: DeploymentConfig, running: bool) -> AbstractContextManager[Any]:
        return self.engine_starts.deploying(config, running)

    @contextlib.contextmanager
    def running(self, plan: BatchPlan) -> Iterator[None]:
        already = f" ({plan.already_done} already done)" if plan.already_done else ""
        on = ", ".join(sorted({d for d, _, _ in plan.groups}))
        self.console.say(f"running {plan.to_run} requests on {on}{already}")
        steps = [(f"{d}/{t}", d) for d, t, _ in plan.groups]
        if not steps:
            yield
            return
        from relayllm.pipelines import engine_figures

        names = [d for d, _, _ in plan.groups]
        costs = engine_figures.hour_costs()  # a bad price fails before the run, not after
        before = engine_figures.snapshot(names)  # the engines' own counters
        with self.console.steps(steps, [n for _, _, n in plan.groups], sequential=True):
            yield
        figures = engine_figures.delta(before, engine_figures.snapshot(names), costs)
        self.engines = engine_figures.summary_lines(figures, {})
