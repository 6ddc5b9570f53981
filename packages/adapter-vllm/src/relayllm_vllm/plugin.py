"""The entry point relayllm loads (group ``relayllm``, name ``vllm``): registers the backend.

Light to import: the backend module imports no vllm, torch or transformers.
"""

from __future__ import annotations

from relayllm.adapters import hookimpl
from relayllm_vllm.backend import VLLMBackend


@hookimpl
def relayllm_register_backends(registry) -> None:
    registry.add(VLLMBackend)


@hookimpl
def relayllm_register_commands(cli) -> None:
    """``relayllm demo`` ships with this adapter: it runs on the vLLM engine."""
    from relayllm_vllm.demo_command import demo

    cli.add_command(demo)


__all__ = ["relayllm_register_backends", "relayllm_register_commands"]
