"""The whole adapter: options, the deployment, and the hook that registers the backend."""

from __future__ import annotations

from typing import Any

import relayllm
from relayllm.rows import Request, Result


class ShoutOptions(relayllm.BackendOptions):
    suffix: str = "!"


class ShoutDeployment(relayllm.BatchDeployment):
    backend_name = "shout"

    async def run_request(self, request: Request) -> Result:
        if request["task"] == "chat":
            text = request["messages"][-1]["content"]
        else:
            text = request["prompt"]
        words = text.upper().split()
        return {
            "generated_text": " ".join(words) + self.options["suffix"],
            "finish_reason": "stop",
            "num_input_tokens": len(words),
            "num_generated_tokens": len(words),
        }

    def engine_info(self) -> dict[str, Any]:
        return {"model": "shout"}


class ShoutBackend(relayllm.Backend):
    name = "shout"
    Options = ShoutOptions

    @classmethod
    def deployment_class(cls):
        return ShoutDeployment

    @classmethod
    def deployment_options(cls, options):
        return {"ray_actor_options": {"num_cpus": 0}}


@relayllm.hookimpl
def relayllm_register_backends(registry) -> None:
    registry.add(ShoutBackend)
