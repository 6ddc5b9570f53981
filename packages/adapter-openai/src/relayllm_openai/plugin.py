"""The entry point relayllm loads (group ``relayllm``, name ``openai``): registers the backend.

Light to import: pydantic and relayllm only (no ``openai`` client).
"""

from __future__ import annotations

from relayllm.adapters import hookimpl
from relayllm_openai.backend import OpenAIBackend


@hookimpl
def relayllm_register_backends(registry) -> None:
    registry.add(OpenAIBackend)


__all__ = ["relayllm_register_backends"]
