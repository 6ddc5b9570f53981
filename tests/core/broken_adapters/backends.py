"""The correct adapter (``correct.py``) and broken variants of it, one defect each, for the
conformance kit's own test: one per sampling parameter and optional feature the row protocol
promises (each drops or misreads just that one before its "engine" sees the row), and one per
behaviour the kit checks. Imported by the kit run's Ray workers too (the meta-test puts this
directory on their ``PYTHONPATH``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple

from pydantic import BaseModel

import relayllm
from relayllm.rows import FEATURES, Request, Result, error_result

from .correct import ROW_SECONDS, Correct


class Shifted(Correct):
    """Puts each row's text on its neighbour's row (token counts kept right)."""

    async def run_batch(self, requests: list[Request]) -> list[Result]:
        results = await super().run_batch(requests)
        texts = [r.get("generated_text") for r in results]
        texts = texts[-1:] + texts[:-1]
        return [{**r, "generated_text": t} for r, t in zip(results, texts, strict=True)]


class Swapped(Correct):
    """Swaps the first two rows' texts of a call (token counts kept right): one row in four
    of the kit's eight on the wrong row, the rest right."""

    async def run_batch(self, requests: list[Request]) -> list[Result]:
        results = await super().run_batch(requests)
        if len(results) > 1:
            first, second = (r.get("generated_text") for r in results[:2])
            results[0] = {**results[0], "generated_text": second}
            results[1] = {**results[1], "generated_text": first}
        return results


def ignores(*params: str) -> type[Correct]:
    """The correct adapter, except that it drops ``params`` from every row."""
    return type("Ignores", (Correct,), {"ignored": params})


def ignores_when(name: str, dropped: Callable[[Any], bool]) -> type[Correct]:
    """The correct adapter, except that it drops ``name`` when its value is ``dropped``
    (``stop`` given as a plain string, ``response_format`` of one type...)."""

    def kept(self: Correct, params: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in params.items() if k != name or not dropped(v)}

    return type("IgnoresWhen", (Correct,), {"kept": kept})


class AlwaysGreedy(Correct):
    """Decodes greedily whatever the row asks: temperature 0, no seed, no nucleus."""

    def kept(self, params: dict[str, Any]) -> dict[str, Any]:
        drop = ("temperature", "seed", "top_p")
        return {**{k: v for k, v in params.items() if k not in drop}, "temperature": 0.0}


class Noisy(Correct):
    """An engine whose greedy answers differ a little between identical calls, as batched
    numerics do: every second call, its first row's answer gets a word of noise (within the
    "3 of 4 rows equal" the kit allows)."""

    noisy_calls = 0

    async def run_batch(self, requests: list[Request]) -> list[Result]:
        results = await super().run_batch(requests)
        self.noisy_calls += 1
        first = results[0].get("generated_text") if results else None
        if self.noisy_calls % 2 == 0 and isinstance(first, str):
            results[0] = {**results[0], "generated_text": f"{first} noise-{uuid.uuid4().hex[:8]}"}
        return results


def noisy(variant: type[Correct]) -> type[Correct]:
    return type("Noisy" + variant.__name__, (Noisy, variant), {})


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
    name: str, deployment: type[Correct], options: type[BaseModel] = relayllm.BackendOptions
) -> type[relayllm.Backend]:
    ident = "".join(part.title() for part in name.split("-"))
    cls = type(ident + "Deployment", (deployment,), {"backend_name": name})
    # A module-level name, so Ray workers unpickle the class by reference.
    globals()[cls.__name__] = cls
    cls.__qualname__ = cls.__name__

    class _Backend(relayllm.Backend):
        contract_version = 2
        tasks = frozenset({"chat", "completion", "embedding"})
        features = frozenset(FEATURES)

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


class Broken(NamedTuple):
    backend: type[relayllm.Backend]
    #: The kit test that must fail for it (None: every test must pass).
    check: str | None = None
    #: A fragment of that failure's message: the failure is for this defect.
    reason: str | None = None


def _string(value: Any) -> bool:
    return isinstance(value, str)


def _json_object(value: Any) -> bool:
    return isinstance(value, dict) and value.get("type") == "json_object"


def _form(form: str) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, dict) and value.get(form) is not None


