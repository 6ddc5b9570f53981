"""What every group of the kit's engine checks stands on: what a subclass declares, the
class-scoped deployment, and the two ways a check sends rows (through the real stage, or one
``process_batch`` call straight to the deployment)."""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import pytest

import relayllm
from relayllm.data_context import keep_input_order
from relayllm.rows import INPUT_COLUMN, Request, Result, Task, build_request
from relayllm.testing.contract import BackendContractTests

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
TIMEOUT_S = 600
#: The job id the kit's direct calls carry (the stage sends its run id with every call).
KIT_JOB = "relayllm-conformance-kit"


class KitBase(BackendContractTests):
    """The declarations, fixtures and helpers the engine checks share (no checks here)."""

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
    #: Why this engine has one answer per prompt whatever the temperature (a rule-based or
    #: echoing engine): the check that sampling varies is skipped with this reason, once the
    #: kit has seen that its answers at temperature 1 are the greedy ones.
    greedy_only: ClassVar[str | None] = None
    #: Keyword arguments this model's chat template reads, which change the prompt it renders
    #: (Qwen3's ``{"enable_thinking": False}``, say): the ``chat_template_kwargs`` check sends
    #: them and expects a different prompt length. Needed when the backend declares the
    #: feature, unless :attr:`chat_template_kwargs_untestable` says why there is none.
    chat_template_kwargs_probe: ClassVar[dict[str, Any] | None] = None
    #: Why no keyword argument changes this model's chat template (its template reads none).
    chat_template_kwargs_untestable: ClassVar[str | None] = None

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

    # -- fixtures ----------------------------------------------------------------------------

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

    # -- sending rows ------------------------------------------------------------------------

    def text_task(self) -> Task:
        served = self.served_tasks()
        return "chat" if "chat" in served else "completion"

    def chat_task(self, feature: str) -> Task:
        """``chat``, or a skip saying ``feature`` needs it (tools, a chat template)."""
        if "chat" not in self.served_tasks():
            pytest.skip(f"{feature} needs the chat task; this deployment serves no chat")
        return "chat"

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

    def requests(self, task: Task, texts: list[Any], params: dict[str, Any]) -> list[Request]:
        """One request per text (a chat's whole ``messages`` list may stand for a text)."""
        out, column = [], INPUT_COLUMN[task]
        for text in texts:
            value = text if isinstance(text, list) else self.text_row(task, text)[column]
            params_of_row = {**self.sampling_params, **params}
            request = build_request(task, value, params_of_row, None, None, _new_id())
            assert not isinstance(request, str), request
            out.append(request)
        return out

    def info(self) -> dict[str, Any]:
        return self.deployed().handle().info.remote().result(timeout_s=TIMEOUT_S)

    @staticmethod
    def errors(out: Sequence[Mapping[str, Any]]) -> list[Any]:
        return [r.get("error") for r in out if r.get("error")]

    def _texts(self, results: Sequence[Mapping[str, Any]]) -> list[Any]:
        assert not self.errors(results), self.errors(results)
        return [r.get("generated_text") for r in results]

    # -- what the backend declares -----------------------------------------------------------

    def _feature(self, feature: str) -> None:
        """Returns when the backend declares ``feature``; otherwise checks that a processor
        asking for it is refused before any row is sent (the check a stage runs when it
        starts) and skips, naming the feature."""
        declared = self.served_features()
        if feature in declared:
            return
        from relayllm.deployments import check_task_served

        served = self.served_tasks()
        task = self.text_task() if self.text_task() in served else sorted(served)[0]
        self.deployed()
        try:
            check_task_served(self.deployment_name(), task, features=frozenset({feature}))
        except relayllm.ConfigError as exc:
            assert f"does not support {feature}" in str(exc), str(exc)
        else:
            pytest.fail(
                f"{self.backend} does not declare {feature!r} (Backend.features_for), yet a "
                f"processor asking for it is not refused before its rows are sent: the "
                f"deployment's describe() names no features"
            )
        pytest.skip(
            f"{self.backend} does not declare {feature!r} (Backend.features_for: "
            f"{sorted(declared)}); a processor asking for it is refused up front"
        )

    def _refused(self, results: Sequence[Mapping[str, Any]], name: str) -> str | None:
        """The shared policy's refusal of sampling parameter ``name`` when every row got it
        (``check_sampling_support``: the engine has no such parameter), else None."""
        refused = [e for e in self.errors(results) if f"sampling_params.{name}" in str(e)]
        return str(refused[0]) if refused and len(refused) == len(results) else None


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


def _new_id() -> str:
    return f"kit-{uuid.uuid4().hex}"


def _fresh_ids(requests: list[Request]) -> list[Request]:
    """The same requests under new ids: a new call, not a retry the replica answers once."""
    return [{**r, "request_id": _new_id()} for r in requests]


def _mostly_equal(first: list[Any], again: list[Any], what: str) -> None:
    """At least 3 of 4 answers equal (engines whose numerics differ slightly run to run)."""
    same = sum(a == b for a, b in zip(first, again, strict=True))
    assert same >= math.ceil(0.75 * len(first)), f"{what} got different answers:\n" + _pairs(
        first, again
    )


def _pairs(first: Sequence[Any], again: Sequence[Any]) -> str:
    return "\n".join(f"  {a!r} vs {b!r}" for a, b in zip(first, again, strict=True))


def _logprob(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value <= 1e-6


__all__ = ["DISTINCT_PROMPTS", "KIT_JOB", "TIMEOUT_S", "KitBase"]
