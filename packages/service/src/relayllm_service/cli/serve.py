"""``relayllm serve FILE.yaml``: the OpenAI Batch API (and the online endpoints) on the
cluster's Serve HTTP proxy, on the deployments the file declares."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from relayllm import env
from relayllm.cli.common import attach_address_option, connect, handle_errors, verbose_option

if TYPE_CHECKING:
    from relayllm_service.deploy import GatewayRef
    from relayllm_service.settings import ServiceSettings


def _field(name: str, *flag: str, **extra: Any) -> Callable[[Any], Any]:
    """An option for the ServiceSettings field ``name``: its default and help from the model
    (one place states them); ``flag``: another option name than the field's."""
    from relayllm_service.settings import ServiceSettings

    field = ServiceSettings.model_fields[name]
    options: dict[str, Any] = {"help": field.description}
    if field.default is not None and field.default_factory is None:
        options.update(default=field.default, show_default=True)
    options.update(extra)
    return click.option(*(flag or (f"--{name.replace('_', '-')}",)), name, **options)


class PortOrOff(click.ParamType):
    """A port number (0: any free one) or ``off``."""

    name = "PORT|off"

    def convert(self, value: Any, param: Any, ctx: Any) -> int | None:
        if value is None or str(value).lower() == "off":
            return None
        try:
            port = int(value)
        except (TypeError, ValueError):
            port = -1
        if not 0 <= port <= 65535:
            self.fail(f"{value!r} is not a port (0-65535) or 'off'", param, ctx)
        return port


#: What a ``--node-resource NAME`` without an amount asks for: a sliver, so the gateway and
#: the runner fit together on a node started with one unit of it.
NODE_RESOURCE_AMOUNT = 0.01


class NodeResource(click.ParamType):
    """``NAME`` or ``NAME=AMOUNT`` (a positive number; default :data:`NODE_RESOURCE_AMOUNT`)."""

    name = "NAME[=AMOUNT]"

    def convert(self, value: Any, param: Any, ctx: Any) -> tuple[str, float]:
        if isinstance(value, tuple):
            return value
        name, sep, amount = str(value).partition("=")
        try:
            number = float(amount) if sep else NODE_RESOURCE_AMOUNT
        except ValueError:
            number = 0.0
        if not name.strip() or not number > 0:
            self.fail(f"{value!r} is not NAME or NAME=AMOUNT with AMOUNT above 0", param, ctx)
        return name.strip(), number


