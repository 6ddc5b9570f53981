"""The conformance kit: what every adapter must do, inherited in a few lines.

    from relayllm.testing import BackendConformanceTests

    class TestMyBackend(BackendConformanceTests):
        backend = "my-backend"
        distribution = "relayllm-my-backend"   # whose entry point registers it
        options = {"model": "...", "max_model_len": 512}
        context_length = 512                   # how to make the engine refuse one row

        def stop_engine(self, ref):            # or: engine_down_untestable = "<why>"
            ...

It runs the engine-free checks of :class:`~relayllm.testing.BackendContractTests` and these,
against one deployment of the backend (class scope, shared by the tests). They check the
adapter, not core: rows go through the real stage or straight to the deployment's
``process_batch``, and every assertion is about what the engine answered.

- ``test_health_and_info``: ``health()`` is ok, ``info()`` names the backend, the replica and
  the tasks ``Backend.tasks_for(options)`` gives.
- ``test_each_row_gets_its_own_answer``: rows with distinct prompts, answered in one call, get
  the answer the same row gets when sent alone (at least 3 of 4 rows, for engines whose
  batched numerics differ slightly), and per-row ``max_tokens`` budgets that differ from each
  neighbour are each respected: ``num_generated_tokens <= budget``, and ``finish_reason ==
  "length"`` only at exactly the budget. Catches answers put on the wrong row.
- ``test_max_tokens_honoured``: the processor's ``max_tokens`` bounds every row's
  ``num_generated_tokens`` and some row stops for ``length``.

One check per sampling parameter the row protocol promises, each with a property any correct
engine has (answers compared "3 of 4 equal" where engines' numerics may differ run to run):

- ``test_temperature_zero_is_deterministic``: the same rows at ``temperature: 0``, twice, get
  the same answers.
- ``test_seed_makes_sampling_reproducible``: the same rows, each with its own ``seed``, at
  ``temperature: 1``, twice, get the same answers. (Whether different seeds give different
  answers depends on the model: not checked.)
- ``test_small_top_p_is_greedy``: ``top_p: 1e-6`` at ``temperature: 1`` keeps only the most
  likely token: the answers are the ``temperature: 0`` ones.
- ``test_stop_sequences_honoured``: each row stops at a word of its own greedy answer: its
  answer never contains the stop string, and (3 of 4) finishes for ``"stop"``, cut there.
- ``test_n_samples`` (feature ``n``): ``n: 3`` gives three ``samples``, each within
  ``max_tokens``, the first one also in the row's own columns.
- ``test_logprobs_and_top_logprobs`` (feature ``logprobs``): one entry per generated token at
  most, each a token and a logprob <= 0 with ``top_logprobs`` alternatives, most likely first.
- ``test_response_format_json_schema`` (feature ``structured_outputs.json``): answers that
  finish are JSON matching the schema.
- ``test_structured_output_choice`` (feature ``structured_outputs.choice``): every answer is
  one of the choices.
- ``test_presence_penalty_honoured`` / ``test_frequency_penalty_honoured``: a penalty of 2
  changes the greedy answer to a prompt that invites repetition (one of three). An adapter
  whose engine has no such penalty refuses it with the shared policy's error
  (:func:`relayllm.adapters.check_sampling_support`), and the check is skipped with it.

A check on an optional feature runs only when ``Backend.features_for(options)`` declares the
feature, and is skipped with that reason otherwise.

- ``test_engine_refusal_fails_only_that_row``: one row the engine refuses (see
  :meth:`refused_row`; by default a prompt longer than :attr:`context_length`) gets an error;
  the other rows of the same call get answers. An engine that refuses no row declares
  :attr:`refuses_no_rows` (the reason) instead; declaring none of the three fails, saying
  what to add.
- ``test_chat`` / ``test_completion`` / ``test_embedding``: each task ``tasks_for`` serves
  works (embeddings: one dimension, finite, equal for equal inputs, different for different
  inputs); a task it does not serve is refused by the check a stage runs before sending any
  row, naming backend and task.
- ``test_rows_of_one_call_run_concurrently``: 8 rows sent as one call take less than 3 times
  (plus 0.5 s) what the same rows take as 8 one-row calls sent at once: the engine saw the rows
  of the call together (equal work under equal load, so a busy machine does not fail it).
- ``test_retried_call_is_not_computed_twice``: the same call sent twice at once (a retry after
  a caller-side timeout) is computed once (the replica's ``rows`` grows by one call's rows)
  and both get the same answers, even with ``temperature: 1``.
- ``test_two_sequential_processors_share_one_deployment``: two processors, one replica.
- ``test_health_reports_engine_down``: after :meth:`stop_engine`, ``health()`` fails (or a
  new replica answers it: Serve's health check, the same call, failed first). An
  adapter that cannot stop its engine from a test declares :attr:`engine_down_untestable`
  (the reason) and the check is skipped with it; defining neither fails, saying what to add.
- ``test_undeploy``: shutdown removes the deployment.

A standard test may be overridden only to mark it ``@pytest.mark.xfail(strict=True,
reason=...)``; the guard ``test_no_silent_overrides`` fails anything else, and a class-level
skip is an error at collection.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import pytest

import relayllm
from relayllm.data_context import keep_input_order
from relayllm.rows import INPUT_COLUMN, Request, Result, Task, build_request
from relayllm.testing.contract import HEAVY_MODULES, BackendContractTests, standard_tests

#: Prompts whose answers differ from one another (so an answer on the wrong row shows).
DISTINCT_PROMPTS = (
    "What is the capital of France?",
    "Name three colors of the rainbow.",
    "Count from one to five in words.",
    "Translate 'good morning' into Spanish.",
    "What is two plus two? Explain briefly.",
    "Write one sentence about the ocean.",
    "Spell the word 'elephant' letter by letter.",
    "Which planet is the largest in our solar system?",
)
#: Per-row max_tokens: every row's budget differs from both neighbours'.
BUDGETS = (1, 4, 2, 5, 3, 6, 2, 4)
#: Prompts a structured answer fits (checked against :data:`PLACE_SCHEMA`).
JSON_PROMPTS = (
    "In JSON: which city is the Eiffel Tower in, and in which year was it built?",
    "In JSON: which city is the Colosseum in, and in which year was it finished?",
    "In JSON: which city hosted the 2012 Olympic Games, and in which year?",
    "In JSON: which city is the Golden Gate Bridge in, and in which year did it open?",
)
PLACE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "year": {"type": "integer"}},
    "required": ["city", "year"],
    "additionalProperties": False,
}
#: Prompts that invite a repetitive answer (a presence or frequency penalty changes it).
REPEAT_PROMPTS = (
    "Repeat after me: apple apple apple apple apple apple apple apple apple apple",
    "Say the word go eight times: go go go go go go go go",
    "Continue the pattern: la la la la la la la la la la la la",
)
TIMEOUT_S = 600
#: The job id the kit's direct calls carry (the stage sends its run id with every call).
KIT_JOB = "relayllm-conformance-kit"


class BackendConformanceTests(BackendContractTests):
    """Subclass, set :attr:`backend` (and :attr:`distribution`, :attr:`options`), say how the
    engine refuses a row (:attr:`context_length`, :meth:`refused_row` or
    :attr:`refuses_no_rows`) and how a test stops it (:meth:`stop_engine` or
    :attr:`engine_down_untestable`)."""

    #: Extra DeploymentConfig fields (startup_timeout_s, ...). One replica: the concurrency and
    #: retry checks read one replica's counters.
    deployment_fields: ClassVar[dict[str, Any]] = {}
    #: Sampling params every kit processor sends (greedy, so answers are reproducible).
    sampling_params: ClassVar[dict[str, Any]] = {"temperature": 0.0}
    processor_fields: ClassVar[dict[str, Any]] = {"batch_size": 8}
    #: The engine's context length in tokens: the default :meth:`refused_row` exceeds it.
    context_length: ClassVar[int | None] = None
    #: Why this engine refuses no row (an engine with no context limit, say): declare it
    #: instead of :attr:`context_length` or :meth:`refused_row`, and the refusal check is
    #: skipped with this reason.
    refuses_no_rows: ClassVar[str | None] = None
    #: How long after :meth:`stop_engine` ``health()`` may still report the engine up.
    engine_down_within_s: ClassVar[float] = 30.0
    #: Why a test cannot stop this engine under a running deployment (no engine process, a
    #: remote endpoint...): declare it when you define no :meth:`stop_engine`, and the
    #: engine-down check is skipped with this reason.
    engine_down_untestable: ClassVar[str | None] = None

    # -- what an adapter may declare -----------------------------------------------------------

    def refused_row(self, task: Task) -> dict[str, Any]:
        """A row this engine refuses (the engine, not relayllm's row checks). Default: a
        prompt of ``context_length + 1`` words (each at least one token)."""
        if self.context_length is None:
            pytest.fail(
                f"{type(self).__name__}: declare context_length, override refused_row(task), "
                f"or, if the engine refuses no row, set refuses_no_rows = '<why>', so the kit "
                f"can check that a row the engine refuses fails alone"
            )
        return self.text_row(task, "apple " * (self.context_length + 1))

    stop_engine: ClassVar[Any] = None
    """Define ``def stop_engine(self, ref)`` to stop the engine under a running deployment
    (kill its process, say), so the kit can check that ``health()`` reports it down; or declare
    :attr:`engine_down_untestable`."""

    # -- fixtures and helpers ------------------------------------------------------------------

    @classmethod
    def deployment_name(cls) -> str:
        return f"kit-{cls.backend}"

    @classmethod
    def deployment_config(cls) -> relayllm.DeploymentConfig:
        return relayllm.DeploymentConfig(
            name=cls.deployment_name(),
            backend=cls.backend,
            options=cls.options,
            **cls.deployment_fields,
        )

    @pytest.fixture(scope="class")
    @classmethod
    def ray_cluster(cls):
        import ray

        if not ray.is_initialized():
            # "local": a cluster of the test's own, never one already running on the machine.
            ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        yield ray

    @pytest.fixture(scope="class")
    @classmethod
    def deployment(cls, ray_cluster):
        ref = relayllm.deploy(cls.deployment_config())
        yield ref
        if any(r.name == ref.name for r in relayllm.list_deployments()):
            relayllm.shutdown(ref.name)

    def deployed(self) -> relayllm.DeploymentRef:
        """The kit's deployment, started again if an earlier test shut it down."""
        return relayllm.deploy(self.deployment_config())

    def text_task(self) -> Task:
        served = self.served_tasks()
        return "chat" if "chat" in served else "completion"

    def processor(self, task: Task = "chat", **fields: Any) -> relayllm.Processor:
        params = {**self.sampling_params, **fields.pop("sampling_params", {})}
        config = relayllm.ProcessorConfig(
            deployment=self.deployment_name(),
            task=task,
            sampling_params=params,
            **{**self.processor_fields, **fields},
        )
        return relayllm.build_processor(config)

    @staticmethod
    def text_row(task: Task, text: str, **extra: Any) -> dict[str, Any]:
        value: Any = [{"role": "user", "content": text}] if task == "chat" else text
        return {INPUT_COLUMN[task]: value, **extra}

    def rows(self, n: int, task: Task = "chat") -> list[dict[str, Any]]:
        """Row i asks with i+1 repetitions of a word, so input token counts grow with i."""
        return [
            self.text_row(task, "Say hello. " + " ".join(["apple"] * (i + 1)), id=i)
            for i in range(n)
        ]

    def run(
        self, processor: relayllm.Processor, rows: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        import ray

        keep_input_order()
        return processor(ray.data.from_items(rows, override_num_blocks=1)).take_all()

    def call(self, requests: list[Request]) -> list[Result]:
        """One ``process_batch`` call, straight to the deployment (no stage in between), with
        a job id as the stage sends one."""
        handle = self.deployed().handle()
        return handle.process_batch.remote(requests, job=KIT_JOB).result(timeout_s=TIMEOUT_S)

    def requests(self, task: Task, texts: list[str], params: dict[str, Any]) -> list[Request]:
        out = []
        for text in texts:
            row = self.text_row(task, text)
            params_of_row = {**self.sampling_params, **params}
            request = build_request(
                task, row[INPUT_COLUMN[task]], params_of_row, None, None, f"kit-{uuid.uuid4().hex}"
            )
            assert not isinstance(request, str), request
            out.append(request)
        return out

    def info(self) -> dict[str, Any]:
        return self.deployed().handle().info.remote().result(timeout_s=TIMEOUT_S)

    @staticmethod
    def errors(out: Sequence[Mapping[str, Any]]) -> list[Any]:
        return [r.get("error") for r in out if r.get("error")]

    # -- checks with a running engine ----------------------------------------------------------

    def test_health_and_info(self, deployment):
        handle = self.deployed().handle()
        assert handle.health.remote().result(timeout_s=TIMEOUT_S)["ok"] is True
        info = self.info()
        assert info["backend"] == self.backend
        assert info["replica_id"]
        assert sorted(info["tasks"]) == sorted(self.served_tasks()), info["tasks"]

    def test_each_row_gets_its_own_answer(self, deployment):
        task = self.text_task()
        texts = list(DISTINCT_PROMPTS)
        alone = [self.call(self.requests(task, [t], {"max_tokens": 6}))[0] for t in texts]
        together = self.call(self.requests(task, texts, {"max_tokens": 6}))
        assert not self.errors(alone + together), self.errors(alone + together)
        answers = [r["generated_text"] for r in alone]
        assert len(set(answers)) >= len(texts) // 2, (
            f"distinct prompts got too few distinct answers to tell rows apart: {answers}"
        )
        pairs = list(zip(alone, together, strict=True))
        same = sum(a["generated_text"] == b["generated_text"] for a, b in pairs)
        assert same >= math.ceil(0.75 * len(texts)), (
            "answers in one call differ from the same rows sent alone (on the wrong row?):\n"
            + "\n".join(
                f"  {a['generated_text']!r} vs {b['generated_text']!r}"
                for a, b in zip(alone, together, strict=True)
            )
        )

        rows = [
            self.text_row(task, t, id=i, sampling_params={"max_tokens": b})
            for i, (t, b) in enumerate(zip(texts, BUDGETS, strict=False))
        ]
        out = self.run(self.processor(task, batch_size=len(rows)), rows)
        assert [r["id"] for r in out] == list(range(len(rows)))
        assert not self.errors(out), self.errors(out)
        for row, budget in zip(out, BUDGETS, strict=False):
            generated, finish = row["num_generated_tokens"], row["finish_reason"]
            assert isinstance(generated, int) and 0 < generated <= budget, (
                f"row {row['id']} (max_tokens {budget}) generated {generated} tokens"
            )
            assert finish in ("stop", "length"), finish
            assert finish != "length" or generated == budget, (
                f"row {row['id']} stopped for length at {generated} tokens, its budget is {budget}"
            )
        assert any(r["finish_reason"] == "length" for r in out), "no row reached its budget"

    def test_max_tokens_honoured(self, deployment):
        task = self.text_task()
        rows = [
            self.text_row(task, t + " Answer at length.", id=i)
            for i, t in enumerate(DISTINCT_PROMPTS)
        ]
        out = self.run(self.processor(task, sampling_params={"max_tokens": 3}), rows)
        assert not self.errors(out), self.errors(out)
        counts = [r["num_generated_tokens"] for r in out]
        assert all(isinstance(c, int) and 0 < c <= 3 for c in counts), counts
        assert any(r["finish_reason"] == "length" for r in out), [r["finish_reason"] for r in out]

    # -- the sampling parameters the row protocol promises ---------------------------------------

    def test_temperature_zero_is_deterministic(self, deployment):
        task = self.text_task()
        params = {"temperature": 0.0, "max_tokens": 12}
        texts = [t + " Answer at length." for t in DISTINCT_PROMPTS]
        first, again = (self._texts(self.call(self.requests(task, texts, params))) for _ in "12")
        _mostly_equal(first, again, "the same rows at temperature 0, sent twice")

    def test_seed_makes_sampling_reproducible(self, deployment):
        # Each row its own seed, at temperature 1: the same call twice gives the same answers.
        # (Different seeds giving different answers depends on the model: not checked.)
        task = self.text_task()
        texts = [t + " Answer at length." for t in DISTINCT_PROMPTS]
        requests = self.requests(task, texts, {"temperature": 1.0, "max_tokens": 12})
        for i, request in enumerate(requests):
            request["sampling_params"] = {**request["sampling_params"], "seed": 1234 + i}
        first, again = (self._texts(self.call(_fresh_ids(requests))) for _ in "12")
        _mostly_equal(first, again, "the same seeded rows at temperature 1, sent twice")

    def test_small_top_p_is_greedy(self, deployment):
        # A nucleus this small holds only the most likely token: sampling at temperature 1
        # then gives the greedy (temperature 0) answer.
        task = self.text_task()
        texts = [t + " Answer at length." for t in DISTINCT_PROMPTS]
        greedy = self._texts(self.call(self.requests(task, texts, {"max_tokens": 12})))
        params = {"temperature": 1.0, "top_p": 1e-6, "max_tokens": 12}
        nucleus = self._texts(self.call(self.requests(task, texts, params)))
        _mostly_equal(greedy, nucleus, "temperature 0 vs temperature 1 with top_p 1e-6")

    def test_stop_sequences_honoured(self, deployment):
        # Each row stops at a word of its own greedy answer: the answer then ends before the
        # stop string, never contains it, and finishes for "stop".
        task = self.text_task()
        texts = list(DISTINCT_PROMPTS)
        full = self._texts(self.call(self.requests(task, texts, {"max_tokens": 16})))
        stops = [_stop_string(text) for text in full]
        assert sum(s is not None for s in stops) >= 2, (
            f"the greedy answers are too short to pick stop strings from: {full}"
        )
        rows = [
            self.text_row(task, t, id=i, sampling_params={"stop": [s]} if s else {})
            for i, (t, s) in enumerate(zip(texts, stops, strict=True))
        ]
        processor = self.processor(task, batch_size=len(rows), sampling_params={"max_tokens": 16})
        out = self.run(processor, rows)
        assert not self.errors(out), self.errors(out)
        stopped = [(r, s, f) for r, s, f in zip(out, stops, full, strict=True) if s]
        for row, stop, _ in stopped:
            assert stop not in (row["generated_text"] or ""), (
                f"row {row['id']} has stop {[stop]} but its answer contains it: "
                f"{row['generated_text']!r}"
            )
        cut = [
            r["finish_reason"] == "stop" and f.startswith(r["generated_text"] or "")
            for r, _, f in stopped
        ]
        assert sum(cut) >= math.ceil(0.75 * len(stopped)), (
            "rows with a stop string from their own greedy answer did not end there "
            "(finish_reason 'stop', the greedy answer cut before the stop string):\n"
            + "\n".join(
                f"  stop {s!r}: {r['generated_text']!r} ({r['finish_reason']}) vs {f!r}"
                for r, s, f in stopped
            )
        )

    def test_n_samples(self, deployment):
        self._feature("n")
        task = self.text_task()
        params = {"n": 3, "temperature": 1.0, "max_tokens": 6}
        rows = [self.text_row(task, t, id=i) for i, t in enumerate(DISTINCT_PROMPTS[:4])]
        out = self.run(self.processor(task, sampling_params=params), rows)
        assert not self.errors(out), self.errors(out)
        for row in out:
            samples = row.get("samples")
            assert isinstance(samples, list) and len(samples) == 3, (
                f"row {row['id']} asked for n=3 and got samples {samples!r}"
            )
            for sample in samples:
                assert isinstance(sample.get("generated_text"), str), sample
                assert sample.get("finish_reason") in ("stop", "length"), sample
                count = sample.get("num_generated_tokens")
                assert count is None or count <= 6, f"a sample over max_tokens 6: {sample}"
            assert row["generated_text"] == samples[0]["generated_text"], (
                "the row's own generated_text is not its first sample's"
            )

    def test_logprobs_and_top_logprobs(self, deployment):
        self._feature("logprobs")
        task = self.text_task()
        top = 2
        asked: dict[str, Any] = (
            {"logprobs": True, "top_logprobs": top} if task == "chat" else {"logprobs": top}
        )
        rows = [self.text_row(task, t, id=i) for i, t in enumerate(DISTINCT_PROMPTS[:4])]
        out = self.run(self.processor(task, sampling_params={**asked, "max_tokens": 4}), rows)
        assert not self.errors(out), self.errors(out)
        for row in out:
            entries = row.get("logprobs")
            assert isinstance(entries, list) and entries, (
                f"row {row['id']} asked for {asked} and got logprobs {entries!r}"
            )
            assert len(entries) <= row["num_generated_tokens"], (
                f"{len(entries)} logprobs entries for {row['num_generated_tokens']} tokens"
            )
            for entry in entries:
                assert isinstance(entry.get("token"), str), entry
                assert _logprob(entry.get("logprob")), entry
                alternatives = entry.get("top_logprobs") or []
                assert len(alternatives) == top, (
                    f"top_logprobs {top} asked, an entry lists {len(alternatives)}: {entry}"
                )
                values = [a.get("logprob") for a in alternatives]
                assert all(_logprob(v) for v in values), entry
                assert all(a >= b - 1e-6 for a, b in itertools.pairwise(values)), (
                    f"top_logprobs not most likely first: {entry}"
                )

    def test_response_format_json_schema(self, deployment):
        self._feature("structured_outputs.json")
        task = self.text_task()
        params = {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "place", "schema": PLACE_SCHEMA},
            },
            "max_tokens": 64,
        }
        rows = [self.text_row(task, t, id=i) for i, t in enumerate(JSON_PROMPTS)]
        out = self.run(self.processor(task, sampling_params=params), rows)
        assert not self.errors(out), self.errors(out)
        finished = [r for r in out if r["finish_reason"] == "stop"]
        assert finished, (
            f"no row finished its JSON within 64 tokens: {[r['generated_text'] for r in out]}"
        )
        for row in finished:
            problem = _against_place_schema(row["generated_text"])
            assert problem is None, (
                f"row {row['id']} asked for a JSON schema and answered {row['generated_text']!r}: "
                f"{problem}"
            )

    def test_structured_output_choice(self, deployment):
        self._feature("structured_outputs.choice")
        task = self.text_task()
        choices = ["yes", "no"]
        params = {"structured_outputs": {"choice": choices}, "max_tokens": 8}
        texts = ["Is the sky blue? Answer yes or no.", "Is fire cold? Answer yes or no."]
        rows = [self.text_row(task, t, id=i) for i, t in enumerate(texts)]
        out = self.run(self.processor(task, sampling_params=params), rows)
        assert not self.errors(out), self.errors(out)
        answers = [r["generated_text"] for r in out]
        assert all((a or "").strip() in choices for a in answers), (
            f"choices {choices} asked, answers {answers}"
        )

    def test_presence_penalty_honoured(self, deployment):
        self._penalty_check("presence_penalty")

    def test_frequency_penalty_honoured(self, deployment):
        self._penalty_check("frequency_penalty")

    def _penalty_check(self, name: str) -> None:
        """A strong penalty changes the greedy answer to a prompt that invites repetition
        (on at least one of three). An adapter whose engine has no such penalty refuses it
        with the shared policy's error (``check_sampling_support``): then nothing to check."""
        task = self.text_task()
        plain = self.call(self.requests(task, list(REPEAT_PROMPTS), {"max_tokens": 16}))
        params = {name: 2.0, "max_tokens": 16}
        penalised = self.call(self.requests(task, list(REPEAT_PROMPTS), params))
        refused = [e for e in self.errors(penalised) if f"sampling_params.{name}" in str(e)]
        if refused and len(refused) == len(penalised):
            pytest.skip(f"{self.backend} refuses {name} (the shared policy): {refused[0]}")
        assert not self.errors(plain + penalised), self.errors(plain + penalised)
        before, after = self._texts(plain), self._texts(penalised)
        assert before != after, (
            f"{name} 2.0 changed no answer to prompts that invite repetition: {after}"
        )

    def _feature(self, feature: str) -> None:
        if feature not in self.served_features():
            pytest.skip(
                f"{self.backend} does not declare {feature!r} (Backend.features_for: "
                f"{sorted(self.served_features())})"
            )

    def _texts(self, results: Sequence[Mapping[str, Any]]) -> list[Any]:
        assert not self.errors(results), self.errors(results)
        return [r.get("generated_text") for r in results]

    def test_engine_refusal_fails_only_that_row(self, request):
        # The declarations are checked before the deployment starts (no engine needed).
        declared = _declared(self, "refuses_no_rows")
        refusal_given = self.context_length is not None or (
            type(self).refused_row is not BackendConformanceTests.refused_row
        )
        if declared:
            assert not refusal_given, (
                f"{type(self).__name__} declares refuses_no_rows and also how its engine "
                f"refuses a row (context_length or refused_row): keep one"
            )
            pytest.skip(f"refuses_no_rows: {declared}")
        if not refusal_given:
            self.refused_row(self.text_task())  # fails, saying what to declare
        request.getfixturevalue("deployment")
        task = self.text_task()
        rows = [self.text_row(task, t, id=i) for i, t in enumerate(DISTINCT_PROMPTS[:6])]
        rows.insert(2, {**self.refused_row(task), "id": "refused"})
        processor = self.processor(task, batch_size=len(rows), sampling_params={"max_tokens": 4})
        out = self.run(processor, rows)
        by_id = {r["id"]: r for r in out}
        assert by_id["refused"]["error"], "the row the engine should refuse got no error"
        others = [r for r in out if r["id"] != "refused"]
        assert not self.errors(others), (
            f"a refusal of one row failed others of its call: {self.errors(others)}"
        )
        assert all(isinstance(r["generated_text"], str) and r["generated_text"] for r in others)

    def _task_check(self, task: str) -> bool:
        """True if the deployment serves ``task``; else checks that it is refused before any
        row is sent -- the check a stage runs when it starts -- naming backend and task."""
        if task in self.served_tasks():
            return True
        from relayllm.deployments import check_task_served

        self.deployed()
        with pytest.raises(relayllm.ConfigError, match=rf"does not serve task '{task}'") as caught:
            check_task_served(self.deployment_name(), task)
        assert f"backend {self.backend!r}" in str(caught.value)
        return False

    def test_chat(self, deployment):
        if self._task_check("chat"):
            out = self.run(self.processor("chat", sampling_params={"max_tokens": 4}), self.rows(4))
            assert not self.errors(out), self.errors(out)
            assert all(r["generated_text"] and r["num_generated_tokens"] > 0 for r in out), out

    def test_completion(self, deployment):
        if self._task_check("completion"):
            out = self.run(
                self.processor("completion", sampling_params={"max_tokens": 4}),
                self.rows(4, "completion"),
            )
            assert not self.errors(out), self.errors(out)
            assert all(r["generated_text"] and r["num_generated_tokens"] > 0 for r in out), out

    def test_embedding(self, deployment):
        if not self._task_check("embedding"):
            return
        texts = [
            "The cat sat on the mat.",
            "Stock prices fell sharply today.",
            "A recipe for tomato soup.",
            "The cat sat on the mat.",
        ]
        rows = [self.text_row("embedding", t, id=i) for i, t in enumerate(texts)]
        out = self.run(self.processor("embedding"), rows)
        assert not self.errors(out), self.errors(out)
        vectors = [list(r["embedding"]) for r in out]
        assert len({len(v) for v in vectors}) == 1 and vectors[0], [len(v) for v in vectors]
        assert all(math.isfinite(x) for v in vectors for x in v)
        assert _close(vectors[0], vectors[3]), "equal inputs got different embeddings"
        for i in range(3):
            for j in range(i + 1, 3):
                assert not _close(vectors[i], vectors[j]), f"inputs {i} and {j} got one embedding"

    def test_rows_of_one_call_run_concurrently(self, deployment):
        # The same 8 rows, once as one call and once as 8 one-row calls sent at once (which
        # the replica serves concurrently whatever the adapter does). Equal work under equal
        # load, back to back: only an adapter that serves a call's rows in turn makes the one
        # call several times slower. Best of two rounds each, against a noisy machine.
        task = self.text_task()
        params = {"max_tokens": 16}
        handle = self.deployed().handle()
        texts = list(DISTINCT_PROMPTS)
        self.call(self.requests(task, texts[:1], params))  # warm-up
        one_call, separate = [], []
        for _ in range(2):
            started = time.monotonic()
            self.call(self.requests(task, texts, params))
            one_call.append(time.monotonic() - started)
            started = time.monotonic()
            calls = [handle.process_batch.remote(self.requests(task, [t], params)) for t in texts]
            for response in calls:
                response.result(timeout_s=TIMEOUT_S)
            separate.append(time.monotonic() - started)
        together, apart = min(one_call), min(separate)
        assert together < 3 * apart + 0.5, (
            f"{len(texts)} rows took {together:.2f}s in one call but {apart:.2f}s as separate "
            f"calls at once: the adapter serves the rows of a call one after another instead of "
            f"handing them to the engine together"
        )

    def test_retried_call_is_not_computed_twice(self, deployment):
        task = self.text_task()
        params = {"temperature": 1.0, "max_tokens": 8}  # a recomputation would differ
        requests = self.requests(task, list(DISTINCT_PROMPTS[:4]), params)
        handle = self.deployed().handle()
        before = self.info()["rows"]
        first = handle.process_batch.remote(requests, job=KIT_JOB)
        again = handle.process_batch.remote(requests, job=KIT_JOB)  # a timed-out call's retry
        answers = [first.result(timeout_s=TIMEOUT_S), again.result(timeout_s=TIMEOUT_S)]
        later = handle.process_batch.remote(requests, job=KIT_JOB).result(timeout_s=TIMEOUT_S)
        computed = self.info()["rows"] - before
        assert computed == len(requests), (
            f"{len(requests)} rows sent three times were computed {computed} times over"
        )
        texts = [[r.get("generated_text") for r in a] for a in (*answers, later)]
        assert texts[0] == texts[1] == texts[2], texts

    def test_two_sequential_processors_share_one_deployment(self, deployment):
        import ray

        task = self.text_task()
        before = self.info()
        first, second = (self.processor(task, sampling_params={"max_tokens": 4}) for _ in range(2))

        keep_input_order()
        # A module-level function: a closure over the test instance would ship the adapter's
        # test module (and its helpers) to the Ray workers.
        ds = first(ray.data.from_items(self.rows(8, task))).map(functools.partial(_follow_up, task))
        out = second(ds).take_all()
        after = self.info()
        assert [r["id"] for r in out] == list(range(8))
        assert not self.errors(out), self.errors(out)
        assert all(isinstance(r["first_answer"], str) for r in out)
        assert after["replica_id"] == before["replica_id"], "a second replica or engine started"
        assert after["rows"] - before["rows"] == 16, "both processors' rows go to the one replica"

    def test_health_reports_engine_down(self, request):
        # The declarations are checked before the deployment starts (no engine needed).
        declared = _declared(self, "engine_down_untestable")
        if self.stop_engine is None:
            if declared:
                pytest.skip(f"engine_down_untestable: {declared}")
            pytest.fail(
                f"{type(self).__name__} defines no stop_engine(self, ref): define it to stop "
                f"the engine under the running deployment (the kit then checks that health() "
                f"reports it down), or declare engine_down_untestable = '<why a test cannot "
                f"stop this engine>'"
            )
        assert not declared, (
            f"{type(self).__name__} defines stop_engine and declares engine_down_untestable: "
            f"keep one"
        )
        request.getfixturevalue("deployment")
        ref = self.deployed()
        handle = ref.handle()
        # An adapter's own info() or health() may not name the replica: then only a failing
        # health() counts, as before.
        stopped = handle.info.remote().result(timeout_s=120).get("replica_id")
        self.stop_engine(ref)
        deadline = time.monotonic() + self.engine_down_within_s
        while True:
            try:
                health = handle.health.remote().result(timeout_s=60)
            except Exception:  # health() raising is how a replica reports a dead engine
                break
            if stopped is not None and health.get("replica_id") not in (None, stopped):
                # Serve's own health check (the same call) failed first and a new replica
                # took the stopped one's place: the engine was reported down.
                break
            assert time.monotonic() < deadline, f"health() still reports {health} after stop_engine"
            time.sleep(1)
        # test_undeploy, next, removes the deployment whose engine was stopped.

    def test_undeploy(self, deployment):
        running = {r.name: r for r in relayllm.list_deployments()}
        # Not deployed() when it runs: its engine may have been stopped by the test before.
        ref = running.get(self.deployment_name()) or self.deployed()
        assert ref.name in [r.name for r in relayllm.list_deployments()]
        assert relayllm.shutdown(ref.name) == [ref.name]
        assert ref.name not in [r.name for r in relayllm.list_deployments()]
        with pytest.raises(relayllm.DeploymentNotFoundError, match=ref.name):
            relayllm.get_deployment(ref.name)


