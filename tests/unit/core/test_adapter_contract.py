"""The adapter contract is versioned, checked at registration without a cluster: contract 3
(an Engine) registers silently, a contract-2 adapter (a BatchDeployment subclass) registers
with one warning saying what to change and runs through the wrapper, contract 1 and contracts
newer than this relayllm are refused when they register, never by error rows (serving rows:
tests/core/test_adapter_contract_on_ray.py)."""

from __future__ import annotations

import asyncio
import sys
import warnings

import pytest
from contract2_adapter import ShoutBackend as Contract2Backend
from contract2_adapter import ShoutDeployment, ShoutOptions
from first_contract_adapter import FirstBackend

import relayllm
from relayllm.backend import AdapterContractWarning, BackendRegistry
from relayllm.errors import IncompatibleAdapterError
from relayllm.plugin import CONTRACT_VERSION, OLDEST_CONTRACT_VERSION
from relayllm.serving.engine import CAPABILITIES, Engine
from relayllm.serving.replica import Replica

# Registered for each test and removed after it (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("echo_backend")


def _backend(version: int | None) -> type[relayllm.Backend]:
    return type(f"Backend{version}", (FirstBackend,), {"contract_version": version})


def test_the_contract_is_3_and_2_still_works():
    assert (CONTRACT_VERSION, OLDEST_CONTRACT_VERSION) == (3, 2)


def test_a_contract_2_adapter_registers_with_one_warning_saying_what_to_change():
    registry = BackendRegistry()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        registry.add(Contract2Backend)
    said = [str(w.message) for w in caught if issubclass(w.category, AdapterContractWarning)]
    assert len(said) == 1, said
    for advice in ("relayllm.adapters.Engine", "engine_class()", "contract_version = 3"):
        assert advice in said[0]
    assert registry.get("shout-v2") is Contract2Backend


def test_the_current_contract_registers_silently():
    from relayllm_shout.plugin import ShoutBackend

    registry = BackendRegistry()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        registry.add(ShoutBackend)
    assert ShoutBackend.contract_version == CONTRACT_VERSION


@pytest.mark.parametrize(
    ("version", "advice"),
    [
        (CONTRACT_VERSION + 1, "upgrade relayllm"),
        (1, "upgrade the adapter"),
        (None, "declares no contract_version (contract 1)"),
    ],
)
def test_an_incompatible_adapter_is_refused_when_it_registers(version, advice):
    registry = BackendRegistry()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # refused, not warned about
        registry.add(_backend(version))
    assert "first-contract" not in registry
    assert advice in registry.refused()["first-contract"]
    with pytest.raises(IncompatibleAdapterError, match="upgrade"):
        registry.get("first-contract")


def _row(text: str, rid: str) -> dict:
    return {"task": "completion", "prompt": text, "sampling_params": {}, "request_id": rid}


def test_a_contract_2_replica_serves_through_the_wrapper_with_the_parts_of_contract_3():
    async def scenario():
        old = ShoutDeployment(ShoutOptions(suffix="?"), {"name": "old"})
        rows = [_row("a b", "r1"), _row("c", "r2")]
        first = await old.process_batch(rows)
        again = await old.process_batch(rows)  # a retry: answered from the row cache
        assert [r["generated_text"] for r in first] == ["A B?", "C?"]
        assert again == first and old.rows == 2 and old.calls == 2
        info = await old.info()
        assert (info["backend"], info["model"], info["rows"]) == ("shout-v2", "shout", 2)
        refused = (await old.control_refusals())["refused"]
        assert set(refused) == set(CAPABILITIES)  # it overrides no engine_* hook

    asyncio.run(scenario())


def test_a_contract_2_hook_is_a_capability_and_its_refusal_is_kept():
    class Pausing(ShoutDeployment):
        async def engine_pause(self, mode: str) -> None:
            self.paused_with = mode

        async def engine_tokenize(self, text: str) -> list[int]:
            return [len(w) for w in text.split()]

        def control_refusal(self, call: str) -> str | None:
            if call == "tokenize":
                return "this device cannot"
            return super().control_refusal(call)

    async def scenario():
        replica = Pausing(ShoutOptions(), {"name": "p"})
        refused = (await replica.control_refusals())["refused"]
        assert "pause" not in refused and "resume" not in refused and "is_paused" not in refused
        assert refused["tokenize"] == "this device cannot"
        assert "the shout-v2 adapter does not implement it" in refused["sleep"]
        await replica.follower.apply(1, {"paused": "keep"})
        assert replica.paused_with == "keep" and await replica.control("is_paused") is True

    asyncio.run(scenario())


def test_capabilities_are_what_an_engine_implements():
    class Tokenizing(Engine):
        async def tokenize(self, text: str) -> list[int]:
            return [1]

        async def detokenize(self, ids: list[int]) -> str:
            return "x"

    async def scenario():
        replica = Replica(Tokenizing, ShoutOptions(), {"name": "t"})
        refused = (await replica.control_refusals())["refused"]
        assert set(CAPABILITIES) - set(refused) == {"tokenize", "detokenize"}
        assert await replica.control("tokenize", "a") == [1]

    asyncio.run(scenario())


def test_every_control_call_is_a_controller_method_and_a_cli_choice():
    """One list: the Controller's calls and the command line's are the engine contract's."""
    from relayllm.serving.control_state import CONTROL_CALLS
    from relayllm.serving.controller import Controller

    assert tuple(CAPABILITIES) == CONTROL_CALLS
    missing = [call for call in CAPABILITIES if not callable(getattr(Controller, call, None))]
    assert not missing, f"control calls without a Controller method: {missing}"


def test_the_removed_module_paths_are_gone():
    import subprocess

    for old in ("relayllm.engine", "relayllm.replica"):
        done = subprocess.run(
            [sys.executable, "-c", f"import {old}"], capture_output=True, text=True
        )
        assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr


@pytest.mark.parametrize(
    ("old", "name"), [("metrics", "ReplicaMetrics"), ("traffic", "BATCH_PRIORITY")]
)
def test_moved_modules_keep_their_old_import_path_with_a_warning(old, name):
    import subprocess

    code = (
        "import warnings; warnings.simplefilter('always')\n"
        f"from relayllm.{old} import {name} as old\n"
        f"from relayllm.serving.{old} import {name} as new\n"
        "assert old is new\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert f"relayllm.{old} moved to relayllm.serving.{old}" in done.stderr
