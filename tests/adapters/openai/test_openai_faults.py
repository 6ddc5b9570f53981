"""Faults from a real HTTP server on loopback: retries, Retry-After, permanent errors, and the
deployment's global limits (requests per minute, tokens per minute, concurrency) measured
from the request timestamps the server records."""

from __future__ import annotations

from typing import Any

import pytest
from fault_server import BAD_REQUEST_MESSAGE, FaultServerProcess
from openai_support import KEY_ENV, most_in_window, most_overlapping, run_together

import relayllm

pytestmark = pytest.mark.usefixtures("ray_per_module")

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def server(test_key):
    """In a process of its own: the times it records are not those of a thread that waits
    for this process's GIL (the rate checks read them to a tenth of a second)."""
    srv = FaultServerProcess(api_key_env=KEY_ENV)
    yield srv
    srv.stop()


@pytest.fixture
def deploy(server):
    """Deploy a named openai deployment against the fault server; shut down after the test."""
    started: list[str] = []

    def _deploy(name: str, num_replicas: int = 1, **options: Any) -> relayllm.DeploymentRef:
        config = relayllm.DeploymentConfig(
            name=name,
            backend="openai",
            num_replicas=num_replicas,
            options={
                "base_url": server.base_url,
                "model": server.model,
                "api_key_env": KEY_ENV,
                **options,
            },
        )
        ref = relayllm.deploy(config)
        started.append(name)
        return ref

    yield _deploy
    for name in started:
        relayllm.shutdown(name)


def chat_rows(texts: list[str]) -> list[dict[str, Any]]:
    return [{"id": i, "messages": [{"role": "user", "content": t}]} for i, t in enumerate(texts)]


def run(deployment: str, rows: list[dict[str, Any]], **fields: Any) -> list[dict[str, Any]]:
    import ray

    fields = {"batch_size": 4, "max_in_flight_batches": 4, **fields}
    processor = relayllm.build_processor(
        relayllm.ProcessorConfig(deployment=deployment, task="chat", **fields)
    )
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    return processor(ray.data.from_items(rows)).take_all()


def arrivals(server: FaultServerProcess, marker: str) -> list[float]:
    return sorted(r.at for r in server.requests_for(marker, CHAT))


def test_faults_are_retried_and_no_row_is_lost(deploy, server):
    # timeout_s leaves a healthy call seconds to spare on a loaded machine (the server runs
    # in this process, sharing its CPU with the job), and the slow fault outlasts it by as
    # much, so each fault still costs exactly its scripted extra attempts.
    deploy("faults", max_retries=4, timeout_s=5)
    faults = {
        3: "fault=500*2",
        8: "fault=429:0.2",
        13: "fault=malformed*2",
        21: "fault=slow:10*1",
        27: "fault=400",
        34: "fault=500*1",
        35: "fault=400",
    }
    texts = [f"lossless row {i} {faults.get(i, '')}".strip() for i in range(40)]
    out = run("faults", chat_rows(texts))

    assert [r["id"] for r in out] == list(range(40)), "a row was lost or reordered"
    for r in out:
        if r["id"] in (27, 35):
            assert r["error"] == f"HTTP 400 from the endpoint: {BAD_REQUEST_MESSAGE}"
            assert r["generated_text"] is None
        else:
            assert r["error"] is None, r
            assert r["generated_text"] == texts[r["id"]]  # the fault server echoes the words
            assert r["num_input_tokens"] == len(texts[r["id"]].split())
    attempts = {i: len(server.requests_for(texts[i], CHAT)) for i in faults}
    # Each fault costs exactly its scripted number of extra attempts; a 400 is never retried.
    assert attempts == {3: 3, 8: 2, 13: 3, 21: 2, 27: 1, 34: 2, 35: 1}, attempts


def test_retry_after_is_honoured(deploy, server):
    deploy("retry-after", max_retries=3)
    out = run("retry-after", chat_rows(["obey fault=429:5"]))
    assert out[0]["error"] is None
    first, second = arrivals(server, "obey fault=429:5")
    assert second - first >= 4.9, f"retried after {second - first:.2f}s; Retry-After said 5s"

    # Control: without Retry-After the first backoff is short, so the wait above is the header's.
    out = run("retry-after", chat_rows(["control fault=500"]))
    assert out[0]["error"] is None
    first, second = arrivals(server, "control fault=500")
    assert second - first < 4.0


def test_exhausted_retries_become_the_row_error(deploy, server):
    ref = deploy("give-up", max_retries=2)
    out = run("give-up", chat_rows(["fine", "hopeless fault=500*99"]))
    assert out[0]["error"] is None
    assert out[1]["error"].startswith(
        "HTTP 500 from the endpoint: the fault server broke on purpose"
    )
    assert "gave up after 3 attempts" in out[1]["error"]
    assert len(server.requests_for("hopeless", CHAT)) == 3
    # Both rows count as batch rows; only the answered request has a latency (info()).
    metrics = ref.handle().info.remote().result(timeout_s=60)["metrics"]
    assert metrics["rows_by_class"]["batch"] == 2 and metrics["latency_s"]["count"] == 1
    assert metrics["latency_s"]["p50"] > 0 and metrics["kv_cache_use"] is None