def _follow_up(task: Task, row: dict[str, Any]) -> dict[str, Any]:
    """The second processor's row: asks about the first one's answer."""
    return {
        "id": row["id"],
        "first_answer": row["generated_text"],
        **BackendConformanceTests.text_row(task, "Shorter: " + (row["generated_text"] or "")),
    }


def _declared(test: Any, name: str) -> str | None:
    """The reason a kit subclass declares in attribute ``name``, or None."""
    value = getattr(type(test), name, None)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        pytest.fail(
            f"{type(test).__name__}.{name} = {value!r}: declare it as the reason, a non-empty "
            f"string ({name} = '<why>')"
        )
    return value


def _fresh_ids(requests: list[Request]) -> list[Request]:
    """The same requests under new ids: a new call, not a retry the replica answers once."""
    return [{**r, "request_id": f"kit-{uuid.uuid4().hex}"} for r in requests]


def _mostly_equal(first: list[Any], again: list[Any], what: str) -> None:
    """At least 3 of 4 answers equal (engines whose numerics differ slightly run to run)."""
    same = sum(a == b for a, b in zip(first, again, strict=True))
    assert same >= math.ceil(0.75 * len(first)), f"{what} got different answers:\n" + "\n".join(
        f"  {a!r} vs {b!r}" for a, b in zip(first, again, strict=True)
    )


