"""Options and policy without a cluster: bad config fails before anything starts, naming the
field; the retry policy reads Retry-After; the limiter paces and charges tokens."""

from __future__ import annotations

import asyncio
import email.utils
import time

import openai
import pytest
from openai_support import KEY_ENV

try:  # the HTTP library under the openai client: httpx2 in recent releases, httpx before
    import httpx2 as httpx
except ImportError:
    import httpx

import relayllm
from relayllm.adapters import estimated_tokens
from relayllm.plugin.manager import get_registry
from relayllm_openai.rate_gate import RateGate
from relayllm_openai.retrying import describe_failure, is_retryable, retry_after_s

GOOD = {"base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": KEY_ENV}


def parse(**changes):
    return get_registry().get("openai").parse_options({**GOOD, **changes})


def test_defaults_and_normalisation():
    options = parse(base_url="http://127.0.0.1:9/v1/")
    assert options.base_url == "http://127.0.0.1:9/v1"
    assert options.max_retries == 5 and options.requests_per_minute is None
    assert get_registry().get("openai").Options(model="m").api_key_env == "OPENAI_API_KEY"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"base_url": "ftp://host/v1"}, "base_url"),
        ({"base_url": "http://user:pw@127.0.0.1/v1"}, "base_url"),
        ({"model": ""}, "model"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"requests_per_minute": 0}, "requests_per_minute"),
        ({"max_concurrency": -1}, "max_concurrency"),
        ({"headers": {"Authorization": "Bearer x"}}, "headers"),
        ({"api_key": "x"}, "api_key"),
    ],
)
def test_bad_options_name_the_field(changes, field):
    with pytest.raises(relayllm.ConfigError, match=field):
        parse(**changes)


def test_a_key_pasted_as_the_variable_name_is_not_echoed():
    pasted = "sk-this-is-a-pasted-key-0123456789"
    with pytest.raises(relayllm.ConfigError, match="api_key_env") as caught:
        parse(api_key_env=pasted)
    assert pasted not in str(caught.value)
    assert "NAME of an environment variable" in str(caught.value)


def test_missing_key_variable_fails_before_anything_starts(monkeypatch):
    import ray

    monkeypatch.delenv("RELAYLLM_TEST_UNSET_KEY", raising=False)
    config = relayllm.DeploymentConfig(
        name="no-key", backend="openai", options={**GOOD, "api_key_env": "RELAYLLM_TEST_UNSET_KEY"}
    )
    with pytest.raises(relayllm.ConfigError, match="RELAYLLM_TEST_UNSET_KEY is not set"):
        relayllm.deploy(config)
    assert not ray.is_initialized(), "the config error came after Ray started"


def _status_error(
    status: int, headers: dict[str, str] | None = None, body=None
) -> openai.APIStatusError:
    request = httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions")
    response = httpx.Response(status, headers=headers or {}, request=request)
    return openai.APIStatusError(f"Error code: {status}", response=response, body=body)


def test_which_failures_are_retried():
    assert all(is_retryable(_status_error(s)) for s in (408, 409, 429, 500, 502, 503))
    assert not any(is_retryable(_status_error(s)) for s in (400, 401, 403, 404, 422))
    quota = _status_error(429, body={"code": "insufficient_quota", "message": "no credit"})
    assert not is_retryable(quota)
    request = httpx.Request("POST", "http://127.0.0.1:9/v1/completions")
    assert is_retryable(openai.APITimeoutError(request=request))
    assert is_retryable(openai.APIConnectionError(request=request))


def test_retry_after_forms():
    assert retry_after_s(_status_error(429, {"Retry-After": "7"})) == 7.0
    assert retry_after_s(_status_error(429, {"retry-after-ms": "250"})) == 0.25
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= retry_after_s(_status_error(503, {"Retry-After": when})) <= 31
    assert retry_after_s(_status_error(429, {"Retry-After": "soon"})) is None
    assert retry_after_s(_status_error(500)) is None


def test_row_error_is_the_endpoint_message():
    error = _status_error(400, body={"message": "prompt is too long", "type": "invalid_request"})
    assert describe_failure(error, 1, 60) == "HTTP 400 from the endpoint: prompt is too long"
    assert describe_failure(_status_error(500, body="oops"), 3, 60).endswith(
        "(gave up after 3 attempts)"
    )


def test_budget_is_split_between_replicas():
    gate = RateGate(max_concurrency=10, requests_per_minute=600, tokens_per_minute=9000, replicas=4)
    assert gate.describe() == {
        "replicas_sharing_budget": 4,
        "max_concurrency": 2,
        "requests_per_minute": 150.0,
        "tokens_per_minute": 2250.0,
    }


def test_token_estimate_counts_max_tokens():
    request = {
        "task": "chat",
        "messages": [{"role": "user", "content": "x" * 40}],
        "sampling_params": {"max_tokens": 100},
    }
    assert estimated_tokens(request) == 110
    assert (
        estimated_tokens(
            {"task": "embedding", "input": "y" * 8, "sampling_params": {"max_tokens": 5}}
        )
        == 2
    )


def test_request_pace_is_even():
    # 300 a minute: one every 200 ms, never a burst. A gap is read after the limiter lets a
    # request through, so a loaded machine can delay one reading; half an interval of slack
    # absorbs that, while a limiter that lets two through together still shows a gap near 0.
    interval = 60 / 300

    async def admit(n: int) -> list[float]:
        gate = RateGate(max_concurrency=50, requests_per_minute=300, tokens_per_minute=None)
        loop = asyncio.get_running_loop()
        times: list[float] = []

        async def one() -> None:
            async with gate.slot(1):
                times.append(loop.time())

        await asyncio.gather(*(one() for _ in range(n)))
        return sorted(times)

    times = asyncio.run(admit(8))
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert min(gaps) >= interval / 2, gaps
    assert times[-1] - times[0] >= 7 * interval - interval / 2, gaps


def test_tokens_the_estimate_missed_are_charged_later():
    async def scenario() -> float:
        gate = RateGate(max_concurrency=5, requests_per_minute=None, tokens_per_minute=600)
        loop = asyncio.get_running_loop()
        async with gate.slot(0):
            pass
        gate.settle(estimated=0, actual=600)  # the whole minute's budget was used
        await asyncio.sleep(0)
        start = loop.time()
        async with gate.slot(10):  # 600 a minute = 10 a second: ~1 s to refill 10
            pass
        return loop.time() - start

    assert asyncio.run(scenario()) >= 0.9


def test_interactive_requests_get_a_budget_of_their_own_only_with_an_http_front():
    from relayllm_openai.options import OpenAIOptions
    from relayllm_openai.rate_gate import class_budgets

    options = OpenAIOptions(
        model="m", max_concurrency=40, requests_per_minute=1000, tokens_per_minute=None
    )
    (alone,) = class_budgets(options, 0.0)  # no HTTP front: batch rows get everything
    assert alone == {"max_concurrency": 40, "requests_per_minute": 1000, "tokens_per_minute": None}
    batch, interactive = class_budgets(options, options.interactive_share)
    assert (batch["max_concurrency"], interactive["max_concurrency"]) == (30, 10)
    assert (batch["requests_per_minute"], interactive["requests_per_minute"]) == (750, 250)
