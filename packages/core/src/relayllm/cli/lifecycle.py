"""``relayllm deploy / status / shutdown``: long-lived shared deployments on a Ray cluster.

They need a cluster that outlives the command (``ray start --head``, then ``--address`` or
``RAY_ADDRESS``): later ``run``/``batch`` commands and any other driver find them by name.
"""

from __future__ import annotations

from typing import Any

import click

from relayllm.cli.common import (
    attach_address_option,
    connect,
    handle_errors,
    table,
    verbose_option,
    warn_unsupported_versions,
)


@click.command()
@click.argument("pipeline_file", metavar="FILE.yaml", type=click.Path(dir_okay=False))
@click.option(
    "--only",
    "only",
    multiple=True,
    metavar="NAME",
    help="Deploy only this deployment (repeatable).",
)
@attach_address_option
@verbose_option
@handle_errors
def deploy(pipeline_file, only, address, verbose):
    """Start the deployments FILE.yaml declares (a pipeline file, or one with only
    deployments:), and leave them running.

    A deployment already running with the same name and config is reused; the same name with
    another config is an error that shows the difference.

    \b
    Example:
      ray start --head
      relayllm deploy examples/questions.yaml   # the cluster above, its Ray token sent
    """
    import relayllm
    from relayllm.cli.check import load_declared
    from relayllm.cli.run import engine_ready_line
    from relayllm.errors import ConfigError

    declared, _ = load_declared(pipeline_file, inputs=False)
    names = declared.names
    unknown = sorted(set(only) - set(names))
    if unknown:
        raise ConfigError(
            f"--only {', '.join(unknown)}: not declared in {pipeline_file} "
            f"(declared: {', '.join(names)})"
        )
    connect(address, verbose, existing_cluster=True)
    for config in declared.deployments:
        if only and config.name not in only:
            continue
        ref = relayllm.deploy(config, address=address)
        click.echo(f"{ref.name}: {ref.status or 'RUNNING'} (backend {config.backend})")
        said = engine_ready_line(ref.name)
        if said:
            click.echo(said)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@attach_address_option
@verbose_option
@handle_errors
def status(as_json, address, verbose):
    """List the relayllm deployments running on the cluster, with their engine's facts and
    the URL of their OpenAI-compatible HTTP front (deployments with an http section), then
    their metrics: time to first token, time per output token and request latency (p50),
    queue (waiting/running), KV-cache use, prefix-cache hit rate, rows by traffic class
    ("-": the backend does not report it); then every replica of each deployment: its
    node (IP and Ray node id), activity, rows, queue and prefix-cache hit rate (--json: each
    deployment's "replicas").

    A deployment with calls in progress and no answer for $RELAYLLM_STALL_WARNING_S
    seconds (default 300) is shown as STALLED, with how long it has been silent. The batch
    service's gateways (`relayllm serve`, when its package is installed) follow: base URL and
    batches not finished. With --json, one list whose items say "kind": "deployment" or
    "gateway". It only reads: it starts nothing on the cluster.

    \b
    Examples:
      relayllm status
      relayllm status --json --address 127.0.0.1:6379
    """
    import json

    import relayllm
    from relayllm import env

    warn_unsupported_versions()
    connect(address, verbose, existing_cluster=True, start_serve=False)  # it only reads
    stall_s = env.STALL_WARNING_S.get()
    found = [_deployment_item(ref, stall_s) for ref in relayllm.list_deployments(address=address)]
    sections = _plugin_sections(address)
    if as_json:
        click.echo(json.dumps(found + [i for s in sections for i in s.items], indent=2))
        return
    if not found:
        click.echo("no relayllm deployments are running")
    else:
        _print_deployments(found)
    for section in sections:
        if section.items:
            rows = [[i.get(c) for c in section.columns] for i in section.items]
            click.echo()
            click.echo(f"{section.title}:")
            click.echo(table(section.columns, rows, right=section.right))


