"""How the stage groups rows into calls: ``order_by_prefix`` (rows that share a prompt prefix
travel in the same calls, and the output keeps the input's row order) and ``token_budget``
(calls close at an estimated token count). A probe backend answers each row with the prefixes
its call held and the number of rows in that call."""

import sys

import pytest
import ray

import relayllm
from relayllm import DeploymentConfig, ProcessorConfig, build_processor
from relayllm.adapters import Engine
from relayllm.backend import Backend
from relayllm.plugin import hookimpl, manager

pytestmark = pytest.mark.usefixtures("ray_session")

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Serve ships the class by value

PREFIXES = {key: f"{key} " + "shared few-shot block " * 20 for key in "ABCD"}


class CallProbeEngine(Engine):
    backend_name = "call-probe"

    async def run_batch(self, requests):
        held = "".join(sorted({r["prompt"][0] for r in requests}))
        n = len(requests)
        return [
            {"generated_text": f"{r['prompt'].rsplit(' ', 1)[-1]}:{held}:{n}"} for r in requests
        ]


class CallProbeBackend(Backend):
    name = "call-probe"
    contract_version = 3
    tasks = frozenset({"completion"})

    @classmethod
    def engine_class(cls):
        return CallProbeEngine

    @classmethod
    def deployment_options(cls, options):
        return {"ray_actor_options": {"num_cpus": 0}}


class _Plugin:
    @hookimpl
    def relayllm_register_backends(self, registry):
        registry.add(CallProbeBackend)


@pytest.fixture(scope="module")
def probe(ray_session):
    manager.MANAGER.register(_Plugin(), "tests.bench.call-probe")
    relayllm.deploy(DeploymentConfig(name="call-probe", backend="call-probe"))
    yield
    relayllm.shutdown("call-probe")


def _run(order_by_prefix: bool):
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    # 32 rows, prefixes interleaved A B C D A B ...: 8 rows per prefix, calls of 8 rows.
    rows = [{"id": i, "prompt": f"{PREFIXES['ABCD'[i % 4]]} q{i}"} for i in range(32)]
    config = ProcessorConfig(
        deployment="call-probe",
        task="completion",
        batch_size=8,
        max_in_flight_batches=4,
        order_by_prefix=order_by_prefix,
    )
    return build_processor(config)(ray.data.from_items(rows, override_num_blocks=1)).take_all()


def test_rows_sharing_a_prefix_travel_together_and_keep_their_order(probe):
    out = _run(order_by_prefix=True)
    assert [r["id"] for r in out] == list(range(32))
    assert [r["error"] for r in out] == [None] * 32
    answered, held, _ = zip(*(r["generated_text"].split(":") for r in out), strict=True)
    assert list(answered) == [f"q{i}" for i in range(32)], "each answer on its own row"
    assert set(held) == {"A", "B", "C", "D"}, "every call held one prefix only"
    assert all(h == "ABCD"[r["id"] % 4] for h, r in zip(held, out, strict=True))


def test_without_the_option_calls_mix_prefixes(probe):
    out = _run(order_by_prefix=False)
    assert [r["id"] for r in out] == list(range(32))
    assert {r["generated_text"].split(":")[1] for r in out} == {"ABCD"}


def test_token_budget_sends_long_rows_in_small_calls(probe):
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    # Rows 0-7 short (~3 estimated tokens + 4), rows 8-15 long (~800 characters ~ 200 + 4).
    rows = [{"id": i, "prompt": f"A q{i}"} for i in range(8)]
    rows += [{"id": i, "prompt": "A " + "long words " * 73 + f"q{i}"} for i in range(8, 16)]
    config = ProcessorConfig(
        deployment="call-probe",
        task="completion",
        batch_size=8,
        max_in_flight_batches=2,
        token_budget=450,
        sampling_params={"max_tokens": 4},
    )
    out = build_processor(config)(ray.data.from_items(rows, override_num_blocks=1)).take_all()
    assert [r["id"] for r in out] == list(range(16))
    assert [r["error"] for r in out] == [None] * 16
    answered, _, sizes = zip(*(r["generated_text"].split(":") for r in out), strict=True)
    assert list(answered) == [f"q{i}" for i in range(16)], "each answer on its own row"
    assert sizes[:8] == ("8",) * 8, "short rows fill a call of batch_size"
    assert sizes[8:] == ("2",) * 8, "two long rows (~208 tokens each) fit a budget of 450"


def test_without_a_budget_calls_hold_batch_size_rows(probe):
    rows = [{"id": i, "prompt": "A " + "long words " * 73 + f"q{i}"} for i in range(16)]
    config = ProcessorConfig(deployment="call-probe", task="completion", batch_size=8)
    out = build_processor(config)(ray.data.from_items(rows, override_num_blocks=1)).take_all()
    assert {r["generated_text"].split(":")[2] for r in out} == {"8"}
