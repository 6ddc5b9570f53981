"""``relayllm batch INPUT.jsonl``: an OpenAI Batch API file, run on any relayllm backend."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
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
@address_option
@verbose_option
@handle_errors
def batch(
    input_file, deployment, config_file, output_file, errors_file, batch_size, address, verbose
):
    """Run an OpenAI Batch API input file (custom_id, method, url, body per line).

    Supported urls: /v1/chat/completions, /v1/completions, /v1/embeddings. Lines that cannot
    run (not JSON, no custom_id, another url...) go to the errors file with the reason; the
    rest run. A file with duplicate custom_ids is rejected before anything runs. A body's
    "model" that names a deployment routes the line there; a file that mixes model values
    that do not all name deployments is rejected. Prints OpenAI's request_counts at the end;
    exits 0 when the batch ran, even if some lines failed (they are in the errors file).

    \b
    Examples:
      relayllm batch requests.jsonl --deployment smollm --output results.jsonl
      relayllm batch requests.jsonl --config examples/questions.yaml --output results.jsonl
    """
    from relayllm import batch_api

    if (deployment is None) == (config_file is None):
        fail("give exactly one of --deployment NAME or --config PIPELINE.yaml")
    parsed = batch_api.read_batch_file(input_file)
    errors_file = errors_file or _default_errors_path(output_file)
    check_writable(output_file)
    check_writable(errors_file)

    pipeline = None
    if config_file:
        from relayllm.pipelines import load_pipeline

        pipeline = load_pipeline(config_file)
        pipeline.check_backends()
        names = [d.name for d in pipeline.spec.deployments]
        default = names[0] if len(names) == 1 else None
        routes = batch_api.route(parsed.requests, names, default)
    console = Console()
    connect(address, verbose, console=console)
    if pipeline is None:
        import relayllm

        running = [r.name for r in relayllm.list_deployments(address=address)]
        if deployment not in running:
            raise DeploymentNotFoundError(not_running_advice(deployment, running, address))
        names = [r.name for r in relayllm.list_deployments(address=address)]
        routes = batch_api.route(parsed.requests, names, deployment)
    if pipeline is not None:
        from relayllm.cli.run import ConsoleHooks
        from relayllm.pipelines import deployed

        hooks = ConsoleHooks(console, verbose)
        lifecycle: AbstractContextManager[Any] = deployed(
            pipeline, address=address, on_deploy=hooks.deploying
        )
    else:
        lifecycle = contextlib.nullcontext()
    with lifecycle:
        try:
            with (
                open(output_file, "w", encoding="utf-8") as out,
                open(errors_file, "w", encoding="utf-8") as err,
            ):
                # One processor per (deployment, task) group, run one after another.
                groups = Counter((routes[r.line], r.task) for r in parsed.requests)  # its order
                console.say(
                    f"running {len(parsed.requests)} requests on "
                    f"{', '.join(sorted({d for d, _ in groups}))}"
                )
                with console.steps(
                    [(f"{d}/{t}", d) for d, t in groups], list(groups.values()), sequential=True
                ):
                    counts = batch_api.run_batch(
                        parsed, routes, out, err, {"batch_size": batch_size}
                    )
        except OSError as exc:
            raise ConfigError(f"cannot write {exc.filename}: {exc.strerror}") from None
    click.echo(
        f"{counts['completed']} completed -> {output_file}; "
        f"{counts['failed']} failed -> {errors_file}",
        err=True,
    )
    click.echo(json.dumps({"request_counts": counts}))


def _default_errors_path(output_file: str) -> str:
    path = Path(output_file)
    return str(path.with_name(path.name.removesuffix(".jsonl") + ".errors.jsonl"))
