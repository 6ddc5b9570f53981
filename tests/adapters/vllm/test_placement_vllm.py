"""Tensor/pipeline-parallel placement on logical GPUs: real Ray nodes, real Serve, the real
vllm deployment up to its engine seam (see placement_job.py). No vLLM engine starts."""

from pathlib import Path

import pytest
from support import job_result, run_cluster_job


@pytest.fixture(scope="module")
def placed() -> dict:
    script = Path(__file__).with_name("placement_job.py")
    out = run_cluster_job(script, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return job_result(out.stdout)


def test_tp2_pp2_reserves_one_group_of_four_gpu_bundles_with_the_replica_inside(placed):
    replicas, groups = placed["replicas"], placed["groups"]
    assert len(replicas) == 2 and len(groups) == 2, "one placement group per replica"
    for info in replicas:
        group = groups[info["placement_group"]["id"]]  # the replica runs in a group
        gpu_bundles = [b for b in group["bundles"].values() if b.get("GPU")]
        assert len(gpu_bundles) == 4 and all(b["GPU"] == 1 for b in gpu_bundles)
        # Pipeline stages may span nodes (PACK); tensor parallel alone needs one (STRICT_PACK).
        assert group["strategy"] == "PACK"
        assert group["nodes"] == [info["node_id"]], "PACK keeps the group on one node that fits it"


def test_the_engine_would_get_the_gpu_device_the_group_and_the_parallel_sizes(placed):
    for info in placed["replicas"]:
        assert info["device"] == "cuda"
        assert (info["tensor_parallel_size"], info["pipeline_parallel_size"]) == (2, 2)
        args = info["engine_args"]
        assert args["tensor_parallel_size"] == 2 and args["pipeline_parallel_size"] == 2
        assert args["distributed_executor_backend"] == "ray"  # workers go into the group's bundles
        # On GPU vLLM's own memory defaults stand: nothing CPU-specific leaks in.
        assert "gpu_memory_utilization" not in args and "kv_cache_memory_bytes" not in args


def test_two_replicas_on_two_gpu_nodes_get_one_node_each(placed):
    nodes = sorted(info["node_id"] for info in placed["replicas"])
    assert nodes == sorted(placed["gpu_nodes"])


def test_shutdown_releases_every_bundle(placed):
    assert placed["after_shutdown"] == {"live_groups": 0, "gpus_free": 8.0}


def test_more_gpus_than_the_cluster_has_fails_before_any_replica_starts(placed):
    too_big = placed["too_big"]
    assert too_big["type"] == "ResourceFitError"
    assert "GPU: needs 12, the cluster has 8" in too_big["error"]
    assert "deployment 'too-big' (3 replicas)" in too_big["error"]
    assert too_big["groups"] == 0 and "too-big" not in too_big["apps"]
