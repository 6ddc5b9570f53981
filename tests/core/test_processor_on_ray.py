"""The batched stage on a real cluster: counts, order, errors, retries, timeouts."""

import pytest
import ray

import relayllm
from relayllm import DeploymentConfig, ProcessorConfig, build_processor

pytestmark = pytest.mark.usefixtures("ray_session")

ECHO = {"name": "proc-echo", "options": {"mode": "reverse"}}  # the `echo` fixture's deployment


@pytest.fixture(params=["actors", "tasks"])
def compute(request):
    """Each behaviour holds however Ray Data runs the stage (ProcessorConfig.compute)."""
    return request.param


def _rows(n, bad_every=None):
    rows = []
    for i in range(n):
        row = {"id": i, "messages": [{"role": "user", "content": f"word{i} tail"}]}
        if bad_every and i % bad_every == 0:
            row = (
                {"id": i, "messages": []}
                if (i // bad_every) % 2
                else {"id": i, "messages": [{"role": "nobody", "content": "x"}]}
            )
        rows.append(row)
    return rows


def _ordered():
    ray.data.DataContext.get_current().execution_options.preserve_order = True


def test_thousand_rows_with_five_percent_bad_rows_exact_counts(echo, compute):
    _ordered()
    out = build_processor(ProcessorConfig(compute=compute, deployment="proc-echo", batch_size=16))(
        ray.data.from_items(_rows(1000, bad_every=20), override_num_blocks=10)
    ).take_all()
    errors = [r for r in out if r["error"] is not None]
    good = [r for r in out if r["error"] is None]
    assert len(out) == 1000 and len(errors) == 50 and len(good) == 950
    assert {r["id"] for r in errors} == set(range(0, 1000, 20))
    assert all(r["generated_text"] == f"tail word{r['id']}" for r in good)
    assert len({r["request_id"] for r in out}) == 1000


def test_order_is_preserved_across_many_blocks_and_columns_pass_through(echo, compute):
    _ordered()
    rows = [{"id": i, "prompt": f"p{i} q", "extra": {"k": i}, "tag": f"t{i}"} for i in range(600)]
    ds = ray.data.from_items(rows, override_num_blocks=37)
    out = build_processor(
        ProcessorConfig(compute=compute, deployment="proc-echo", task="completion", batch_size=7)
    )(ds).take_all()
    assert [r["id"] for r in out] == list(range(600))
    assert all(r["extra"] == {"k": r["id"]} and r["tag"] == f"t{r['id']}" for r in out)
    assert all(r["generated_text"] == f"q p{r['id']}" for r in out)


def test_pre_and_postprocess_run_around_the_stage(echo, compute):
    _ordered()
    proc = build_processor(
        ProcessorConfig(compute=compute, deployment="proc-echo", sampling_params={"max_tokens": 1}),
        preprocess=lambda row: {
            "id": row["id"],
            "messages": [{"role": "user", "content": f"a b {row['id']}"}],
        },
        postprocess=lambda row: {
            "id": row["id"],
            "answer": row["generated_text"],
            "why": row["finish_reason"],
        },
    )
    out = proc(ray.data.range(20)).take_all()
    assert out == [{"id": i, "answer": str(i), "why": "length"} for i in range(20)]


def test_row_sampling_params_override_the_processor_and_bad_ones_fail_the_row(echo):
    _ordered()
    rows = [
        {"id": 0, "prompt": "a b c d", "sampling_params": {"max_tokens": 2}},
        {"id": 1, "prompt": "a b c d", "sampling_params": {"max_tokens": -1}},
        {"id": 2, "prompt": "a b c d", "sampling_params": {"temperature": 0.5}},
    ]
    out = build_processor(
        ProcessorConfig(
            deployment="proc-echo", task="completion", sampling_params={"max_tokens": 3}
        )
    )(ray.data.from_items(rows, override_num_blocks=1)).take_all()
    assert out[0]["generated_text"] == "d c" and out[2]["generated_text"] == "d c b"
    assert "max_tokens" in out[1]["error"] and out[1]["generated_text"] is None


def test_raise_mode_names_the_row_and_the_deployment(echo, compute):
    rows = [{"id": i, "prompt": "fine"} for i in range(10)] + [{"id": 10, "prompt": ""}]
    proc = build_processor(
        ProcessorConfig(
            compute=compute, deployment="proc-echo", task="completion", on_error="raise"
        )
    )
    with pytest.raises(Exception) as err:
        proc(ray.data.from_items(rows, override_num_blocks=1)).take_all()
    message = str(err.value)
    assert "proc-echo" in message and "request_id" in message and "non-empty string" in message


def test_unknown_deployment_fails_at_stage_start_listing_running_ones(echo, compute):
    proc = build_processor(ProcessorConfig(compute=compute, deployment="no-such-engine"))
    with pytest.raises(Exception) as err:
        proc(ray.data.from_items(_rows(3))).take_all()
    assert "no-such-engine" in str(err.value) and "proc-echo" in str(err.value)


def test_a_task_the_deployment_does_not_serve_fails_before_any_row(echo, compute):
    relayllm.deploy(DeploymentConfig(name="chat-only", backend="echo", options={"tasks": ["chat"]}))
    try:
        assert relayllm.get_deployment("chat-only").handle().info.remote().result()["tasks"] == [
            "chat"
        ]
        proc = build_processor(
            ProcessorConfig(compute=compute, deployment="chat-only", task="embedding")
        )
        with pytest.raises(Exception) as err:
            proc(ray.data.from_items([{"input": "hello"}])).take_all()
        assert "deployment 'chat-only' (backend 'echo') does not serve task 'embedding'" in str(
            err.value
        )
    finally:
        relayllm.shutdown("chat-only")


def test_stage_tasks_follow_a_redeploy_between_runs():
    # Stage tasks keep their deployment handle in Ray's reused worker processes between runs:
    # a deployment shut down and started again under the same name must be found again.
    _ordered()
    config = ProcessorConfig(compute="tasks", deployment="redeployed", task="completion")
    rows = [{"id": i, "prompt": f"a{i} b"} for i in range(8)]
    relayllm.deploy(
        DeploymentConfig(name="redeployed", backend="echo", options={"mode": "reverse"})
    )
    try:
        first = build_processor(config)(ray.data.from_items(rows)).take_all()
        relayllm.shutdown("redeployed")
        with pytest.raises(Exception) as gone:
            build_processor(config)(ray.data.from_items(rows)).take_all()
        assert "no relayllm deployment named 'redeployed'" in str(gone.value)
        relayllm.deploy(
            DeploymentConfig(name="redeployed", backend="echo", options={"mode": "echo"})
        )
        again = build_processor(config)(ray.data.from_items(rows)).take_all()
    finally:
        relayllm.shutdown("redeployed")
    assert [r["generated_text"] for r in first] == [f"b a{i}" for i in range(8)]
    assert [r["generated_text"] for r in again] == [f"a{i} b" for i in range(8)]
    assert all(r["error"] is None for r in first + again)


def test_two_steps_as_tasks_stay_two_operators_side_by_side(echo):
    # Fused into one task, the second step would wait for the first on every block.
    first = build_processor(
        ProcessorConfig(compute="tasks", deployment="proc-echo", task="completion")
    )
    second = build_processor(
        ProcessorConfig(compute="tasks", deployment="proc-echo", task="completion"),
        preprocess=lambda row: {"id": row["id"], "prompt": row["generated_text"]},
    )
    rows = [{"id": i, "prompt": f"x{i} y"} for i in range(50)]
    ds = second(first(ray.data.from_items(rows, override_num_blocks=5)))
    out = ds.take_all()
    assert sorted(r["generated_text"] for r in out) == sorted(f"x{i} y" for i in range(50))
    stats = ds.stats()
    assert stats.count("MapBatches(serve_stage)") >= 2, stats
    assert "MapBatches(serve_stage)->MapBatches(serve_stage)" not in stats, stats


def test_stage_tasks_work_on_two_batches_at_once_with_concurrency_one(tmp_path):
    # One task at a time waits for all of its calls before the next batch's preprocess can
    # start; an actor overlaps several batches. Each row's preprocess and postprocess append
    # (pid, "start"/"end", time) to a file: a task's batch spans its rows' first start to
    # their last end, and two spans of different processes overlap only if tasks ran at once.
    import json
    import os
    import time

    log = tmp_path / "spans.jsonl"

    def stamp(event):
        with open(log, "a") as f:
            f.write(json.dumps([os.getpid(), event, time.monotonic()]) + "\n")

    def pre(row):
        stamp("start")
        return row

    def post(row):
        stamp("end")
        return {"id": row["id"], "error": row["error"]}

    relayllm.deploy(DeploymentConfig(name="slow-echo", backend="echo", options={"delay_s": 0.5}))
    try:
        config = ProcessorConfig(
            compute="tasks", deployment="slow-echo", batch_size=4, max_in_flight_batches=4
        )
        rows = [{"id": i, "messages": [{"role": "user", "content": "x"}]} for i in range(64)]
        ds = ray.data.from_items(rows, override_num_blocks=8)
        out = build_processor(config, preprocess=pre, postprocess=post)(ds).take_all()
    finally:
        relayllm.shutdown("slow-echo")
    assert sorted(r["id"] for r in out) == list(range(64))
    assert all(r["error"] is None for r in out)
    spans: list[tuple[int, float, float]] = []  # (pid, first start, last end) per batch
    open_spans: dict[int, list[float]] = {}
    for pid, event, at in sorted(
        (json.loads(x) for x in log.read_text().splitlines()), key=lambda e: e[2]
    ):
        span = open_spans.setdefault(pid, [at, at, 0])
        if event == "start" and span[2]:  # a start after ends: this process's next batch
            spans.append((pid, span[0], span[1]))
            span[:] = [at, at, 0]
        elif event == "end":
            span[1], span[2] = at, 1
    spans += [(pid, s[0], s[1]) for pid, s in open_spans.items()]
    overlapping = [
        (a, b) for a in spans for b in spans if a[0] != b[0] and a[1] < b[2] and b[1] < a[2]
    ]
    assert overlapping, f"the stage's batches ran one at a time: {spans}"


def test_a_small_run_as_tasks_prints_no_ray_data_warnings(echo, recwarn):
    # The quick start's demo printed both on every run: fewer blocks than tasks, and the
    # deprecation of the ray_remote_args_fn that keeps steps apart.
    config = ProcessorConfig(compute="tasks", deployment="proc-echo", task="completion")
    out = build_processor(config)(ray.data.from_items([{"prompt": "a b"}])).take_all()
    assert out[0]["generated_text"] == "b a"
    noisy = [
        str(w.message)
        for w in recwarn
        if "concurrent tasks for 'MapBatches(serve_stage)'" in str(w.message)
        or "ray_remote_args_fn" in str(w.message)
    ]
    assert not noisy, noisy


def test_transport_failures_are_retried_before_any_row_fails():
    relayllm.deploy(DeploymentConfig(name="flaky", backend="echo", options={"fail_calls": 2}))
    _ordered()
    out = build_processor(
        ProcessorConfig(
            deployment="flaky",
            task="completion",
            batch_size=50,
            max_in_flight_batches=1,
            max_retries=3,
        )
    )(
        ray.data.from_items([{"prompt": f"x{i}"} for i in range(50)], override_num_blocks=1)
    ).take_all()
    info = relayllm.get_deployment("flaky").handle().info.remote().result(timeout_s=30)
    relayllm.shutdown("flaky")
    assert [r["error"] for r in out] == [None] * 50
    assert info["calls"] == 3  # two injected failures, then the retry that worked


def test_exhausted_retries_mark_rows_failed_and_keep_them():
    relayllm.deploy(DeploymentConfig(name="down", backend="echo", options={"fail_calls": 100}))
    out = build_processor(
        ProcessorConfig(deployment="down", task="completion", batch_size=10, max_retries=1)
    )(
        ray.data.from_items([{"prompt": f"x{i}"} for i in range(30)], override_num_blocks=1)
    ).take_all()
    relayllm.shutdown("down")
    assert len(out) == 30
    assert all(
        "failed after 2 attempts" in r["error"] and "injected failure" in r["error"] for r in out
    )


def test_timeouts_are_retried_and_a_retry_joins_the_work_already_running():
    relayllm.deploy(DeploymentConfig(name="slow", backend="echo", options={"delay_s": 1.5}))
    out = build_processor(
        ProcessorConfig(
            deployment="slow",
            task="completion",
            batch_size=20,
            max_in_flight_batches=1,
            timeout_s=1.0,
            max_retries=3,
        )
    )(
        ray.data.from_items([{"prompt": f"x{i} y"} for i in range(20)], override_num_blocks=1)
    ).take_all()
    info = relayllm.get_deployment("slow").handle().info.remote().result(timeout_s=30)
    relayllm.shutdown("slow")
    assert [r["error"] for r in out] == [None] * 20
    assert info["calls"] >= 2, "the first call timed out and was retried"
    assert info["rows"] == 20, "the retry reused the in-flight results: no row computed twice"


def test_a_call_that_never_answers_in_time_becomes_row_errors():
    relayllm.deploy(DeploymentConfig(name="stuck", backend="echo", options={"delay_s": 30}))
    out = build_processor(
        ProcessorConfig(
            deployment="stuck", task="completion", batch_size=5, timeout_s=0.5, max_retries=1
        )
    )(
        ray.data.from_items([{"prompt": f"x{i}"} for i in range(5)], override_num_blocks=1)
    ).take_all()
    relayllm.shutdown("stuck")
    assert all("timeout_s=0.5" in r["error"] for r in out) and len(out) == 5