def _deployment_item(ref: Any, stall_s: float) -> dict[str, Any]:
    """What ``relayllm status`` says of one deployment: its replicas' facts, read from each
    replica, or why they could not be read."""
    import relayllm

    item: dict[str, Any] = {
        "kind": "deployment",  # a plugin's items say their own kind ("gateway")
        "name": ref.name,
        "status": ref.status,
        "backend": None,
        "model": None,
        "activity": None,
        "replica": None,
        "rows": None,
        "url": None,
    }
    if ref.status != "RUNNING":
        return item
    try:
        # Asked of a replica directly: a handle's call would wait in Serve's queue behind the
        # batch calls a paused deployment holds.
        infos = list(relayllm.control(ref.name).replicas(timeout_s=30).values())
        info = infos[0]
        item.update(
            backend=info.get("backend"),
            model=info.get("model"),
            activity=activity(info, stall_s),
            replica=info.get("replica_id"),
            rows=sum(i.get("rows") or 0 for i in infos),
            url=(info.get("http") or {}).get("url"),
            ongoing=info.get("ongoing"),
            seconds_without_answer=info.get("seconds_without_answer"),
            metrics=info.get("metrics"),
            replicas=[replica_item(i, stall_s) for i in infos],
        )
    except Exception as exc:  # a sick deployment is still listed, with the reason
        item["status"] = f"{ref.status} (info failed: {type(exc).__name__})"
    return item


def _print_deployments(found: list[dict[str, Any]]) -> None:
    """The deployments' tables (each, its metrics, its replicas) and a warning per stall."""
    from relayllm.cli.progress import elapsed

    keys = ["name", "status", "backend", "model", "activity", "replica", "rows", "url"]
    click.echo(table(keys, [[f.get(k) for k in keys] for f in found], right=[6]))
    measured = [[f["name"], *metrics_cells(f["metrics"])] for f in found if f.get("metrics")]
    if measured:
        click.echo()
        click.echo(table(METRICS_COLUMNS, measured, right=range(1, len(METRICS_COLUMNS))))
    replicas = [[f["name"], *replica_cells(r)] for f in found for r in f.get("replicas", [])]
    if replicas:
        click.echo()
        click.echo(table(REPLICA_COLUMNS, replicas, right=range(3, len(REPLICA_COLUMNS))))
    for f in found:
        if f["activity"] == "STALLED":
            click.echo(
                f"warning: {f['name']}: {f['ongoing']} call(s) in progress and no answer "
                f"for {elapsed(f['seconds_without_answer'])}; its engine may be hung or "
                f"overloaded (see the replica's log; `relayllm shutdown {f['name']}` and "
                f"deploy again to restart it)",
                err=True,
            )


#: How long ``relayllm status`` gives each plugin's section (a gateway describing itself,
#: say): a sick one is listed with its Serve status, and the next one asked.
SECTION_TIMEOUT_S = 5.0


def _plugin_sections(address: str | None) -> list[Any]:
    """What installed packages add to ``relayllm status`` after the deployments (the batch
    service adds its gateways), through the ``relayllm_status_sections`` hook."""
    from relayllm.plugin.manager import get_manager

    found = get_manager().hook.relayllm_status_sections(
        address=address, timeout_s=SECTION_TIMEOUT_S
    )
    return [section for sections in found for section in sections or ()]


#: The metrics table of ``relayllm status`` (one word per heading: scripts split the lines).
METRICS_COLUMNS = [
    "name",
    "ttft_p50",
    "tpot_p50",
    "latency_p50",
    "queue",
    "kv_cache",
    "prefix_hit",
    "batch_rows",
    "interactive_rows",
]