#: (name, deployment class, options model, check, reason)
_CASES: list[tuple[str, type[Correct], type[BaseModel] | None, str | None, str | None]] = [
    ("correct", Correct, None, None, None),
    # -- behaviours
    ("shifted", Shifted, None, "test_each_row_gets_its_own_answer", "on the wrong row?"),
    (
        "swapped",
        Swapped,
        None,
        "test_each_row_gets_its_own_answer",
        "row 0 got row 1's, row 1 got row 0's",
    ),
    ("same-embedding", SameEmbedding, None, "test_embedding", "got one embedding"),
    ("embedding-not-really", EmbeddingNotReally, None, "test_embedding", "no pooling head"),
    (
        "refusal-fails-call",
        RefusalFailsCall,
        None,
        "test_engine_refusal_fails_only_that_row",
        "a refusal of one row failed others of its call",
    ),
    ("serial", Serial, None, "test_rows_of_one_call_run_concurrently", "one after another"),
    (
        "computes-twice",
        ComputesTwice,
        None,
        "test_retried_call_is_not_computed_twice",
        "rows sent three times were computed 12 times over",
    ),
    ("health-always-ok", HealthAlwaysOk, None, "test_health_reports_engine_down", "still reports"),
    ("loose-options", Correct, LooseOptions, "test_options_reject_unknown_keys", "DID NOT RAISE"),
    # -- the sampling parameters every backend takes
    (
        "ignores-max-tokens",
        ignores("max_tokens"),
        None,
        "test_max_tokens_honoured",
        "max_tokens 3 asked, the rows generated",
    ),
    (
        "ignores-max-completion-tokens",
        ignores("max_completion_tokens"),
        None,
        "test_max_completion_tokens_honoured",
        "max_completion_tokens 3 asked, the rows generated",
    ),
    (
        "ignores-temperature",
        ignores("temperature"),
        None,
        "test_temperature_zero_is_deterministic",
        "the same rows at temperature 0, sent twice got different answers",
    ),
    (
        "always-greedy",
        AlwaysGreedy,
        None,
        "test_temperature_one_varies_without_seed",
        "the adapter decodes greedily whatever the temperature",
    ),
    (
        "noisy-always-greedy",
        noisy(AlwaysGreedy),
        None,
        "test_temperature_one_varies_without_seed",
        "the adapter decodes greedily whatever the temperature",
    ),
    (
        "ignores-seed",
        ignores("seed"),
        None,
        "test_seed_makes_sampling_reproducible",
        "the same seeded rows at temperature 1, sent twice got different answers",
    ),
    (
        "ignores-top-p",
        ignores("top_p"),
        None,
        "test_small_top_p_is_greedy",
        "temperature 0 vs temperature 1 with top_p 1e-6 got different answers",
    ),
    ("ignores-stop", ignores("stop"), None, "test_stop_sequences_honoured", "(a list) but"),
    (
        "ignores-stop-string",
        ignores_when("stop", _string),
        None,
        "test_stop_string_honoured",
        "(a plain string) but",
    ),
    (
        "ignores-presence-penalty",
        ignores("presence_penalty"),
        None,
        "test_presence_penalty_honoured",
        "presence_penalty 2.0 changed no answer",
    ),
    (
        "noisy-ignores-presence-penalty",
        noisy(ignores("presence_penalty")),
        None,
        "test_presence_penalty_honoured",
        "presence_penalty 2.0 changed no answer",
    ),
    (
        "ignores-frequency-penalty",
        ignores("frequency_penalty"),
        None,
        "test_frequency_penalty_honoured",
        "frequency_penalty 2.0 changed no answer",
    ),
    # -- the optional features a backend declares
    ("ignores-n", ignores("n"), None, "test_n_samples", "asked for n=3 and got samples None"),
    (
        "ignores-logprobs",
        ignores("logprobs", "top_logprobs"),
        None,
        "test_logprobs_and_top_logprobs",
        "and got logprobs None",
    ),
    (
        "ignores-prompt-logprobs",
        ignores("prompt_logprobs"),
        None,
        "test_prompt_logprobs",
        "and got prompt_logprobs None",
    ),
    (
        "ignores-response-format",
        ignores("response_format"),
        None,
        "test_response_format_json_schema",
        "asked for a JSON schema and answered",
    ),
    (
        "ignores-json-object",
        ignores_when("response_format", _json_object),
        None,
        "test_response_format_json_object",
        "asked for a JSON object (response_format json_object)",
    ),
    (
        "ignores-choice",
        ignores_when("structured_outputs", _form("choice")),
        None,
        "test_structured_output_choice",
        "choices ['yes', 'no'] asked",
    ),
    (
        "ignores-regex",
        ignores_when("structured_outputs", _form("regex")),
        None,
        "test_structured_output_regex",
        "structured_outputs regex",
    ),
    (
        "ignores-grammar",
        ignores_when("structured_outputs", _form("grammar")),
        None,
        "test_structured_output_grammar",
        "structured_outputs grammar",
    ),
    (
        "ignores-tools",
        ignores("tools", "tool_choice"),
        None,
        "test_tools_and_tool_choice",
        "named tool get_weather in tool_choice and got tool_calls None",
    ),
    (
        "ignores-tool-choice",
        ignores("tool_choice"),
        None,
        "test_tools_and_tool_choice",
        "named tool get_weather in tool_choice and got tool_calls None",
    ),
    (
        "ignores-chat-template-kwargs",
        ignores("chat_template_kwargs"),
        None,
        "test_chat_template_kwargs",
        "left the prompt as it was",
    ),
    (
        "ignores-continue-final-message",
        ignores("continue_final_message"),
        None,
        "test_continue_final_message",
        "the final message was not continued",
    ),
]

#: backend name -> what the kit must do with it
BROKEN: dict[str, Broken] = {
    name: Broken(
        _backend(name, cls, options or relayllm.BackendOptions),
        check,
        reason,
    )
    for name, cls, options, check, reason in _CASES
}


@relayllm.hookimpl
def relayllm_register_backends(registry) -> None:
    for broken in BROKEN.values():
        registry.add(broken.backend)
