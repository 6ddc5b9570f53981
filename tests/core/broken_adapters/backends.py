"""A correct echo-style adapter and broken variants of it, one defect each.

Each row "costs" ``ROW_SECONDS`` of engine time, spent concurrently by a correct adapter, so
the kit can tell rows served together from rows served in turn. The correct adapter follows
every sampling parameter the row protocol promises the way the echo backend does
(:func:`relayllm.testing.echo.generate`, sampling on); an ``Ignores...`` variant drops exactly
one of them before its "engine" sees the row. Imported by the kit run's Ray workers too (the
meta-test puts this directory on their ``PYTHONPATH``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel

from relayllm.backend import Backend, BackendOptions
from relayllm.plugin import hookimpl
from relayllm.plugin.legacy import BatchDeployment
from relayllm.rows import Request, Result, error_result, request_text
from relayllm.testing.echo import ECHO_FEATURES, generate

ROW_SECONDS = 0.2
CONTEXT_WORDS = 50  # a longer prompt is refused by the "engine"


class Correct(BatchDeployment):
    backend_name = "correct"
    #: Sampling params this adapter drops before its "engine" sees the row (none: correct).
    ignored: tuple[str, ...] = ()

    def __init__(self, options: Any, deployment: dict[str, Any]) -> None:
        super().__init__(options, deployment)
        self.stopped = False

    async def run_request(self, request: Request) -> Result:
        await asyncio.sleep(ROW_SECONDS)
        return self.answer(request)

    def answer(self, request: Request) -> Result:
        words = request_text(request).split()
        if len(words) > CONTEXT_WORDS:
            return error_result(f"{len(words)} words is over the context of {CONTEXT_WORDS}")
        if request["task"] == "embedding":
            return {"embedding": self.embed(words), "num_input_tokens": len(words)}
        params = request["sampling_params"]
        kept = {k: v for k, v in params.items() if k not in self.ignored}
        answer = generate(list(reversed(words)), kept, sampling=True)
        return {**answer, "num_input_tokens": len(words)}

    def embed(self, words: list[str]) -> list[float]:
        return ([float(len(w)) for w in words] + [0.0] * 8)[:8]

    async def stop_engine(self) -> None:
        self.stopped = True

    async def engine_health(self) -> None:
        if self.stopped:
            raise RuntimeError("engine stopped")


class Shifted(Correct):
    """Puts each row's text on its neighbour's row (token counts kept right)."""

    async def run_batch(self, requests: list[Request]) -> list[Result]:
        results = await super().run_batch(requests)
        texts = [r.get("generated_text") for r in results]
        texts = texts[-1:] + texts[:-1]
        return [{**r, "generated_text": t} for r, t in zip(results, texts, strict=True)]


def ignores(*params: str) -> type[Correct]:
    """The correct adapter, except that it drops ``params`` from every row."""
    return type("Ignores", (Correct,), {"ignored": params})


class SameEmbedding(Correct):
    def embed(self, words: list[str]) -> list[float]:
        return [0.5] * 8


class RefusalFailsCall(Correct):
    """One refused row fails every row of its call (an engine call per batch)."""

    async def run_batch(self, requests: list[Request]) -> list[Result]:
        await asyncio.sleep(ROW_SECONDS)
        results = [self.answer(r) for r in requests]
        refused = [r["error"] for r in results if r.get("error")]
        if refused:
            raise RuntimeError(f"the engine rejected the batch: {refused[0]}")
        return results


class Serial(Correct):
    """Serves the rows of a call strictly one at a time."""

    async def run_batch(self, requests: list[Request]) -> list[Result]:
        return [await self.run_request(r) for r in requests]


class ComputesTwice(Correct):
    """Bypasses the replica's bookkeeping: a retried call is computed again."""

    async def process_batch(self, requests: list[Request], job: str | None = None) -> list[Result]:
        self.rows += len(requests)
        return await self.run_batch(requests)


class HealthAlwaysOk(Correct):
    async def engine_health(self) -> None:
        return None


