"""A backend written from docs/adapters.md alone, in one file (adapter contract 3): an Engine
that answers with the prompt's words in lower case, and stops when asked (so the kit's
engine-down check runs). tests/core/test_adapter_contract_on_ray.py passes it through the kit."""

from __future__ import annotations

from typing import Any

from relayllm.adapters import (
    Backend,
    BackendOptions,
    Engine,
    Request,
    Result,
    check_sampling_support,
    hookimpl,
    request_text,
)

CONTEXT_WORDS = 64
#: max_tokens and stop are honoured; temperature, top_p and seed change nothing (one answer
#: per prompt, the greedy one); any other parameter fails its row, by the shared policy.
SUPPORTED = ("max_tokens", "stop", "temperature", "top_p", "seed")


class LowerOptions(BackendOptions):
    prefix: str = ""


class LowerEngine(Engine):
    backend_name = "lower"
    options: LowerOptions

    def start(self) -> None:
        self.stopped = False

    async def run_request(self, request: Request) -> Result:
        params = request["sampling_params"]
        check_sampling_support("lower", params, SUPPORTED)
        words = request_text(request).lower().split()
        if len(words) > CONTEXT_WORDS:
            raise ValueError(f"{len(words)} words is over lower's context of {CONTEXT_WORDS}")
        budget = params.get("max_tokens") or len(words)
        out = words[:budget]
        finish = "length" if len(words) > budget else "stop"
        text = self.options.prefix + " ".join(out)
        stop = params.get("stop") or []
        hits = [text.find(s) for s in ([stop] if isinstance(stop, str) else stop) if s in text]
        if hits:
            text, finish = text[: min(hits)], "stop"
            out = text.split()
        return {
            "generated_text": text,
            "finish_reason": finish,
            "num_input_tokens": len(words),
            "num_generated_tokens": len(out),
        }

    def info(self) -> dict[str, Any]:
        return {"model": "lower"}

    async def health(self) -> None:
        if self.stopped:
            raise RuntimeError("the lower engine was stopped")

    def stop(self) -> None:
        self.stopped = True


class LowerBackend(Backend):
    name = "lower"
    contract_version = 3
    Options = LowerOptions
    features = frozenset()

    @classmethod
    def engine_class(cls):
        return LowerEngine

    @classmethod
    def deployment_options(cls, options):
        return {"ray_actor_options": {"num_cpus": 0}}


@hookimpl
def relayllm_register_backends(registry) -> None:
    registry.add(LowerBackend)
