"""vLLM 0.33's paused engine refuses the requests that arrive (a retryable error) where 0.32
queued them: the engine then waits for the resume and sends them again, so the row is
answered, not failed. Checked without an engine: the refusal is vLLM's own exception class,
raised by a stand-in for the engine call; the contract test checks that 0.33 raises it so."""

from __future__ import annotations

import asyncio
import types

import pytest

import relayllm_vllm.generation as deployment_module
from relayllm.adapters import EngineContext
from relayllm.serving.metrics import ReplicaMetrics
from relayllm_vllm.compat import hide_broken_torch_extensions
from relayllm_vllm.engine import VLLMEngine
from relayllm_vllm.generation import _RejectedAsPaused
from relayllm_vllm.options import VLLMOptions
from relayllm_vllm.versions import RELEASES

hide_broken_torch_extensions()  # before vllm imports torchvision (as the replica does)
from vllm.exceptions import RetryableRequestError  # noqa: E402

REFUSAL = "Generation is paused. Please retry after it resumes."


def replica(version: str) -> VLLMEngine:
    """A vLLM engine of ``version``'s behaviour that is never started (the replica paused
    and resumed it: ``paused_mode``)."""
    context = EngineContext({"name": "v"}, ReplicaMetrics("v", "vllm"))
    deployment = VLLMEngine(VLLMOptions(model="m"), context)
    deployment.release = RELEASES[version]
    deployment.engine = types.SimpleNamespace(errored=False)
    return deployment


@pytest.fixture
def ray_session():
    """No cluster: nothing here reaches Ray (overrides the folder's autouse one)."""
    return None


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    monkeypatch.setattr(deployment_module, "REJECTED_RETRY_S", 0.01)


async def paused_then_resumed(deployment: VLLMEngine, sent: list[float]) -> None:
    deployment.paused_mode = "wait"
    while not sent:  # refused once...
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # ...and not sent again while the pause lasts
    assert len(sent) == 1
    deployment.paused_mode = None


def test_a_row_refused_by_the_paused_engine_is_answered_after_the_resume():
    deployment = replica("0.33.0")
    sent: list[float] = []

    async def serve(request):
        sent.append(asyncio.get_running_loop().time())
        if deployment.paused_mode is not None:
            raise RetryableRequestError(REFUSAL)
        return {"generated_text": "Paris"}

    deployment._serve = serve  # type: ignore[method-assign]

    async def main():
        resume = asyncio.create_task(paused_then_resumed(deployment, sent))
        await asyncio.sleep(0)
        answer = await deployment.run_request({"task": "chat", "messages": []})
        await resume
        return answer

    assert asyncio.run(main()) == {"generated_text": "Paris"}
    assert len(sent) == 2  # refused while paused, then answered after the resume


def test_on_032_and_from_an_engine_paused_behind_relayllms_back_the_row_fails():
    for version, expected_sends in (
        ("0.32.0", 1),
        ("0.33.0", deployment_module.MAX_UNPAUSED_REJECTIONS + 1),
    ):
        deployment = replica(version)
        sent: list[int] = []

        async def serve(request, sent=sent):
            sent.append(1)
            raise RetryableRequestError(REFUSAL)

        deployment._serve = serve  # type: ignore[method-assign]
        answer = asyncio.run(deployment.run_request({"task": "chat", "messages": []}))
        assert "RetryableRequestError: Generation is paused" in answer["error"], version
        assert len(sent) == expected_sends, version


def test_a_stream_refused_on_arrival_starts_again_after_the_resume():
    deployment = replica("0.33.0")
    sent: list[float] = []

    async def stream(request, kind):
        sent.append(asyncio.get_running_loop().time())
        if deployment.paused_mode is not None:
            raise _RejectedAsPaused() from RetryableRequestError(REFUSAL)
        yield {"generated_text": "Par"}
        yield {"generated_text": "is", "finish_reason": "stop"}

    deployment._stream = stream  # type: ignore[method-assign]

    async def main():
        resume = asyncio.create_task(paused_then_resumed(deployment, sent))
        await asyncio.sleep(0)
        parts = [p async for p in deployment.stream({"task": "chat", "messages": []})]
        await resume
        return parts

    parts = asyncio.run(main())
    assert [p["generated_text"] for p in parts] == ["Par", "is"] and len(sent) == 2
