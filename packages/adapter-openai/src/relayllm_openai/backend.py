"""The ``openai`` Backend class: what a deployment serves and how it is checked and built.

Light on purpose (pydantic and relayllm only): the entry point loads this module in every
process that asks for the registry; the ``openai`` client is imported by :mod:`.deployment`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from relayllm.adapters import FEATURES, TASKS, Backend, ConfigError
from relayllm_openai.options import OpenAIOptions

if TYPE_CHECKING:
    from relayllm.adapters import Engine


class OpenAIBackend(Backend):
    """Any OpenAI-compatible endpoint: chat, completion and embedding."""

    name = "openai"
    contract_version = 3
    Options = OpenAIOptions
    requires = ("openai", "aiolimiter")
    install_hint = (
        "pip install ./packages/adapter-openai (run in a clone of the relayllm repository)"
    )
    tasks = frozenset(TASKS)

    @classmethod
    def tasks_for(cls, options: OpenAIOptions) -> frozenset[str]:
        return frozenset(options.tasks)

    features = frozenset(FEATURES)

    @classmethod
    def features_for(cls, options: OpenAIOptions) -> frozenset[str]:
        """What the endpoint supports, as ``options.features`` declares it."""
        return frozenset(options.features)

    @classmethod
    def check_options(cls, options: OpenAIOptions) -> None:
        # The replica reads the key from its own environment, which it inherits from the
        # process that started Ray; a missing variable fails here, before anything starts.
        if options.api_key_env and not os.environ.get(options.api_key_env):
            raise ConfigError(
                f"options.api_key_env: the environment variable {options.api_key_env} is not set. "
                "Export it before starting Ray (the Serve replica inherits it), or set "
                "api_key_env=None for an endpoint that needs no key."
            )

    @classmethod
    def engine_class(cls) -> type[Engine]:
        from relayllm_openai.deployment import OpenAIEngine

        return OpenAIEngine

    @classmethod
    def deployment_options(cls, options: OpenAIOptions) -> dict[str, Any]:
        # The replica only waits on HTTP: reserving a CPU would starve the stage actors.
        return {"ray_actor_options": {"num_cpus": 0}}


__all__ = ["OpenAIBackend"]
