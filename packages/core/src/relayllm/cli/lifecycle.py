"""``relayllm deploy / status / shutdown``: long-lived shared deployments on a Ray cluster.

They need a cluster that outlives the command (``ray start --head``, then ``--address`` or
``RAY_ADDRESS``): later ``run``/``batch`` commands and any other driver find them by name.
"""

from __future__ import annotations

import click

from relayllm.cli.common import (
    address_option,
    connect,
    handle_errors,
    table,
    verbose_option,
    warn_unsupported_versions,
)


@click.command()
@click.argument("pipeline_file", metavar="PIPELINE.yaml", type=click.Path(dir_okay=False))
@click.option(
    "--only",
    "only",
    multiple=True,
    metavar="NAME",
    help="Deploy only this deployment (repeatable).",
)
@address_option
@verbose_option
@handle_errors
def deploy(pipeline_file, only, address, verbose):
    """Start the deployments a pipeline file declares, and leave them running.

    A deployment already running with the same name and config is reused; the same name with
    another config is an error that shows the difference.

    \b
    Example:
      ray start --head
      relayllm deploy examples/questions.yaml --address 127.0.0.1:6379
    """
    import relayllm
    from relayllm.cli.run import engine_ready_line
    from relayllm.errors import ConfigError
    from relayllm.pipelines import load_pipeline

    pipeline = load_pipeline(pipeline_file)
    pipeline.check_backends()
    names = [d.name for d in pipeline.spec.deployments]
    unknown = sorted(set(only) - set(names))
    if unknown:
        raise ConfigError(
            f"--only {', '.join(unknown)}: not declared in {pipeline_file} "
            f"(declared: {', '.join(names)})"
        )
    connect(address, verbose, existing_cluster=True)
    for config in pipeline.spec.deployments:
        if only and config.name not in only:
            continue
        ref = relayllm.deploy(config, address=address)
        click.echo(f"{ref.name}: {ref.status or 'RUNNING'} (backend {config.backend})")
        said = engine_ready_line(ref.name)
        if said:
            click.echo(said)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@address_option
@verbose_option
@handle_errors
def status(as_json, address, verbose):
    """List the relayllm deployments running on the cluster, with their engine's facts and
    the URL of their OpenAI-compatible HTTP front (deployments with an http section)."""
    import json

    import relayllm

    warn_unsupported_versions()
    connect(address, verbose, existing_cluster=True)
    found = []
    for ref in relayllm.list_deployments(address=address):
        item = {
            "name": ref.name,
            "status": ref.status,
            "backend": None,
            "model": None,
            "replica": None,
            "rows": None,
            "url": None,
        }
        if ref.status == "RUNNING":
            try:
                info = ref.handle().info.remote().result(timeout_s=30)
                item.update(
                    backend=info.get("backend"),
                    model=info.get("model"),
                    replica=info.get("replica_id"),
                    rows=info.get("rows"),
                    url=(info.get("http") or {}).get("url"),
                )
            except Exception as exc:  # a sick deployment is still listed, with the reason
                item["status"] = f"{ref.status} (info failed: {type(exc).__name__})"
        found.append(item)
    if as_json:
        click.echo(json.dumps(found, indent=2))
    elif not found:
        click.echo("no relayllm deployments are running")
    else:
        keys = ["name", "status", "backend", "model", "replica", "rows", "url"]
        click.echo(table(keys, [[f[k] for k in keys] for f in found], right=[5]))


@click.command()
@click.argument("name", required=False)
@address_option
@verbose_option
@handle_errors
def shutdown(name, address, verbose):
    """Stop the deployment NAME, or every relayllm deployment when NAME is omitted."""
    import relayllm

    connect(address, verbose, existing_cluster=True)
    stopped = relayllm.shutdown(name, address=address)
    click.echo(
        f"stopped: {', '.join(stopped)}" if stopped else "no relayllm deployments were running"
    )
