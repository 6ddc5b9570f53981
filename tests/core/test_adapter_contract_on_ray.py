"""The adapter contract across releases, on a real cluster: a contract-2 adapter (the docs'
minimal backend as it was, ``tests/contract2_adapter.py``) runs a two-step pipeline through the
wrapper with no error row and one ``AdapterContractWarning``, and passes the conformance kit; a
contract-1 adapter is refused when it registers, never by error rows; a backend written from
the rewritten ``docs/adapters.md`` alone, in one file (``tests/docs_engine_adapter.py``), passes
the kit."""

from __future__ import annotations

import warnings

import contract2_adapter
import docs_engine_adapter
import first_contract_adapter
import pytest
import ray

import relayllm
from relayllm import DeploymentConfig, ProcessorConfig, build_processor
from relayllm.backend import AdapterContractWarning
from relayllm.errors import IncompatibleAdapterError
from relayllm.testing import BackendConformanceTests

pytestmark = pytest.mark.usefixtures("ray_session")


def _plugin(backend):
    class Plugin:
        @relayllm.hookimpl
        def relayllm_register_backends(self, registry):
            registry.add(backend)

    return Plugin()


@pytest.fixture(scope="module")
def in_code_backends(ray_session):
    """The three fixtures' backends registered in this process; the replicas cannot import a
    test module, so their classes travel by value. Yields the contract warnings registering
    them gave."""
    from relayllm.plugin import manager

    registered = {
        "contract2-plugin": contract2_adapter.ShoutBackend,
        "docs-engine-plugin": docs_engine_adapter.LowerBackend,
        "first-contract-plugin": first_contract_adapter.FirstBackend,
    }
    for module in (contract2_adapter, docs_engine_adapter, first_contract_adapter):
        ray.cloudpickle.register_pickle_by_value(module)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name, backend in registered.items():
            manager.MANAGER.register(_plugin(backend), name)
        manager.get_registry()
    yield [w for w in caught if issubclass(w.category, AdapterContractWarning)]
    for name in registered:
        manager.MANAGER.unregister(name)


def test_a_contract_2_adapter_runs_a_two_step_pipeline_with_one_warning(in_code_backends):
    said = [str(w.message) for w in in_code_backends]
    assert len(said) == 1 and "'shout-v2'" in said[0], said
    assert "relayllm.adapters.Engine" in said[0] and "contract_version = 3" in said[0]
    relayllm.deploy(DeploymentConfig(name="old", backend="shout-v2", options={"suffix": "?"}))
    try:

        def ask(row):
            return {**row, "messages": [{"role": "user", "content": row["text"]}]}

        def again(row):
            return {
                "text": row["text"],
                "first": row["generated_text"],
                "messages": [{"role": "user", "content": row["generated_text"]}],
            }

        with warnings.catch_warnings(record=True) as running:
            warnings.simplefilter("always")
            step1 = build_processor(ProcessorConfig(deployment="old", batch_size=4), ask)
            step2 = build_processor(ProcessorConfig(deployment="old", batch_size=4), again)
            data = ray.data.from_items([{"text": f"w{i} x"} for i in range(10)])
            rows = step2(step1(data)).take_all()
        assert not [w for w in running if issubclass(w.category, AdapterContractWarning)]
        assert len(rows) == 10
        assert [r["error"] for r in rows] == [None] * 10
        by_text = {r["text"]: r for r in rows}
        assert by_text["w3 x"]["first"] == "W3 X?"  # the options reached the replica
        assert by_text["w3 x"]["generated_text"] == "W3 X??"
        info = relayllm.get_deployment("old").handle().info.remote().result(timeout_s=60)
        assert info["rows"] == 20 and info["backend"] == "shout-v2" and info["model"] == "shout"
    finally:
        relayllm.shutdown("old")


def test_a_contract_1_adapter_is_refused_when_it_registers_not_by_error_rows(in_code_backends):
    from relayllm.plugin.manager import get_registry

    reason = get_registry().refused()["first-contract"]
    assert "declares no contract_version (contract 1)" in reason
    assert "upgrade the adapter" in reason
    with pytest.raises(IncompatibleAdapterError, match="upgrade the adapter"):
        relayllm.deploy(DeploymentConfig(name="first", backend="first-contract"))


@pytest.mark.usefixtures("in_code_backends")
class TestContract2AdapterConformance(BackendConformanceTests):
    backend = "shout-v2"
    options = {"suffix": "!!"}
    context_length = 100
    engine_down_untestable = "shout has no engine process a test could stop"
    greedy_only = "shout has one answer per prompt, whatever the temperature"


@pytest.mark.usefixtures("in_code_backends")
class TestEngineFromTheDocsConformance(BackendConformanceTests):
    backend = "lower"
    context_length = docs_engine_adapter.CONTEXT_WORDS
    greedy_only = "the docs' backend has one answer per prompt, whatever the temperature"

    def stop_engine(self, ref):
        ref.handle().stop_engine.remote().result(timeout_s=60)
