"""Four pipelines on one deployment with a small admission limit, 100k rows through echo:
nothing hangs, the limit holds, and memory stays bounded."""

import resource
import threading
import time

import pytest
import ray
from support import children, peak_rss_mib

import relayllm
from relayllm import DeploymentConfig, ProcessorConfig, build_processor
from relayllm.stage.udf import STAGE_OPERATOR_NAMES

pytestmark = pytest.mark.usefixtures("ray_session")

ROWS_PER_PIPELINE = 25_000


def _stage_pids() -> set[int]:
    """This cluster's stage processes: children of our raylet that Ray titled after the stage
    ("ray::MapBatches(serve_stage)" while a worker runs a stage task, or
    "ray::MapWorker(MapBatches(ServeStage))" for an actor). Other Ray clusters are ignored."""
    raylet = ray._private.worker._global_node.all_processes["raylet"][0].process.pid
    return children(raylet, *(name.encode() for name in STAGE_OPERATOR_NAMES))


def test_four_pipelines_share_one_small_deployment_without_hanging_or_growing(record_result):
    relayllm.deploy(
        DeploymentConfig(
            name="crowded", backend="echo", max_ongoing_requests=2, options={"delay_s": 0.002}
        )
    )
    counts = [0] * 4
    errors = [0] * 4

    def pipeline(k: int) -> None:
        ds = ray.data.range(ROWS_PER_PIPELINE, override_num_blocks=50).map_batches(
            lambda b: {"id": b["id"], "prompt": [f"pipeline row {i}" for i in b["id"]]}
        )
        proc = build_processor(
            ProcessorConfig(
                deployment="crowded", task="completion", batch_size=100, timeout_s=60, max_retries=5
            )
        )
        for batch in proc(ds).iter_batches(batch_size=1000, batch_format="pyarrow"):
            counts[k] += batch.num_rows
            errors[k] += batch.num_rows - batch["error"].null_count

    start = time.monotonic()
    threads = [threading.Thread(target=pipeline, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    stage_pids: set[int] = set()
    peaks: dict[int, float] = {}
    while any(t.is_alive() for t in threads):
        assert time.monotonic() - start < 600, "the pipelines hang"
        stage_pids.update(_stage_pids())
        for pid in stage_pids:
            try:
                peaks[pid] = max(peaks.get(pid, 0.0), peak_rss_mib(pid))
            except (FileNotFoundError, ProcessLookupError):
                pass
        time.sleep(1)
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start

    info = relayllm.get_deployment("crowded").handle().info.remote().result(timeout_s=30)
    relayllm.shutdown("crowded")
    assert counts == [ROWS_PER_PIPELINE] * 4 and errors == [0] * 4
    assert info["rows"] == 4 * ROWS_PER_PIPELINE
    assert info["peak_ongoing"] <= 2, "the deployment's admission limit was exceeded"
    driver_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"\noverload: {4 * ROWS_PER_PIPELINE} rows in {elapsed:.1f}s, driver peak RSS "
        f"{driver_mib:.0f} MiB, stage process peak RSS {max(peaks.values(), default=0):.0f} MiB, "
        f"peak concurrent calls {info['peak_ongoing']}"
    )
    assert peaks, "saw the stage's processes"
    assert max(peaks.values()) < 1024, "a stage process's memory grew past 1 GiB"
    assert driver_mib < 2048, "the driver's memory grew past 2 GiB"
    record_result(
        "overload",
        {
            "rows": 4 * ROWS_PER_PIPELINE,
            "seconds": round(elapsed, 1),
            "peak_ongoing": info["peak_ongoing"],
            "limit": 2,
            "driver_peak_mib": round(driver_mib),
            "stage_actor_peak_mib": round(max(peaks.values())),
        },
    )
