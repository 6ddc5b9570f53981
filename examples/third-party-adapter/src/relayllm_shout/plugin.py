"""The whole adapter: options, the deployment, and the hook that registers the backend."""

from __future__ import annotations

from typing import Any

import relayllm
from relayllm.rows import Request, Result, request_text

CONTEXT_WORDS = 100  # shout's "context length": a longer prompt is refused


class ShoutOptions(relayllm.BackendOptions):
    suffix: str = "!"


class ShoutDeployment(relayllm.BatchDeployment):
    backend_name = "shout"
    options: ShoutOptions  # the validated options, typed

    async def run_request(self, request: Request) -> Result:
        words = request_text(request).upper().split()
        if len(words) > CONTEXT_WORDS:  # raising fails this row only
            raise ValueError(f"{len(words)} words is over shout's context of {CONTEXT_WORDS}")
        budget = request["sampling_params"].get("max_tokens") or len(words)
        out = words[:budget]
        return {
            "generated_text": " ".join(out) + self.options.suffix,
            "finish_reason": "length" if len(words) > budget else "stop",
            "num_input_tokens": len(words),
            "num_generated_tokens": len(out),
        }

    def engine_info(self) -> dict[str, Any]:
        return {"model": "shout"}


class ShoutBackend(relayllm.Backend):
    name = "shout"
    contract_version = 2
    Options = ShoutOptions  # serves tasks_for(options) = chat and completion (the default)

    @classmethod
    def deployment_class(cls):
        return ShoutDeployment

    @classmethod
    def deployment_options(cls, options):
        return {"ray_actor_options": {"num_cpus": 0}}


@relayllm.hookimpl
def relayllm_register_backends(registry) -> None:
    registry.add(ShoutBackend)
