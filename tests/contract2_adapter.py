"""A contract-2 adapter: the docs' minimal backend (``examples/third-party-adapter``) as it was
before adapter contract 3, kept as it was written -- a ``BatchDeployment`` subclass with typed
options -- except for its backend name (``shout-v2``, beside the current example's ``shout``).
The contract tests run it through the contract-2 wrapper
(tests/core/test_adapter_contract_on_ray.py, tests/unit/core/test_adapter_contract.py)."""

from __future__ import annotations

from typing import Any

import relayllm
from relayllm.adapters import check_sampling_support
from relayllm.rows import Request, Result, request_text

CONTEXT_WORDS = 100  # shout's "context length": a longer prompt is refused
#: The sampling params shout takes: it honours max_tokens and stop; temperature, top_p and
#: seed change nothing, since shout has one answer per prompt (the greedy one). Any other
#: param fails its row, naming it (the policy every adapter shares), never silently dropped.
SUPPORTED = ("max_tokens", "stop", "temperature", "top_p", "seed")


class ShoutOptions(relayllm.BackendOptions):
    suffix: str = "!"


class ShoutDeployment(relayllm.BatchDeployment):
    backend_name = "shout-v2"
    options: ShoutOptions  # the validated options, typed

    async def run_request(self, request: Request) -> Result:
        params = request["sampling_params"]
        check_sampling_support("shout", params, SUPPORTED)  # raising fails this row only
        words = request_text(request).upper().split()
        if len(words) > CONTEXT_WORDS:
            raise ValueError(f"{len(words)} words is over shout's context of {CONTEXT_WORDS}")
        budget = params.get("max_tokens") or len(words)
        out = words[:budget]
        finish = "length" if len(words) > budget else "stop"
        text = " ".join(out) + self.options.suffix
        stop = params.get("stop") or []
        hits = [text.find(s) for s in ([stop] if isinstance(stop, str) else stop) if s in text]
        if hits:  # the answer ends where its first stop string starts
            text, finish = text[: min(hits)], "stop"
            out = text.split()
        return {
            "generated_text": text,
            "finish_reason": finish,
            "num_input_tokens": len(words),
            "num_generated_tokens": len(out),
        }

    def engine_info(self) -> dict[str, Any]:
        return {"model": "shout"}


class ShoutBackend(relayllm.Backend):
    name = "shout-v2"
    contract_version = 2
    Options = ShoutOptions  # serves tasks_for(options) = chat and completion (the default)
    features = frozenset()  # no optional request features: no logprobs, n or JSON output

    @classmethod
    def deployment_class(cls):
        return ShoutDeployment

    @classmethod
    def deployment_options(cls, options):
        return {"ray_actor_options": {"num_cpus": 0}}


@relayllm.hookimpl
def relayllm_register_backends(registry) -> None:
    registry.add(ShoutBackend)
