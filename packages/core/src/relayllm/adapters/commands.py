"""What a plugin's command uses from the ``relayllm`` command: public, kept stable.

A plugin adds commands through the ``relayllm_register_commands`` hook (relayllm-vllm adds
``relayllm demo``). Built from these, its command takes the same options, prints progress and
the per-step summary the same way, and turns relayllm's errors into the same one-line message
and exit code as relayllm's own commands. Everything under ``relayllm.cli`` is internal and may
change in any release.

- :func:`address_option` / :func:`verbose_option`: the ``--address`` and ``-v`` options.
- :func:`handle_errors`: relayllm's errors as ``error: ...`` and a non-zero exit, no traceback.
- :class:`Console`: phases and progress lines on stderr.
- :class:`ConsoleProgress`: a pipeline run's progress on a :class:`Console`
  (``run_pipeline(..., progress=ConsoleProgress(console, verbose))``; ``ConsoleHooks``, its
  old name, until the next release).
- :func:`format_summary`: a run's per-step summary as text.
- :func:`parse_pipeline` / :func:`run_pipeline`: a pipeline the command builds, and its run
  (loaded on first use: the run machinery is not needed to list the commands).
- :class:`StatusSection`: what a plugin's ``relayllm_status_sections`` hook adds to
  ``relayllm status``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from relayllm.cli.common import address_option, handle_errors, verbose_option
from relayllm.cli.progress import Console
from relayllm.cli.run import ConsoleProgress, format_summary

if TYPE_CHECKING:
    from relayllm.pipelines import parse_pipeline, run_pipeline


@dataclass(frozen=True)
class StatusSection:
    """A table ``relayllm status`` prints after the deployments: ``title`` above it, one row
    per item (its ``columns``' values; ``right``: the column indices aligned right). With
    ``--json`` the items are listed after the deployments', each saying its own ``kind``."""

    title: str
    columns: list[str]
    items: list[dict[str, Any]] = field(default_factory=list)
    right: list[int] = field(default_factory=list)


_LAZY = {"parse_pipeline": "relayllm.pipelines", "run_pipeline": "relayllm.pipelines"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    if name == "ConsoleHooks":
        from relayllm.backend import AdapterContractWarning
        from relayllm.pipelines.progress import renamed

        return renamed(
            f"{__name__}.ConsoleHooks",
            "ConsoleProgress",
            ConsoleProgress,
            category=AdapterContractWarning,
        )
    raise AttributeError(f"module 'relayllm.adapters.commands' has no attribute {name!r}")


__all__ = [
    "Console",
    "ConsoleProgress",
    "StatusSection",
    "address_option",
    "format_summary",
    "handle_errors",
    "parse_pipeline",
    "run_pipeline",
    "verbose_option",
]
