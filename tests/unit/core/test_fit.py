"""The one fit check's pure functions (relayllm.fit): demands, replica counts, GPU and
placement-group checks against given cluster views (the checks against a real cluster and the
pipeline deadlock they guard: tests/core/test_fit_on_ray.py)."""

import pytest

from relayllm import ResourceFitError
from relayllm.env import SKIP_FIT_CHECK
from relayllm.fit import Demand, check_fit, engine_demand, replica_count

# Registered for each test and removed after it (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("echo_backend")

GROUP = {  # serve options of a replica in a placement group: 1 CPU, then 4 GPUs
    "placement_group_bundles": [{"CPU": 1}] + [{"GPU": 1}] * 4,
    "placement_group_strategy": "PACK",
    "num_replicas": 2,
}


NODES = [{"CPU": 8.0, "GPU": 4.0}, {"CPU": 8.0, "GPU": 4.0}, {"CPU": 8.0}]


TOTAL = {"CPU": 24.0, "GPU": 8.0}


def check_deployment(name, serve_options):
    """What deploy() checks: the replicas against what the nodes have."""
    check_fit([engine_demand(name, serve_options)], None, TOTAL, NODES, subject=f"{name!r}")


def test_fitting_and_gpu_free_deployments_pass():
    check_deployment("x", GROUP)
    check_deployment("x", {"ray_actor_options": {"num_cpus": 0.5}, "num_replicas": 5})
    check_deployment("x", {"ray_actor_options": {"num_gpus": 1}, "num_replicas": 8})


def test_too_many_gpus_in_total_names_asked_and_existing():
    with pytest.raises(ResourceFitError) as err:
        check_deployment("big", {**GROUP, "num_replicas": 3})
    message = str(err.value)
    assert "GPU: needs 12, the cluster has 8" in message, message
    assert "deployment 'big' (3 replicas): 3 CPU, 12 GPU -- to change: lower num_replicas" in (
        message
    )
    with pytest.raises(ResourceFitError, match="GPU: needs 9"):
        check_deployment("x", {"ray_actor_options": {"num_gpus": 1}, "num_replicas": 9})
    autoscaled = {**GROUP, "autoscaling_config": {"min_replicas": 3, "max_replicas": 4}}
    with pytest.raises(ResourceFitError, match="GPU: needs 12"):
        check_deployment("x", autoscaled)


def test_strict_pack_needs_one_node_that_holds_the_group():
    tp8 = {
        "placement_group_bundles": [{"CPU": 1}] + [{"GPU": 1}] * 8,
        "placement_group_strategy": "STRICT_PACK",
        "num_replicas": 1,
    }
    with pytest.raises(ResourceFitError, match="8 GPU on one node .*more than any node has"):
        check_deployment("tp8", tp8)
    check_deployment("pp", {**tp8, "placement_group_strategy": "PACK"})  # may span nodes


def test_an_autoscaling_cluster_can_skip_the_check(monkeypatch):
    monkeypatch.setenv(SKIP_FIT_CHECK.name, "1")
    check_deployment("big", {**GROUP, "num_replicas": 30})


def test_one_rule_counts_replicas():
    assert replica_count({"num_replicas": 3}) == replica_count({"num_replicas": 3}, "max") == 3
    scaling = {"min_replicas": 0, "max_replicas": 4}
    assert replica_count({"num_replicas": 1, "autoscaling_config": scaling}) == 1  # work waits
    assert replica_count({"num_replicas": 1, "autoscaling_config": scaling}, "max") == 4
    started = {"autoscaling_config": {"min_replicas": 1, "initial_replicas": 2}}
    assert replica_count(started) == 2
    assert replica_count({}) == replica_count({"autoscaling_config": {"min_replicas": 1}}) == 1


def test_a_bundle_no_single_node_can_hold_is_refused_even_if_the_sum_fits():
    gpu_pair = Demand(
        "deployment 'tp2' (1 replica)", ({"CPU": 1}, {"GPU": 2}), 1, "lower tensor_parallel_size"
    )
    two_nodes = [{"CPU": 8, "GPU": 1}, {"CPU": 8, "GPU": 1}]
    with pytest.raises(ResourceFitError, match="asks 2 GPU, more than any node has"):
        check_fit([gpu_pair], {"CPU": 16, "GPU": 2}, {"CPU": 16, "GPU": 2}, two_nodes)
    check_fit([gpu_pair], {"CPU": 16, "GPU": 2}, {"CPU": 16, "GPU": 2}, [{"CPU": 8, "GPU": 2}])
