"""``relayllm files list | show | delete``: the batch service's files (uploads, batches'
output and error files) as an operator sees them, through the ``openai`` client."""

from __future__ import annotations

from typing import Any

import click

from relayllm.cli.common import table
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
def files() -> None:
    """List, inspect and delete the batch service's files (`relayllm serve`): uploads
    (purpose batch) and batches' output and error files (batch_output), with a project's key
    (its files) or the admin key (every project's).

    The service's URL and key come from --base-url and --api-key, else $RELAYLLM_BASE_URL
    and $RELAYLLM_API_KEY (or OpenAI's $OPENAI_BASE_URL and $OPENAI_API_KEY).

    \b
    Examples:
      relayllm files list --purpose batch_output
      relayllm files delete file-0123abcd
    """


@files.command("list")
@click.option(
    "--purpose", metavar="PURPOSE", help="Only files of this purpose (batch, batch_output)."
)
@click.option(
    "--limit", type=click.IntRange(min=1), default=100, show_default=True, help="At most this many."
)
@service_options
@service_errors
def list_files(purpose, limit, base_url, api_key, as_json):
    """The newest files first: size, purpose, created and expiry time (UTC).

    \b
    Examples:
      relayllm files list
      relayllm files list --purpose batch --json
    """
    api = client(base_url, api_key)
    extra = {"purpose": purpose} if purpose else {}
    found = first(api.files.list(limit=min(limit, 10000), **extra), limit)
    if as_json:
        dump(found)
        return
    if not found:
        click.echo("no files")
        return
    with_project = any(project_of(f) is not None for f in found)
    headers = ["id", *(["project"] if with_project else []), "filename", "purpose", "bytes"]
    headers += ["created", "expires"]
    rows = [
        [
            f.id,
            *([project_of(f) or "-"] if with_project else []),
            f.filename,
            f.purpose,
            f"{f.bytes:,}",
            when(f.created_at),
            when(f.expires_at),
        ]
        for f in found
    ]
    click.echo(table(headers, rows, right=[headers.index("bytes")]))


@files.command("show")
@click.argument("file_id")
@service_options
@service_errors
def show_file(file_id, base_url, api_key, as_json):
    """One file's record (not its content: `relayllm batches download` writes a batch's).

    \b
    Example:
      relayllm files show file-0123abcd
    """
    found = client(base_url, api_key).files.retrieve(file_id)
    if as_json:
        dump(found)
        return
    fields: list[tuple[str, Any]] = [("id", found.id)]
    if project_of(found) is not None:
        fields.append(("project", project_of(found)))
    fields += [
        ("filename", found.filename),
        ("purpose", found.purpose),
        ("bytes", f"{found.bytes:,}"),
        ("created_at", when(found.created_at)),
        ("expires_at", when(found.expires_at)),
    ]
    for name, value in fields:
        click.echo(f"{name.ljust(10)}  {value}")


@files.command("delete")
@click.argument("file_id")
@service_options
@service_errors
def delete_file(file_id, base_url, api_key, as_json):
    """Delete a file: its record and its bytes (a batch that names it keeps the id).

    \b
    Example:
      relayllm files delete file-0123abcd
    """
    deleted = client(base_url, api_key).files.delete(file_id)
    if as_json:
        dump(deleted)
    else:
        click.echo(f"deleted: {deleted.id}")


__all__ = ["files"]