def test_health_lists_models_without_spending_tokens(deploy, server):
    handle = deploy("health").handle()
    server.reset()
    health = handle.health.remote().result(timeout_s=60)
    assert health["ok"] is True and health["model_listed"] is True
    assert [r.path for r in server.records] == ["/v1/models"]
    info = handle.info.remote().result(timeout_s=60)
    assert info["base_url"] == server.base_url and info["model"] == server.model


def within_budget(times: list[float], rpm: float, window_s: float) -> bool:
    """No window of ``window_s`` holds more than its share of ``rpm``. The limiter spaces
    requests exactly; the server's clock also sees the network's jitter (up to ~0.3 s measured
    on a busy 2-core machine), so the share gets JITTER_S of slack -- far less than the 2x a
    limiter per processor would let through."""
    rate = rpm / 60
    return most_in_window(times, window_s) <= rate * (window_s + JITTER_S) + 1


JITTER_S = 0.5


def test_requests_per_minute_is_global_across_two_processors(deploy, server):
    rpm = 600  # 10 requests per second: a per-second equivalent keeps the test short
    deploy("paced", requests_per_minute=rpm, max_concurrency=16)
    n = 80
    first = chat_rows([f"pace-a {i}" for i in range(n)])
    second = chat_rows([f"pace-b {i}" for i in range(n)])
    out_a, out_b = run_together(lambda: run("paced", first), lambda: run("paced", second))
    assert all(r["error"] is None for r in out_a + out_b)

    a, b = arrivals(server, "pace-a"), arrivals(server, "pace-b")
    both = sorted(a + b)
    assert len(both) == 2 * n
    # The two processors really sent at the same time (otherwise sharing proves nothing);
    # on a busy machine one may start some seconds after the other.
    start, end = max(a[0], b[0]), min(a[-1], b[-1])
    assert end - start >= 4.0, f"the processors overlapped only {end - start:.1f}s"
    during = [t for t in both if start <= t <= end]
    assert len(during) <= rpm / 60 * (end - start + JITTER_S) + 1, (len(during), end - start)
    # Evenly paced at rpm/60 per second for both together: 160 requests take at least 159
    # gaps of 0.1 s. A limiter per processor (or per stage actor) would take half that.
    assert both[-1] - both[0] >= (2 * n - 1) * 60 / rpm - JITTER_S, both[-1] - both[0]
    # Windows of 5 s or more: a shorter one measures the server's scheduling on a loaded
    # machine (arrivals bunched behind a stall) more than the limiter.
    for window in (5.0, 60.0):  # 60 s: the configured window itself
        assert within_budget(both, rpm, window), (window, most_in_window(both, window))


def test_requests_per_minute_is_split_between_replicas(deploy, server):
    rpm = 600
    ref = deploy("paced-2", num_replicas=2, requests_per_minute=rpm, max_concurrency=16)
    info = ref.handle().info.remote().result(timeout_s=60)
    assert info["limits"]["requests_per_minute"] == rpm / 2
    out = run("paced-2", chat_rows([f"split {i}" for i in range(80)]), concurrency=2)
    assert all(r["error"] is None for r in out)
    times = arrivals(server, "split")
    assert len(times) == 80
    # Each replica paces rpm / 2, so the 80 requests span at least 79 gaps of 0.1 s; a replica
    # pacing the whole rpm (the limit not split) would take half that.
    span = max(times) - min(times)
    assert span >= 79 * 60 / rpm - 3 * JITTER_S, span
    assert within_budget(times, rpm, 5.0), most_in_window(times, 5.0)


def test_tokens_per_minute_bucket(deploy, server):
    # 3000 tokens a minute = 50 a second; each row is charged ~3 prompt tokens + max_tokens
    # 500, so five fit in the full bucket at once and each later one waits ~10 s.
    deploy("tokens", tokens_per_minute=3000)
    out = run(
        "tokens",
        chat_rows([f"tok {i} x" for i in range(7)]),
        sampling_params={"max_tokens": 500},
        batch_size=7,
    )
    assert all(r["error"] is None for r in out)
    times = arrivals(server, "tok ")
    assert len(times) == 7
    # Without the burst they would come ~10 s apart; the margin is for a loaded machine.
    assert times[4] - times[0] < 8.0, "the first five fit in the bucket"
    assert times[6] - times[0] >= 9.0, "the seventh waited for the bucket to refill"


def test_concurrency_cap_is_global(deploy, server):
    deploy("capped", max_concurrency=3)
    rows_a = chat_rows([f"cap-a {i} fault=slow:0.4" for i in range(12)])
    rows_b = chat_rows([f"cap-b {i} fault=slow:0.4" for i in range(12)])
    run_together(lambda: run("capped", rows_a), lambda: run("capped", rows_b))
    spans = [(r.at, r.done) for r in server.requests_for("cap-", CHAT)]
    assert len(spans) == 24
    most = most_overlapping(spans)
    assert 2 <= most <= 3, most