def _stop_string(text: Any) -> str | None:
    """A word of ``text`` (not its first or last) whose first occurrence is where it stands:
    stopping there cuts the text at that word."""
    if not isinstance(text, str):
        return None
    words = list(re.finditer(r"\S+", text))
    for word in words[1:-1]:
        if len(word.group()) >= 2 and text.find(word.group()) == word.start():
            return word.group()
    return None


def _logprob(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value <= 1e-6


def _against_place_schema(text: Any) -> str | None:
    """Why ``text`` is not a JSON instance of :data:`PLACE_SCHEMA`, or None."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError) as exc:
        return f"not JSON ({exc})"
    if not isinstance(value, dict):
        return "not a JSON object"
    if set(value) != set(PLACE_SCHEMA["required"]):
        return f"keys {sorted(value)}, the schema has exactly {PLACE_SCHEMA['required']}"
    if not isinstance(value["city"], str):
        return "city is not a string"
    if not isinstance(value["year"], int) or isinstance(value["year"], bool):
        return "year is not an integer"
    return None


def _close(a: list[float], b: list[float]) -> bool:
    scale = max(1e-6, max(abs(x) for x in a + b))
    return len(a) == len(b) and all(abs(x - y) <= 1e-3 * scale for x, y in zip(a, b, strict=True))


STANDARD_TESTS = tuple(standard_tests(BackendConformanceTests))

__all__ = ["HEAVY_MODULES", "STANDARD_TESTS", "BackendConformanceTests"]
