"""``relayllm batches list | show | cancel | download``: an operator's view of the batch
service's batches, through the ``openai`` client (:mod:`relayllm_service.cli.client`)."""

from __future__ import annotations

import os
from typing import Any

import click

from relayllm.cli.common import EXIT_BAD_INPUT, fail, table
from relayllm_service.cli.client import (
    client,
    dump,
    first,
    project_of,
    service_errors,
    service_options,
    when,
)


@click.group()
def batches() -> None:
    """List, inspect, cancel and download the batch service's batches (`relayllm serve`),
    with a project's key (its batches) or the admin key (every project's).

    The service's URL and key come from --base-url and --api-key, else $RELAYLLM_BASE_URL
    and $RELAYLLM_API_KEY (or OpenAI's $OPENAI_BASE_URL and $OPENAI_API_KEY).

    \b
    Examples:
      export RELAYLLM_API_KEY=$RELAYLLM_ADMIN_KEY   # every project's batches
      relayllm batches list
      relayllm batches show batch_0123abcd
      relayllm batches download batch_0123abcd
    """


def progress(batch: Any) -> str:
    """Lines finished (answered or failed) of the batch's lines, as ``done/total``."""
    counts = batch.request_counts
    if counts is None:
        return "-"
    return f"{counts.completed + counts.failed}/{counts.total}"


def batch_rows(found: list[Any]) -> tuple[list[str], list[list[Any]], list[int]]:
    """The table of ``batches list``: a project column when the service names projects (the
    admin key's view)."""
    with_project = any(project_of(b) is not None for b in found)
    headers = ["id", *(["project"] if with_project else []), "status", "progress", "failed"]
    headers += ["created", "metadata"]
    rows = []
    for b in found:
        counts = b.request_counts
        metadata = ", ".join(f"{k}={v}" for k, v in (b.metadata or {}).items())
        rows.append(
            [
                b.id,
                *([project_of(b) or "-"] if with_project else []),
                b.status,
                progress(b),
                counts.failed if counts else "-",
                when(b.created_at),
                metadata[:40] + ("..." if len(metadata) > 40 else ""),
            ]
        )
    return headers, rows, [headers.index("progress"), headers.index("failed")]


@batches.command("list")
@click.option(
    "--limit", type=click.IntRange(min=1), default=20, show_default=True, help="At most this many."
)
@service_options
@service_errors
def list_batches(limit, base_url, api_key, as_json):
    """The newest batches first: status, progress (lines finished of all), failed lines,
    created (UTC) and metadata.

    \b
    Examples:
      relayllm batches list --limit 50
      relayllm batches list --json --base-url http://10.0.0.5:8001/v1
    """
    api = client(base_url, api_key)
    found = first(api.batches.list(limit=min(limit, 100)), limit)
    if as_json:
        dump(found)
    elif not found:
        click.echo("no batches")
    else:
        headers, rows, right = batch_rows(found)
        click.echo(table(headers, rows, right=right))


@batches.command("show")
@click.argument("batch_id")
@service_options
@service_errors
def show_batch(batch_id, base_url, api_key, as_json):
    """One batch: its status and times, request counts, files and errors.

    \b
    Example:
      relayllm batches show batch_0123abcd --json
    """
    batch = client(base_url, api_key).batches.retrieve(batch_id)
    if as_json:
        dump(batch)
        return
    describe(batch)


#: A batch's times, in the order they happen (``expires_at``: when its window ends).
STAMPS = (
    "created_at",
    "in_progress_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "cancelling_at",
    "cancelled_at",
    "expired_at",
    "expires_at",
)


def describe(batch: Any) -> None:
    counts = batch.request_counts
    fields: list[tuple[str, Any]] = [("id", batch.id)]
    if project_of(batch) is not None:
        fields.append(("project", project_of(batch)))
    fields += [
        ("status", batch.status),
        ("endpoint", batch.endpoint),
        ("progress", progress(batch)),
        ("completed", counts.completed if counts else "-"),
        ("failed", counts.failed if counts else "-"),
        ("input_file_id", batch.input_file_id),
        ("output_file_id", batch.output_file_id or "-"),
        ("error_file_id", batch.error_file_id or "-"),
    ]
    for stamp in STAMPS:
        moment = getattr(batch, stamp, None)
        if moment is not None:
            fields.append((stamp, when(moment)))
    for key, value in (batch.metadata or {}).items():
        fields.append((f"metadata.{key}", value))
    width = max(len(name) for name, _ in fields)
    for name, value in fields:
        click.echo(f"{name.ljust(width)}  {value}")
    for error in (batch.errors.data or []) if batch.errors else []:
        line = f" (line {error.line})" if error.line is not None else ""
        click.echo(f"error{line}: {error.code}: {error.message}")


@batches.command("cancel")
@click.argument("batch_id")
@service_options
@service_errors
def cancel_batch(batch_id, base_url, api_key, as_json):
    """Cancel a batch: the lines already sent to the engines finish, the others do not run;
    the finished lines stay in its output and error files. Cancelling a finished batch is
    refused.

    \b
    Example:
      relayllm batches cancel batch_0123abcd
    """
    batch = client(base_url, api_key).batches.cancel(batch_id)
    if as_json:
        dump(batch)
    else:
        click.echo(f"{batch.id}: {batch.status} ({progress(batch)} lines finished)")


@batches.command("download")
@click.argument("batch_id")
@click.option(
    "-o",
    "--output",
    metavar="PATH",
    help="Where the output file goes (default: BATCH_ID_output.jsonl here).",
)
@click.option(
    "--errors",
    metavar="PATH",
    help="Where the error file goes, if the batch has one (default: BATCH_ID_errors.jsonl).",
)
@service_options
@service_errors
def download_batch(batch_id, output, errors, base_url, api_key, as_json):
    """Download a finished batch's output file and error file (a cancelled or expired batch
    has the lines it finished). An existing file is not overwritten.

    \b
    Example:
      relayllm batches download batch_0123abcd -o answers.jsonl
    """
    api = client(base_url, api_key)
    batch = api.batches.retrieve(batch_id)
    wanted = [
        ("output", batch.output_file_id, output or f"{batch.id}_output.jsonl"),
        ("errors", batch.error_file_id, errors or f"{batch.id}_errors.jsonl"),
    ]
    if not any(file_id for _, file_id, _ in wanted):
        fail(
            f"batch {batch.id} is {batch.status} and has no output or error file yet (they are "
            "written when it ends)",
            EXIT_BAD_INPUT,
        )
    written: dict[str, Any] = {}
    for kind, file_id, path in wanted:
        if not file_id:
            continue
        if os.path.exists(path):
            fail(f"{path} exists; give another path (-o / --errors) or remove it", EXIT_BAD_INPUT)
        with api.files.with_streaming_response.content(file_id) as response:
            response.stream_to_file(path)
        written[kind] = {"file_id": file_id, "path": path, "bytes": os.path.getsize(path)}
    if as_json:
        import json

        click.echo(json.dumps({"id": batch.id, "status": batch.status, **written}, indent=2))
        return
    for kind, item in written.items():
        click.echo(f"{kind}: {item['path']} ({item['bytes']:,} bytes, {item['file_id']})")


__all__ = ["batches"]
