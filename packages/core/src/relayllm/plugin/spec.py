"""The hook contract. It fits on one screen on purpose: a hook only registers; behaviour lives
on the Backend class or the command (the shape of simonw/llm's ``hookspecs.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from relayllm.plugin import hookspec

if TYPE_CHECKING:
    import click

    from relayllm.adapters.commands import StatusSection
    from relayllm.backend import BackendRegistry


@hookspec
def relayllm_register_backends(registry: BackendRegistry) -> None:
    """Register Backend classes with ``registry.add(MyBackend)``.

    A backend name may be registered once; a second registration of the same name raises
    :class:`relayllm.errors.DuplicateBackendError` naming both plugins.
    """


@hookspec
def relayllm_register_commands(cli: click.Group) -> None:
    """Add subcommands to the ``relayllm`` command with ``cli.add_command(command)`` (or the
    ``@cli.command()`` decorator). Called once, when the CLI is imported; a command's heavy
    imports belong inside the command, so ``relayllm --help`` stays fast."""


@hookspec
def relayllm_status_sections(address: str | None, timeout_s: float) -> list[StatusSection]:
    """Sections ``relayllm status`` prints after the deployments (the batch service lists its
    gateways). Called when the command runs, on a connected cluster; each section item's
    call gets ``timeout_s``. Optional: a plugin that lacks it adds nothing."""
    return []


__all__ = ["relayllm_register_backends", "relayllm_register_commands", "relayllm_status_sections"]
