"""Traffic classes reach the vLLM engine's scheduler, not only relayllm's code.

The engine here runs one sequence at a time (``max_num_seqs: 1``), so every other request waits
in the engine's queue and the order rows finish in is the order the engine's scheduler picked
them. With ``scheduling_policy="priority"`` (the vllm backend's default) a request sent last at
a lower priority number runs before batch rows that were already waiting; at equal priority it
runs last. The suite's HTTP deployment (vllm_support).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from vllm_support import HTTP_NAME, http_key

import relayllm

NAME = HTTP_NAME
PROMPT = "List the numbers from one to forty, in words, separated by commas."
MAX_TOKENS = 24
#: Seconds of decoding on CPU: the later rows, each sent once the engine holds the one before,
#: arrive while it runs (the count to forty is longer, so it never ends early).
FIRST_MAX_TOKENS = 96


@pytest.fixture
def deployment(http_deployment):
    return http_deployment


def row(request_id: str, priority: int, max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    return {
        "request_id": request_id,
        "task": "chat",
        "messages": [{"role": "user", "content": PROMPT}],
        "sampling_params": {"temperature": 0.0, "max_tokens": max_tokens},
        "priority": priority,
    }


async def engine_holds(handle, requests: int) -> None:
    """Wait until the engine's scheduler holds ``requests`` requests (running and waiting), as
    its step stats report them."""
    deadline = time.monotonic() + 120
    while True:
        queue = (await handle.info.remote())["metrics"].get("queue")
        if queue and queue["waiting"] + queue["running"] >= requests:
            return
        assert time.monotonic() < deadline, f"the engine never held {requests} requests: {queue}"
        await asyncio.sleep(0.01)


def finishing_order(handle, priorities: list[int]) -> list[str]:
    """Send one single-row call per priority, in list order, each once the engine's scheduler
    holds the one before (so the engine sees them arrive in that order, however loaded the
    machine); return the request ids in the order their answers came back. The first row asks
    for more tokens, so it is still running when the last one arrives."""

    async def send() -> list[str]:
        done: list[str] = []

        async def one(request_id: str, priority: int, max_tokens: int) -> None:
            [result] = await handle.process_batch.remote([row(request_id, priority, max_tokens)])
            assert result.get("error") is None, result
            assert result["num_generated_tokens"] > 0, result
            done.append(request_id)

        tasks = []
        for i, priority in enumerate(priorities):
            max_tokens = FIRST_MAX_TOKENS if i == 0 else MAX_TOKENS
            request_id = f"r{i}-p{priority}-{time.time_ns()}"
            tasks.append(asyncio.ensure_future(one(request_id, priority, max_tokens)))
            await engine_holds(handle, i + 1)
        await asyncio.gather(*tasks)
        return [request_id.rsplit("-", 1)[0] for request_id in done]

    return asyncio.run(send())


def test_engine_runs_a_lower_priority_number_first(deployment):
    handle = deployment.handle()
    info = handle.info.remote().result(timeout_s=120)
    assert info["engine_args"]["scheduling_policy"] == "priority"
    # Control: equal priorities finish in the order they arrived (first come, first served).
    fair = finishing_order(handle, [10, 10, 10, 10])
    assert fair == ["r0-p10", "r1-p10", "r2-p10", "r3-p10"], fair
    # The same arrivals with the last row at interactive priority: it overtakes the two batch
    # rows still waiting (r0 was already running; the engine does not preempt it).
    urgent = finishing_order(handle, [10, 10, 10, 0])
    assert urgent.index("r3-p0") < urgent.index("r2-p10"), urgent
    assert urgent.index("r3-p0") < urgent.index("r1-p10"), urgent


def test_http_request_overtakes_a_running_batch_job_on_the_same_engine(deployment):
    """A processor job (batch priority by default) and an OpenAI-client request on the HTTP
    front at once: the interactive answer comes back while the batch job is still running
    (first come, first served would put it behind all of the job's waiting rows), no batch row
    fails, and it is all one engine (one model load)."""
    import openai

    handle = deployment.handle()
    before = handle.info.remote().result(timeout_s=120)
    rows = [{"q": f"{PROMPT} ({i})"} for i in range(6)]
    processor = relayllm.build_processor(
        relayllm.ProcessorConfig(
            deployment=NAME,
            batch_size=len(rows),  # one call: the engine queues five rows behind the first
            sampling_params={"temperature": 0.0, "max_tokens": MAX_TOKENS},
        ),
        preprocess=lambda r: {"messages": [{"role": "user", "content": r["q"]}]},
    )
    finished: dict[str, float] = {}
    outputs: list[dict[str, Any]] = []

    def batch_job() -> None:
        import ray

        outputs.extend(processor(ray.data.from_items(rows)).take_all())
        finished["batch"] = time.monotonic()

    job = threading.Thread(target=batch_job)
    job.start()
    deadline = time.monotonic() + 300
    while handle.info.remote().result(timeout_s=60)["ongoing"] == 0:  # the job reached it
        assert job.is_alive() and time.monotonic() < deadline, "the batch job never started"
        time.sleep(0.05)
    client = openai.OpenAI(base_url=before["http"]["url"], api_key=http_key(), max_retries=0)
    reply = client.chat.completions.create(
        model=NAME,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0.0,
        max_tokens=8,
    )
    finished["interactive"] = time.monotonic()
    job.join(timeout=600)
    assert not job.is_alive(), "the batch job did not finish"
    assert reply.choices[0].message.content
    assert finished["interactive"] < finished["batch"], "the HTTP request waited for the job"
    assert len(outputs) == len(rows)
    assert [r for r in outputs if r.get("error")] == []
    after = handle.info.remote().result(timeout_s=120)
    assert after["engine_starts"] == 1 and after["replica_id"] == before["replica_id"]
    assert after["rows_by_class"]["batch"] == before["rows_by_class"]["batch"] + len(rows)
    assert after["rows_by_class"]["interactive"] == before["rows_by_class"]["interactive"] + 1
