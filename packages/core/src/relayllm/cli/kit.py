"""Deprecated: moved to :mod:`relayllm.adapters.commands` (goes with adapter contract 4); kept so
plugins' commands that import it keep working."""

from __future__ import annotations

import warnings

from relayllm.adapters.commands import (
    Console,
    ConsoleProgress,
    address_option,
    format_summary,
    handle_errors,
    verbose_option,
)
from relayllm.backend import AdapterContractWarning

ConsoleHooks = ConsoleProgress  # its old name

__all__ = [
    "Console",
    "ConsoleHooks",
    "address_option",
    "format_summary",
    "handle_errors",
    "verbose_option",
]

warnings.warn(
    "relayllm.cli.kit moved to relayllm.adapters.commands; the old path goes with adapter "
    "contract 4",
    AdapterContractWarning,
    stacklevel=2,
)
