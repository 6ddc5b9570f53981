"""The entry point relayllm loads (group ``relayllm``, name ``service``): the service's commands.

Light to import: click and the commands' modules only; each command imports the service's
machinery when it runs.
"""

from __future__ import annotations

from relayllm.adapters import hookimpl


@hookimpl
def relayllm_register_commands(cli) -> None:
    from relayllm_service.cli.batches import batches
    from relayllm_service.cli.files import files
    from relayllm_service.cli.serve import serve, unserve
    from relayllm_service.cli.usage import usage

    for command in (serve, unserve, batches, files, usage):
        cli.add_command(command)


@hookimpl
def relayllm_status_sections(address, timeout_s):
    """The running gateways, for ``relayllm status``: base URL and batches not finished."""
    from relayllm.adapters.commands import StatusSection
    from relayllm_service.deploy import list_gateways

    items = [
        {
            "kind": "gateway",
            "name": ref.name,
            "status": ref.status,
            "url": ref.url,
            "proxy_url": ref.proxy_url,
            "unfinished_batches": ref.unfinished,
        }
        for ref in list_gateways(address=address, timeout_s=timeout_s)
    ]
    columns = ["name", "status", "url", "unfinished_batches"]
    return [StatusSection("batch service gateways (relayllm serve)", columns, items, right=[3])]


__all__ = ["relayllm_register_commands", "relayllm_status_sections"]
