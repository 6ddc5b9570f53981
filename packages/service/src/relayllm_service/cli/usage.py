"""``relayllm usage``: what each project used of the batch service, per time bucket, read from
its Usage API (``GET /v1/organization/usage/completions``) with the admin key, through the
``openai`` client as any other client reads it."""

from __future__ import annotations

import datetime
import json
import re
import time
from typing import Any

import click

from relayllm.cli.common import EXIT_BAD_INPUT, fail, table
from relayllm_service.cli.client import client, service_errors, service_options, when

_SINCE = re.compile(r"(\d+)([mhd])")
_UNIT_S = {"m": 60, "h": 3600, "d": 86400}
_COLUMNS = ("num_model_requests", "input_tokens", "input_cached_tokens", "output_tokens")


def _moment(value: str, option: str) -> int:
    """Unix seconds, or an ISO date or time (UTC unless it says otherwise)."""
    if value.isdigit():
        return int(value)
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError:
        fail(
            f"{option} {value!r}: give Unix seconds or an ISO date (2026-11-28, 2026-11-28T09:00)",
            EXIT_BAD_INPUT,
        )
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp())


@click.command()
@click.option(
    "--since",
    default="7d",
    show_default=True,
    metavar="AGE",
    help="Start this long ago: a number and m, h or d (ignored with --start).",
)
@click.option("--start", metavar="TIME", help="Start here: Unix seconds or an ISO date (UTC).")
@click.option("--end", metavar="TIME", help="End here (excluded); default: now.")
@click.option(
    "--bucket",
    "bucket_width",
    type=click.Choice(["1m", "1h", "1d"]),
    default="1d",
    show_default=True,
    help="Width of each time bucket.",
)
@click.option(
    "--group-by",
    "group_by",
    multiple=True,
    type=click.Choice(["project_id", "model", "batch"]),
    help="Split each bucket by these (repeat the option); default: project_id and model.",
)
@click.option("--project", "projects", multiple=True, metavar="NAME", help="Only this project.")
@click.option("--model", "models", multiple=True, metavar="NAME", help="Only this deployment.")
@service_options
@service_errors
def usage(since, start, end, bucket_width, group_by, projects, models, base_url, api_key, as_json):
    """What each project used of the batch service (`relayllm serve`): requests, input
    tokens, cached input tokens, output tokens and engine seconds (each answer's share of its
    replica's busy time) of its batch lines and its online requests, per time bucket, project
    and deployment. Read with the admin key (RELAYLLM_ADMIN_KEY where
    the service runs); empty buckets are left out of the table.

    \b
    Examples:
      relayllm usage --since 24h --bucket 1h
      relayllm usage --start 2026-11-01 --group-by project_id --json
    """
    now = int(time.time())
    if start is not None:
        begin = _moment(start, "--start")
    else:
        found = _SINCE.fullmatch(since)
        if found is None:
            fail(f"--since {since!r}: give a number and m, h or d (30m, 24h, 7d)", EXIT_BAD_INPUT)
        assert found is not None
        begin = now - int(found.group(1)) * _UNIT_S[found.group(2)]
    # Through the current second (ends are excluded): what was recorded a moment ago is in.
    finish = now + 1 if end is None else _moment(end, "--end")
    groups = list(group_by) or ["project_id", "model"]
    params: dict[str, Any] = {
        "start_time": begin,
        "end_time": finish,
        "bucket_width": bucket_width,
        "group_by": groups,
    }
    if projects:
        params["project_ids"] = list(projects)
    if models:
        params["models"] = list(models)
    api = client(base_url, api_key)
    buckets: list[dict[str, Any]] = []
    while True:  # every page
        page = api.get(
            "/organization/usage/completions", cast_to=object, options={"params": params}
        )
        buckets.extend(page["data"])
        if not page.get("has_more"):
            break
        params["page"] = page["next_page"]
    if as_json:
        click.echo(json.dumps(buckets, indent=2))
        return
    headers = ["bucket", *groups, "requests", "input", "cached", "output", "engine_s"]
    rows = [
        [when(bucket["start_time"]), *(_shown(result.get(g)) for g in groups)]
        + [f"{result.get(column) or 0:,}" for column in _COLUMNS]
        + [f"{result.get('engine_s') or 0:,.3f}"]
        for bucket in buckets
        for result in bucket["results"]
    ]
    if not rows:
        click.echo(f"no usage from {when(begin)} to {when(finish)} (UTC)")
        return
    right = list(range(len(headers) - 5, len(headers)))
    click.echo(table(headers, rows, right=right))


def _shown(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "batch" if value else "online"
    return str(value)


__all__ = ["usage"]
