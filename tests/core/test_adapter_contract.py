"""The adapter contract is versioned: an adapter written against contract 1 (options read as a
mapping, no declared version) still works, with a deprecation warning; one built for a
contract this relayllm does not implement is refused when it registers, never by error rows."""

from __future__ import annotations

import first_contract_adapter
import pytest
import ray
from first_contract_adapter import FirstBackend

import relayllm
from relayllm import DeploymentConfig, ProcessorConfig, build_processor
from relayllm.backend import AdapterContractWarning

pytestmark = pytest.mark.usefixtures("ray_session")


@pytest.fixture(scope="module")
def first_contract(ray_session):
    from relayllm.plugin import manager

    class Plugin:
        @relayllm.hookimpl
        def relayllm_register_backends(self, registry):
            registry.add(FirstBackend)

    # The replicas cannot import a test module: its classes travel by value.
    ray.cloudpickle.register_pickle_by_value(first_contract_adapter)
    with pytest.warns(AdapterContractWarning):
        manager.MANAGER.register(Plugin(), "first-contract-plugin")
        manager.get_registry()
    ref = relayllm.deploy(
        DeploymentConfig(name="first", backend="first-contract", options={"scale": 2})
    )
    yield ref
    relayllm.shutdown("first")
    manager.MANAGER.unregister("first-contract-plugin")


def test_a_first_contract_adapter_runs_a_two_step_pipeline_without_error_rows(first_contract):
    def ask(row):
        return {**row, "messages": [{"role": "user", "content": row["text"]}]}

    def again(row):
        return {
            "text": row["text"],
            "first": row["generated_text"],
            "messages": [{"role": "user", "content": row["generated_text"]}],
        }

    step1 = build_processor(ProcessorConfig(deployment="first", batch_size=4), preprocess=ask)
    step2 = build_processor(ProcessorConfig(deployment="first", batch_size=4), preprocess=again)
    rows = step2(step1(ray.data.from_items([{"text": f"w{i}"} for i in range(10)]))).take_all()
    assert len(rows) == 10
    assert [r["error"] for r in rows] == [None] * 10
    by_text = {r["text"]: r for r in rows}
    assert by_text["w3"]["first"] == "w3 w3"  # options["scale"] == 2 reached the replica
    assert by_text["w3"]["generated_text"] == "w3 w3 w3 w3"


_NEW = {"engine": "replica"}  # 0.1.0's name of the replica module