@click.command()
@click.argument("config_file", metavar="FILE.yaml", type=click.Path(dir_okay=False))
@_field("host")
@_field("port", type=click.IntRange(1, 65535))
@_field(
    "direct_port",
    type=PortOrOff(),
    metavar="PORT|off",
    # The settings field's own text speaks Python (None); this is the flag's.
    help="Port of the gateway's own HTTP server on --host, beside Serve's proxy: the same "
    "API, the base URL given to clients, and where files of any size pass in flat memory "
    "(Serve's proxy holds a file's body in memory). 0: any free port; off: only Serve's "
    "proxy.",
)
@_field(
    "state_dir",
    metavar="DIR",
    envvar=env.STATE_DIR.name,
    help="The job store and the runner's work files, on the disk of the node the gateway "
    "and the runner run on: the head node's, or with --node-resource a path every such node "
    f"reaches (default also from ${env.STATE_DIR.name}).",
)
@_field(
    "node_resources",
    "--node-resource",
    type=NodeResource(),
    multiple=True,
    metavar="NAME[=AMOUNT]",
    help="Run the gateway and the runner on the nodes that offer this custom Ray resource "
    "(`ray start --resources '{\"service\": 1}'`; repeat for several; AMOUNT: what each "
    f"asks for, default {NODE_RESOURCE_AMOUNT}) instead of the head node: when their node "
    "is lost, they start again on another such node (one that joins later included) and "
    "the runner resumes its batches there. The deployments are placed by the file "
    "(placement.node_resources).",
)
@_field(
    "store",
    metavar="PATH|URL",
    envvar=env.STORE.name,
    help="The job store: an SQLite file (default: STATE_DIR/jobs.sqlite) or a "
    "postgresql://user:password@host:port/database URL, which gateways and runners on hosts "
    "with no shared disk all reach (pip install 'relayllm-service[postgresql]'); also "
    f"${env.STORE.name}, which keeps the password out of the command line.",
)
@_field(
    "files",
    metavar="DIR|URI",
    help="Where file bytes live: a directory or a pyarrow.fs URI such as s3://bucket/prefix "
    "(default: STATE_DIR/files).",
)
@click.option(
    "--keys-file",
    metavar="PATH",
    type=click.Path(dir_okay=False),
    help="API keys, one PROJECT=KEY per line (also $RELAYLLM_API_KEYS_FILE; "
    "$RELAYLLM_API_KEYS takes PROJECT=KEY,...), read again whenever it changes: add, rotate "
    "or remove a key there without a restart. The operator's admin key, which sees every "
    "project's batches and files, comes from $RELAYLLM_ADMIN_KEY.",
)
@click.option(
    "--no-keys-project",
    metavar="PROJECT",
    help="Take requests without a key, as this project (a server for one trusted user).",
)
@click.option(
    "--quotas",
    "quotas_file",
    metavar="PATH",
    envvar=env.QUOTAS_FILE.name,
    type=click.Path(dir_okay=False),
    help="Limits per project, a YAML file of PROJECT: {stored_bytes, files, batches, "
    "enqueued_tokens: {DEPLOYMENT: N}, requests_per_minute, weight} ('*': every other "
    "project; weight: its share "
    "of the batch lines written, default 1); also $RELAYLLM_QUOTAS_FILE; read again whenever it "
    "changes. Default: none.",
)
@_field(
    "window_s",
    type=click.IntRange(min=1),
    help="Enforce this completion window in seconds instead of 24h.",
)
@_field(
    "output_expires_s",
    type=click.IntRange(min=1),
    help="Batches' output and error files expire this many seconds after they are written "
    "unless a batch asks otherwise (default: kept until deleted).",
)
@_field("batch_size", type=click.IntRange(min=1))
@_field("concurrency", type=click.IntRange(min=1))
@_field("max_batches", type=click.IntRange(min=1))
@_field(
    "image_hosts",
    "--image-host",
    multiple=True,
    metavar="HOST",
    help="A host whose http(s) image URLs batch lines may name (repeat it; '*': any). "
    "Default: none, only data: URLs.",
)
@_field("turn_s", type=click.FloatRange(min=0, min_open=True))
@_field("turn_lines", type=click.IntRange(min=1))
@_field("record_usage", "--record-usage/--no-record-usage")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print what was started as one JSON object (deployments, gateway, URLs) instead of lines.",
)
@attach_address_option
@verbose_option
@handle_errors
def serve(
    config_file,
    keys_file,
    no_keys_project,
    quotas_file,
    as_json,
    address,
    verbose,
    **fields,
):
    """Serve OpenAI's Batch API (/v1/files, /v1/batches) and the online endpoints
    (/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models, routed by the body's
    model) on the deployments FILE.yaml declares, and print the base URL.

    The deployments (reused if running) and one gateway start on a running cluster's Serve
    HTTP proxy and stay up after this command returns (`relayllm status` shows them).
    Batches run at batch priority on the same deployments. After a runner's crash they
    resume with each line once (tested); after a cluster restart, serving again with the
    same --state-dir resumes them the same way (tested with every Ray process killed).

    \b
    Example:
      ray start --head
      export RELAYLLM_API_KEYS=team-a=$(openssl rand -hex 24)
      export RELAYLLM_ADMIN_KEY=$(openssl rand -hex 24)   # optional: the operator's
      relayllm serve examples/questions.yaml   # the cluster above, its Ray token sent
      # then: OpenAI(base_url="http://127.0.0.1:8001/v1", api_key=THE_KEY)
      relayllm unserve                         # stops the gateway (the deployments stay)
      relayllm serve examples/questions.yaml --json | jq -r .base_url
    """
    from relayllm_service.deploy import serve_file
    from relayllm_service.settings import ServiceSettings
    from relayllm_service.tenancy.projects import service_keys
    from relayllm_service.tenancy.quotas import read_quotas

    keys = service_keys(path=keys_file, anonymous=no_keys_project)  # before the cluster
    # Every other option is a ServiceSettings field of the same name (see _field).
    fields.update(
        node_resources=dict(fields["node_resources"]) or None,
        image_hosts=list(fields["image_hosts"]),
    )
    settings = ServiceSettings(**fields, quotas=read_quotas(quotas_file), quotas_file=quotas_file)
    connect(address, verbose, existing_cluster=True)

    deployments: dict[str, str] = {}

    def deployed(name: str, status: str) -> None:
        deployments[name] = status
        if not as_json:
            click.echo(f"{name}: {status}")

    gateway = serve_file(config_file, settings, keys, address=address, on_deploy=deployed)
    _print_started(gateway, deployments, settings, len(keys), as_json)


def _print_started(
    gateway: GatewayRef,
    deployments: dict[str, str],
    settings: ServiceSettings,
    key_count: int,
    as_json: bool,
) -> None:
    """What ``relayllm serve`` started: one JSON object, or the lines a person reads."""
    if as_json:
        import json

        found = {
            "deployments": deployments,
            "gateway": {"name": gateway.name, "status": gateway.status, "api_keys": key_count},
            "state_dir": str(settings.state_dir),
            "base_url": gateway.url,
            "proxy_url": gateway.proxy_url,
        }
        click.echo(json.dumps(found, indent=2))
        return
    click.echo(f"gateway: {gateway.status} ({key_count} API keys, state in {settings.state_dir})")
    click.echo(f"base URL: {gateway.url}")
    if gateway.proxy_url and gateway.proxy_url != gateway.url:
        click.echo(f"also through Serve's proxy: {gateway.proxy_url}")


@click.command()
@click.argument("name", required=False)
@click.option(
    "--keep-runner",
    is_flag=True,
    help="Leave the runner running (it keeps running the batches in progress, which another "
    "gateway on the same state then shows).",
)
@attach_address_option
@verbose_option
@handle_errors
def unserve(name, keep_runner, address, verbose):
    """Stop what `relayllm serve` started: the gateway NAME (every gateway when omitted) and
    the runners no remaining gateway uses. The deployments stay (`relayllm shutdown` stops
    them); unfinished batches wait in the state directory and resume when `relayllm serve`
    runs again on the same --state-dir. Same as `relayllm shutdown --gateways`.

    \b
    Examples:
      relayllm unserve
      relayllm unserve gateway --address 127.0.0.1:6379
    """
    from relayllm_service.deploy import shutdown_gateway

    # Nothing to stop where Serve does not run: it is not started to find that out.
    connect(address, verbose, existing_cluster=True, start_serve=False)
    stopped = shutdown_gateway(name, address=address, stop_runner=not keep_runner)
    click.echo(f"stopped: {', '.join(stopped)}" if stopped else "no gateways were running")
