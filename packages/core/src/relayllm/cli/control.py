"""``relayllm pause / resume / control``: control calls on a running deployment, by name, on
every replica (:mod:`relayllm.serving.controller`). Like ``status``, they need a cluster that
outlives the command (``--address`` or ``RAY_ADDRESS``)."""

from __future__ import annotations

import json

import click

from relayllm.cli.common import attach_address_option, connect, handle_errors, verbose_option
from relayllm.serving.control_state import CONTROL_CALLS, PAUSE_MODES

#: ``relayllm control NAME CALL``: the calls that are not ``pause``/``resume``.
CALLS = tuple(c for c in CONTROL_CALLS if c not in ("pause", "resume"))


@click.command()
@click.argument("name")
@click.option(
    "--mode",
    type=click.Choice(PAUSE_MODES),
    default="wait",
    show_default=True,
    help="wait: the rows already in the engines finish first (the command returns once they "
    "have); keep: they stay frozen in the engines until resume.",
)
@attach_address_option
@verbose_option
@handle_errors
def pause(name, mode, address, verbose):
    """Pause the deployment NAME on every replica: batch rows wait (none fails) until
    `relayllm resume NAME`; HTTP requests get 503 with Retry-After. A replica that starts
    meanwhile comes up paused.

    \b
    Examples:
      relayllm pause smollm               # the rows in the engine finish first
      relayllm pause smollm --mode keep   # they stay in the engine until the resume
    """
    import relayllm

    connect(address, verbose, existing_cluster=True, start_serve=False)
    relayllm.control(name, address=address).pause(mode)
    click.echo(f"{name}: paused ({mode})")


@click.command()
@click.argument("name")
@attach_address_option
@verbose_option
@handle_errors
def resume(name, address, verbose):
    """Resume the paused deployment NAME on every replica.

    \b
    Example:
      relayllm resume smollm
    """
    import relayllm

    connect(address, verbose, existing_cluster=True, start_serve=False)
    relayllm.control(name, address=address).resume()
    click.echo(f"{name}: resumed")


@click.command("control")
@click.argument("name")
@click.argument("call", type=click.Choice(CALLS), metavar="CALL")
@click.argument("args", nargs=-1)
@attach_address_option
@verbose_option
@handle_errors
def control_command(name, call, args, address, verbose):
    """Run a control CALL on every replica of the deployment NAME and print its answer as
    JSON. A call the backend or device cannot do is refused, naming both, before anything
    changes. update_weights commits on every replica or aborts on every one: it prints the
    committed version and each replica's state, or fails saying why it aborted.

    \b
    CALL is one of:
      is_paused, reset_prefix_cache, sleep, wake_up, tokenize, detokenize,
      load_adapter, unload_adapter, adapters, update_weights, weight_version

    \b
    Examples:
      relayllm control NAME is_paused
      relayllm control NAME reset_prefix_cache
      relayllm control NAME sleep 1          # then: relayllm control NAME wake_up
      relayllm control NAME tokenize "Hello there"
      relayllm control NAME detokenize 9906 1070
      relayllm control NAME load_adapter ADAPTER /path/to/lora   # rows: model ADAPTER
      relayllm control NAME unload_adapter ADAPTER
      relayllm control NAME adapters
      relayllm control NAME update_weights /path/to/checkpoint VERSION   # or s3://...
      relayllm control NAME weight_version
    """
    import relayllm
    from relayllm.errors import ConfigError

    controller_args: list[object] = list(args)
    keywords: dict[str, object] = {}
    if call == "tokenize":
        if len(args) != 1:
            raise ConfigError("tokenize takes one TEXT argument (quote it)")
    elif call == "detokenize":
        try:
            controller_args = [[int(a) for a in args]]
        except ValueError:
            raise ConfigError("detokenize takes token ids: integers") from None
    elif call == "sleep":
        if len(args) > 1 or (args and not args[0].isdigit()):
            raise ConfigError("sleep takes at most one LEVEL argument: 1 or 2")
        controller_args = [int(a) for a in args]
    elif call == "load_adapter":
        if len(args) != 2:
            raise ConfigError("load_adapter takes NAME PATH")
    elif call == "update_weights":
        if len(args) != 2:
            raise ConfigError("update_weights takes SOURCE VERSION")
        controller_args, keywords = [args[0]], {"version": args[1]}
    elif call == "unload_adapter":
        if len(args) != 1:
            raise ConfigError("unload_adapter takes NAME")
    elif args:
        raise ConfigError(f"{call} takes no arguments (got {' '.join(args)})")
    connect(address, verbose, existing_cluster=True, start_serve=False)
    controller = relayllm.control(name, address=address)
    answer = getattr(controller, call)(*controller_args, **keywords)
    click.echo(json.dumps(answer))
