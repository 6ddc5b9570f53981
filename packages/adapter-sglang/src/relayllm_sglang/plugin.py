"""The entry point relayllm loads (group ``relayllm``, name ``sglang``)."""

from __future__ import annotations

from relayllm.adapters import hookimpl
from relayllm_sglang.backend import SGLangBackend


@hookimpl
def relayllm_register_backends(registry) -> None:
    registry.add(SGLangBackend)
