"""An adapter written against adapter contract 1: no declared contract version, options
read as a mapping. This relayllm refuses it when it registers; the contract tests (unit and
cluster) check that it is refused clearly, never by error rows."""

from __future__ import annotations

from typing import Any

import relayllm
from relayllm.rows import Request, Result, request_text


class FirstOptions(relayllm.BackendOptions):
    scale: int = 1


class FirstDeployment(relayllm.BatchDeployment):
    """Written against contract 1: ``self.options`` read as a mapping."""

    backend_name = "first-contract"

    async def run_request(self, request: Request) -> Result:
        words = request_text(request).split()
        return {
            "generated_text": " ".join(words * self.options["scale"]),
            "finish_reason": "stop",
            "num_input_tokens": len(words),
            "num_generated_tokens": len(words) * self.options.get("scale", 1),
        }

    def engine_info(self) -> dict[str, Any]:
        return {"model": "first-contract"}


class FirstBackend(relayllm.Backend):
    name = "first-contract"  # no contract_version: written before adapters declared one
    Options = FirstOptions

    @classmethod
    def deployment_class(cls):
        return FirstDeployment

    @classmethod
    def deployment_options(cls, options):
        return {"ray_actor_options": {"num_cpus": 0}}