class EmbeddingNotReally(Correct):
    """Declares embeddings (tasks_for) but its engine cannot compute them."""

    def embed(self, words: list[str]) -> list[float]:
        raise RuntimeError("this engine has no pooling head")

    def answer(self, request: Request) -> Result:
        try:
            return super().answer(request)
        except RuntimeError as exc:
            return error_result(str(exc))


class LooseOptions(BaseModel):
    """Options that silently drop a misspelled key (no ``extra="forbid"``)."""

    suffix: str = ""


def _backend(
    name: str, deployment: type[BatchDeployment], options: type[BaseModel] = BackendOptions
) -> type[Backend]:
    ident = "".join(part.title() for part in name.split("-"))
    cls = type(ident + "Deployment", (deployment,), {"backend_name": name})
    # A module-level name, so Ray workers unpickle the class by reference.
    globals()[cls.__name__] = cls
    cls.__qualname__ = cls.__name__

    class _Backend(Backend):
        contract_version = 2
        tasks = frozenset({"chat", "completion", "embedding"})
        features = frozenset(ECHO_FEATURES)

        @classmethod
        def deployment_class(cls_):
            return cls

        @classmethod
        def deployment_options(cls_, options):
            return {"ray_actor_options": {"num_cpus": 0}}

    _Backend.name = name
    _Backend.Options = options
    _Backend.__name__ = _Backend.__qualname__ = ident + "Backend"
    globals()[_Backend.__name__] = _Backend
    return _Backend


#: backend name -> (Backend class, the kit test that must fail for it; None: all must pass)
BROKEN = {
    "correct": (_backend("correct", Correct), None),
    "shifted": (_backend("shifted", Shifted), "test_each_row_gets_its_own_answer"),
    "ignores-max-tokens": (
        _backend("ignores-max-tokens", ignores("max_tokens")),
        "test_max_tokens_honoured",
    ),
    "ignores-temperature": (
        _backend("ignores-temperature", ignores("temperature")),
        "test_temperature_zero_is_deterministic",
    ),
    "ignores-seed": (
        _backend("ignores-seed", ignores("seed")),
        "test_seed_makes_sampling_reproducible",
    ),
    "ignores-top-p": (_backend("ignores-top-p", ignores("top_p")), "test_small_top_p_is_greedy"),
    "ignores-stop": (_backend("ignores-stop", ignores("stop")), "test_stop_sequences_honoured"),
    "ignores-n": (_backend("ignores-n", ignores("n")), "test_n_samples"),
    "ignores-logprobs": (
        _backend("ignores-logprobs", ignores("logprobs", "top_logprobs")),
        "test_logprobs_and_top_logprobs",
    ),
    "ignores-response-format": (
        _backend("ignores-response-format", ignores("response_format")),
        "test_response_format_json_schema",
    ),
    "ignores-structured-outputs": (
        _backend("ignores-structured-outputs", ignores("structured_outputs")),
        "test_structured_output_choice",
    ),
    "ignores-presence-penalty": (
        _backend("ignores-presence-penalty", ignores("presence_penalty")),
        "test_presence_penalty_honoured",
    ),
    "ignores-frequency-penalty": (
        _backend("ignores-frequency-penalty", ignores("frequency_penalty")),
        "test_frequency_penalty_honoured",
    ),
    "same-embedding": (_backend("same-embedding", SameEmbedding), "test_embedding"),
    "refusal-fails-call": (
        _backend("refusal-fails-call", RefusalFailsCall),
        "test_engine_refusal_fails_only_that_row",
    ),
    "serial": (_backend("serial", Serial), "test_rows_of_one_call_run_concurrently"),
    "computes-twice": (
        _backend("computes-twice", ComputesTwice),
        "test_retried_call_is_not_computed_twice",
    ),
    "health-always-ok": (
        _backend("health-always-ok", HealthAlwaysOk),
        "test_health_reports_engine_down",
    ),
    "embedding-not-really": (
        _backend("embedding-not-really", EmbeddingNotReally),
        "test_embedding",
    ),
    "loose-options": (
        _backend("loose-options", Correct, LooseOptions),
        "test_options_reject_unknown_keys",
    ),
}


@hookimpl
def relayllm_register_backends(registry) -> None:
    for backend, _ in BROKEN.values():
        registry.add(backend)
