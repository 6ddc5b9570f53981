"""The whole adapter: options, the engine, and the hook that registers the backend."""

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

CONTEXT_WORDS = 100  # shout's "context length": a longer prompt is refused
#: The sampling params shout takes: it honours max_tokens and stop; temperature, top_p and
#: seed change nothing, since shout has one answer per prompt (the greedy one). Any other
#: param fails its row, naming it (the policy every adapter shares), never silently dropped.
SUPPORTED = ("max_tokens", "stop", "temperature", "top_p", "seed")


class ShoutOptions(BackendOptions):
    suffix: str = "!"


class ShoutEngine(Engine):  # runs in each Serve replica; the core's replica wraps it
    backend_name = "shout"
    options: ShoutOptions  # the validated options, typed

    async def run_request(self, request: Request) -> Result:  # one row; raise: this row fails
        params = request["sampling_params"]
        check_sampling_support("shout", params, SUPPORTED)
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

    def info(self) -> dict[str, Any]:
        return {"model": "shout"}


class ShoutBackend(Backend):
    name = "shout"
    contract_version = 3
    Options = ShoutOptions  # serves tasks_for(options) = chat and completion (the default)
    features = frozenset()  # no optional request features: no logprobs, n or JSON output

    @classmethod
    def engine_class(cls):  # import your engine's package here, not at module level
        return ShoutEngine

    @classmethod
    def deployment_options(cls, options):
        return {"ray_actor_options": {"num_cpus": 0}}


@hookimpl
def relayllm_register_backends(registry) -> None:
    registry.add(ShoutBackend)