def metrics_cells(metrics: dict[str, Any]) -> list[str]:
    """A replica's ``info()["metrics"]`` as the status table's cells ("-": not reported)."""

    def seconds(latency: dict[str, Any] | None) -> str:
        if not latency:
            return "-"
        p50 = latency["p50"]
        return f"{p50 * 1000:.0f}ms" if p50 < 1 else f"{p50:.1f}s"

    def share(value: float | None) -> str:
        return "-" if value is None else f"{value * 100:.0f}%"

    queue = metrics.get("queue")
    rows = metrics.get("rows_by_class") or {}
    return [
        seconds(metrics.get("ttft_s")),
        seconds(metrics.get("tpot_s")),
        seconds(metrics.get("latency_s")),
        "-" if not queue else f"{queue['waiting']}/{queue['running']}",
        share(metrics.get("kv_cache_use")),
        share(metrics.get("prefix_cache_hit_rate")),
        str(rows.get("batch", 0)),
        str(rows.get("interactive", 0)),
    ]


#: The replicas table of ``relayllm status``: every replica of every deployment.
REPLICA_COLUMNS = ["name", "replica", "node", "activity", "rows", "queue", "prefix_hit"]


def replica_item(info: dict[str, Any], stall_s: float) -> dict[str, Any]:
    """One replica of a deployment as ``relayllm status --json`` lists it."""
    metrics = info.get("metrics") or {}
    return {
        "replica": info.get("replica_id"),
        "node_id": info.get("node_id"),
        "node_ip": info.get("node_ip"),
        "activity": activity(info, stall_s),
        "rows": info.get("rows"),
        "ongoing": info.get("ongoing"),
        "queue": metrics.get("queue"),
        "prefix_cache_hit_rate": metrics.get("prefix_cache_hit_rate"),
        "prefix_cache_queries": metrics.get("prefix_cache_queries"),
        "prefilled_tokens": (metrics.get("engine_step_tokens") or {}).get("prefilled"),
    }


def replica_cells(replica: dict[str, Any]) -> list[str]:
    """A replica's row of the replicas table (node: its IP and the start of its Ray id)."""
    queue = replica.get("queue")
    rate = replica.get("prefix_cache_hit_rate")
    node = f"{replica.get('node_ip') or '?'} ({(replica.get('node_id') or '?')[:8]})"
    return [
        str(replica.get("replica")),
        node,
        str(replica.get("activity")),
        str(replica.get("rows")),
        "-" if not queue else f"{queue['waiting']}/{queue['running']}",
        "-" if rate is None else f"{rate * 100:.0f}%",
    ]


def activity(info: dict, stall_s: float) -> str:
    """idle (no calls), busy (calls, answers coming), STALLED (calls, no answer for
    ``stall_s``) or paused (relayllm pause) -- from a replica's ``info()``."""
    if info.get("paused"):
        return f"paused ({info['paused']})"
    if not info.get("ongoing"):
        return "idle"
    silent = info.get("seconds_without_answer")
    return "STALLED" if silent is not None and silent >= stall_s else "busy"


@click.command()
@click.argument("name", required=False)
@click.option(
    "--gateways",
    is_flag=True,
    help="Deprecated: `relayllm unserve` (the batch service's package) stops the gateways.",
)
@attach_address_option
@verbose_option
@handle_errors
def shutdown(name, gateways, address, verbose):
    """Stop the deployment NAME, or every relayllm deployment when NAME is omitted. The batch
    service's gateways are stopped by `relayllm unserve`.

    \b
    Examples:
      relayllm shutdown smollm
      relayllm shutdown
    """
    import relayllm

    if gateways:  # kept for one release: runs `relayllm unserve`, with a warning
        ctx = click.get_current_context()
        unserve = ctx.find_root().command.get_command(ctx, "unserve")  # type: ignore[attr-defined]
        click.echo(
            "warning: `relayllm shutdown --gateways` is deprecated: use `relayllm unserve`",
            err=True,
        )
        ctx.invoke(unserve, name=name, keep_runner=False, address=address, verbose=verbose)
        return
    # Nothing to stop where Serve does not run: it is not started to find that out.
    connect(address, verbose, existing_cluster=True, start_serve=False)
    stopped = relayllm.shutdown(name, address=address)
    click.echo(
        f"stopped: {', '.join(stopped)}" if stopped else "no relayllm deployments were running"
    )
