"""The control calls of the SGLang replica, on a stand-in engine (no GPU, no sglang).

What each call sends is checked here: the TokenizerManager method, its request object and
the fields set. That those names and values exist in the pinned release is the contract
test's business (test_contract_sglang.py, "control calls").
"""

from __future__ import annotations

import asyncio
import sys
import types
from typing import Any

import pytest

from relayllm import ControlRefusedError
from relayllm.serving.replica import Replica
from relayllm_sglang.deployment import SGLangEngine
from relayllm_sglang.options import SGLangOptions


class Sent:
    """A stand-in for one of io_struct's request classes: keeps the fields it was built with."""

    def __init__(self, **fields: Any) -> None:
        self.fields = fields


def fake_io_struct() -> types.ModuleType:
    module = types.ModuleType("sglang.srt.managers.io_struct")
    for name in (
        "PauseGenerationReqInput",
        "ContinueGenerationReqInput",
        "ReleaseMemoryOccupationReqInput",
        "ResumeMemoryOccupationReqInput",
        "UpdateWeightFromDiskReqInput",
    ):
        setattr(module, name, type(name, (Sent,), {}))
    return module


class Manager:
    """The TokenizerManager calls a replica makes, recorded in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.is_pause = False
        self.flush_ok = True

    def _record(self, method: str, request: Any = None) -> None:
        fields = request.fields if isinstance(request, Sent) else None
        self.calls.append((method, type(request).__name__ if request else None, fields))

    async def pause_generation(self, obj):
        self._record("pause_generation", obj)
        self.is_pause = True

    async def continue_generation(self, obj):
        self._record("continue_generation", obj)
        self.is_pause = False

    async def flush_cache(self):
        self._record("flush_cache")
        return types.SimpleNamespace(success=self.flush_ok, message="1 running request")

    async def release_memory_occupation(self, obj, request):
        self._record("release_memory_occupation", obj)

    async def resume_memory_occupation(self, obj, request):
        self._record("resume_memory_occupation", obj)

    async def update_weights_from_disk(self, obj, request):
        self._record("update_weights_from_disk", obj)
        ok = obj.fields["model_path"] != "/broken"
        return ok, "Succeeded." if ok else "no safetensors in /broken", 0


class Tokenizer:
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        assert add_special_tokens is False
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)


@pytest.fixture
def replica(monkeypatch):
    """The core's replica around an SGLangEngine whose sglang engine is the stand-in (its
    start() would start SGLang)."""
    for name in ("sglang", "sglang.srt", "sglang.srt.managers"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.managers.io_struct", fake_io_struct())

    class StandIn(SGLangEngine):
        def start(self) -> None:
            self.paused = False
            self.asleep = None
            self.engine = types.SimpleNamespace(tokenizer_manager=Manager(), shutdown=lambda: None)
            self.tokenizer = Tokenizer()
            self.lora_names = frozenset(self.options.lora_paths or ())

    def build(**server_args: Any) -> Replica:
        options = SGLangOptions(model_path="m", server_args=server_args)
        return Replica(StandIn, options, {"name": "sg"})

    return build


def run(coroutine):
    return asyncio.run(coroutine)


def sent(deployment: Replica) -> list[tuple[str, Any]]:
    return deployment.engine.engine.tokenizer_manager.calls


def test_pause_wait_is_in_place_and_keep_is_retract_then_resume_continues(replica):
    deployment = replica()
    run(deployment.follower._pause("wait"))
    assert run(deployment.control("is_paused")) is True
    run(deployment.follower._resume())
    assert sent(deployment) == [
        ("pause_generation", "PauseGenerationReqInput", {"mode": "in_place"}),
        ("continue_generation", "ContinueGenerationReqInput", {}),
    ]
    assert run(deployment.control("is_paused")) is False
    run(deployment.follower._pause("keep"))
    assert sent(deployment)[-1] == (
        "pause_generation",
        "PauseGenerationReqInput",
        {"mode": "retract"},
    )


def test_reset_prefix_cache_is_flush_cache_and_a_refusal_says_why(replica):
    deployment = replica()
    run(deployment.control("reset_prefix_cache"))
    deployment.engine.engine.tokenizer_manager.flush_ok = False
    with pytest.raises(RuntimeError, match="pause the deployment first.*1 running request"):
        run(deployment.control("reset_prefix_cache"))
    assert [c[0] for c in sent(deployment)] == ["flush_cache", "flush_cache"]


def test_tokenize_and_detokenize_round_trip_with_the_engines_tokenizer(replica):
    deployment = replica()
    ids = run(deployment.control("tokenize", "Paris"))
    assert ids == [ord(c) for c in "Paris"]
    assert run(deployment.control("detokenize", ids)) == "Paris"


def test_sleep_without_the_memory_saver_is_refused_by_name(replica):
    deployment = replica()
    for call in ("sleep", "wake_up"):
        reason = deployment.follower.refusal(call)
        assert reason is not None and "server_args.enable_memory_saver" in reason
        with pytest.raises(
            ControlRefusedError, match=f"'sglang' cannot do the control call '{call}'"
        ):
            run(deployment.control(call, 2) if call == "sleep" else deployment.control(call))
    assert sent(deployment) == []


def test_sleep_level_1_needs_the_weights_backup_and_changes_nothing_without(replica):
    deployment = replica(enable_memory_saver=True)
    with pytest.raises(ControlRefusedError, match="enable_weights_cpu_backup"):
        run(deployment.control("sleep", 1))
    with pytest.raises(ValueError, match="sleep level 3"):
        run(deployment.control("sleep", 3))
    assert sent(deployment) == [] and deployment.engine.asleep is None
    backed_up = replica(enable_memory_saver=True, enable_weights_cpu_backup=True)
    run(backed_up.control("sleep", 1))
    assert backed_up.engine.asleep == 1


def test_sleep_retracts_then_releases_and_wake_up_resumes_then_continues(replica):
    deployment = replica(enable_memory_saver=True)
    run(deployment.control("sleep", 2))
    run(deployment.control("sleep", 2))  # already asleep: nothing more
    assert deployment.engine.info is not None and deployment.engine.asleep == 2
    run(deployment.control("wake_up"))
    run(deployment.control("wake_up"))  # awake: nothing more
    assert sent(deployment) == [
        ("pause_generation", "PauseGenerationReqInput", {"mode": "retract"}),
        ("release_memory_occupation", "ReleaseMemoryOccupationReqInput", {"tags": None}),
        ("resume_memory_occupation", "ResumeMemoryOccupationReqInput", {"tags": None}),
        ("continue_generation", "ContinueGenerationReqInput", {}),
    ]


def test_a_paused_deployment_stays_paused_across_sleep_and_a_sleeping_one_across_resume(replica):
    deployment = replica(enable_memory_saver=True)
    run(deployment.follower._pause("wait"))
    run(deployment.control("sleep", 2))
    run(deployment.control("wake_up"))  # still paused: the engine does not go on yet
    assert sent(deployment)[-1][0] == "resume_memory_occupation"
    run(deployment.follower._resume())
    assert sent(deployment)[-1][0] == "continue_generation"

    sleeper = replica(enable_memory_saver=True)
    run(sleeper.control("sleep", 2))
    run(sleeper.follower._pause("keep"))  # asleep: already paused (retracted)
    run(sleeper.follower._resume())  # asleep: goes on only at wake_up
    assert [c[0] for c in sent(sleeper)] == ["pause_generation", "release_memory_occupation"]
    run(sleeper.control("wake_up"))
    assert [c[0] for c in sent(sleeper)][-2:] == [
        "resume_memory_occupation",
        "continue_generation",
    ]


def test_runtime_lora_is_refused_unless_the_engine_has_lora_on(replica):
    refused = run(replica(enable_memory_saver=True).control_refusals())["refused"]
    assert set(refused) == {"load_adapter", "unload_adapter", "adapters"}
    assert all("server_args.enable_lora" in r for r in refused.values())
    assert (
        run(replica(enable_memory_saver=True, enable_lora=True).control_refusals())["refused"] == {}
    )


class LoraEngine(types.SimpleNamespace):
    """Engine.async_load_lora_adapter / async_unload_lora_adapter: SGLang answers a failure."""

    async def async_load_lora_adapter(self, lora_name, lora_path):
        self.calls.append(("load", lora_name, lora_path))
        ok = lora_path != "/missing"
        return types.SimpleNamespace(success=ok, error_message=None if ok else "no such file")

    def shutdown(self):
        pass

    async def async_unload_lora_adapter(self, lora_name):
        self.calls.append(("unload", lora_name))
        return types.SimpleNamespace(success=True, error_message=None)


def test_load_and_unload_adapter_reach_the_engine_and_the_rows_names(replica):
    deployment = replica(enable_lora=True)
    deployment.engine.engine = LoraEngine(tokenizer_manager=Manager(), calls=[])
    run(deployment.control("load_adapter", "terse", "/a/terse"))
    assert "terse" in deployment.engine.lora_names  # rows naming it now go to the adapter
    assert run(deployment.control("adapters")) == {"terse": "/a/terse"}
    run(deployment.control("load_adapter", "terse", "/b/terse"))  # again: replaced
    with pytest.raises(RuntimeError, match="could not load the LoRA adapter: no such file"):
        run(deployment.control("load_adapter", "other", "/missing"))
    assert (
        "other" not in deployment.engine.lora_names and "other" not in deployment.follower.adapters
    )
    run(deployment.control("unload_adapter", "terse"))
    assert deployment.engine.lora_names == frozenset() and run(deployment.control("adapters")) == {}
    assert deployment.engine.engine.calls == [
        ("load", "terse", "/a/terse"),
        ("unload", "terse"),
        ("load", "terse", "/b/terse"),
        ("load", "other", "/missing"),
        ("unload", "terse"),
    ]


def test_update_weights_loads_from_disk_with_the_version_and_a_failure_says_why(replica):
    deployment = replica()
    assert deployment.follower.refusal("update_weights") is None
    run(deployment.engine.update_weights("/ckpt/step-7", "7"))
    assert sent(deployment) == [
        (
            "update_weights_from_disk",
            "UpdateWeightFromDiskReqInput",
            {"model_path": "/ckpt/step-7", "weight_version": "7"},
        )
    ]
    with pytest.raises(RuntimeError, match="no safetensors in /broken"):
        run(deployment.engine.update_weights("/broken", "8"))
