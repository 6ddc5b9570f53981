"""``relayllm batch INPUT.jsonl``: an OpenAI Batch API file, run on any relayllm backend."""

from __future__ import annotations

import contextlib
import json
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import click

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
from relayllm.errors import ConfigError, DeploymentNotFoundError


@click.command()
@click.argument("input_file", metavar="INPUT.jsonl", type=click.Path(dir_okay=False))
@click.option("--deployment", metavar="NAME", help="A running deployment to send the requests to.")
@click.option(
    "--config",
    "config_file",
    metavar="PIPELINE.yaml",
    type=click.Path(dir_okay=False),
    help="Start (or reuse) the deployments this pipeline file declares and use them.",
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

    Supported urls: /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/score,
    /v1/rerank. Lines that cannot run (not JSON, no custom_id, another url...) go to the
    errors file with the reason; the rest run. A file with duplicate custom_ids is rejected
    before anything runs. A body's "model" that names a deployment routes the line there; a
    file that mixes model values that do not all name deployments is rejected. The file is
    read from disk in blocks and the response lines are written (in input order, per
    deployment) as their blocks finish, so a stopped batch keeps what it did: run it again
    with --resume. Prints OpenAI's request_counts for the whole file at the end; exits 0 when
    the batch ran, even if some lines failed (they are in the errors file).

    \b
    Examples:
      relayllm batch requests.jsonl --deployment smollm --output results.jsonl
      relayllm batch requests.jsonl --config examples/questions.yaml --output results.jsonl
      relayllm batch requests.jsonl --deployment smollm --output results.jsonl --resume
    """
    from relayllm.batch import run as batch_file

    if (deployment is None) == (config_file is None):
        fail("give exactly one of --deployment NAME or --config PIPELINE.yaml")
    if retry_errors and not resume:
        fail("--retry-errors goes with --resume: it runs the lines of the errors file again")
    errors_file = errors_file or _default_errors_path(output_file)
    check_writable(output_file)
    check_writable(errors_file)
    # Read (and a line cut short by a kill trimmed) before the input scan: it skips those.
    done = (
        batch_file.read_done(output_file, errors_file, retry_errors)
        if resume
        else batch_file.Done()
    )
    fields = {"batch_size": batch_size, "concurrency": concurrency}
    scan = batch_file.scan_batch_file(input_file, batch_file.stage_batch(batch_size), done)

    pipeline = None
    if config_file:
        from relayllm.pipelines import load_pipeline

        pipeline = load_pipeline(config_file)
        pipeline.check_backends()
        names = [d.name for d in pipeline.spec.deployments]
        default = names[0] if len(names) == 1 else None
        groups = batch_file.groups_of(scan, names, default)  # routing errors before the cluster
    console = Console()
    connect(address, verbose, console=console)
    if pipeline is None:
        import relayllm

        names = [r.name for r in relayllm.list_deployments(address=address)]
        if deployment not in names:
            raise DeploymentNotFoundError(not_running_advice(deployment, names, address))
        default = deployment
        groups = batch_file.groups_of(scan, names, default)
    if pipeline is not None:
        from relayllm.cli.run import ConsoleHooks
        from relayllm.pipelines import deployed

        hooks = ConsoleHooks(console, verbose)
        lifecycle: AbstractContextManager[Any] = deployed(
            pipeline, address=address, on_deploy=hooks.deploying
        )
    else:
        lifecycle = contextlib.nullcontext()
    mode = "a" if resume else "w"
    with lifecycle:
        try:
            with (
                open(output_file, mode, encoding="utf-8") as out,
                open(errors_file, mode, encoding="utf-8") as err,
            ):
                already = f" ({scan.already} already done)" if scan.already else ""
                console.say(
                    f"running {scan.to_run} requests on "
                    f"{', '.join(sorted({d for d, _ in groups}))}{already}"
                )
                counts_of = [sum(scan.key_lines[k] for k in keys) for keys in groups.values()]
                steps = [(f"{d}/{t}", d) for d, t in groups]
                with console.steps(steps, counts_of, sequential=True) if steps else _nothing():
                    counts = batch_file.run_scanned(scan, names, default, out, err, fields, done)
        except OSError as exc:
            raise ConfigError(f"cannot write {exc.filename}: {exc.strerror}") from None
    click.echo(
        f"{counts['completed']} completed -> {output_file}; "
        f"{counts['failed']} failed -> {errors_file}",
        err=True,
    )
    click.echo(json.dumps({"request_counts": counts}))


def _nothing() -> AbstractContextManager[Any]:
    return contextlib.nullcontext()


def _default_errors_path(output_file: str) -> str:
    path = Path(output_file)
    return str(path.with_name(path.name.removesuffix(".jsonl") + ".errors.jsonl"))
