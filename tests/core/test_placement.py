"""The deploy-time GPU fit check (pure: node GPUs are an argument)."""

import pytest

from relayllm.placement import SKIP_ENV, DoesNotFitError, check_fits

GROUP = {
    "placement_group_bundles": [{"CPU": 1}] + [{"GPU": 1}] * 4,
    "placement_group_strategy": "PACK",
    "num_replicas": 2,
}
NODES = {"aaaaaaaaaa": 4.0, "bbbbbbbbbb": 4.0, "cccccccccc": 0.0}


def test_fitting_and_gpu_free_deployments_pass():
    check_fits("x", GROUP, NODES)
    check_fits("x", {"ray_actor_options": {"num_cpus": 0.5}, "num_replicas": 5}, {})
    check_fits("x", {"ray_actor_options": {"num_gpus": 1}, "num_replicas": 8}, NODES)


def test_too_many_gpus_in_total_names_asked_and_existing():
    with pytest.raises(DoesNotFitError) as err:
        check_fits("big", {**GROUP, "num_replicas": 3}, NODES)
    message = str(err.value)
    assert "'big' asks for 12 GPUs (3 replica(s) x 4 GPUs (5 bundles, strategy PACK))" in message
    assert "the cluster has 8 (node aaaaaaaa: 4, node bbbbbbbb: 4, node cccccccc: 0)" in message
    with pytest.raises(DoesNotFitError, match="asks for 9 GPUs"):
        check_fits("x", {"ray_actor_options": {"num_gpus": 1}, "num_replicas": 9}, NODES)
    with pytest.raises(DoesNotFitError, match="min_replicas|asks for 12"):
        autoscaled = {**GROUP, "num_replicas": None, "autoscaling_config": {"min_replicas": 3}}
        check_fits("x", autoscaled, NODES)


def test_strict_pack_needs_one_node_that_holds_the_group():
    tp8 = {
        "placement_group_bundles": [{"CPU": 1}] + [{"GPU": 1}] * 8,
        "placement_group_strategy": "STRICT_PACK",
        "num_replicas": 1,
    }
    with pytest.raises(DoesNotFitError, match="8 GPUs on one node .* largest node has 4"):
        check_fits("tp8", tp8, NODES)
    check_fits("pp", {**tp8, "placement_group_strategy": "PACK"}, NODES)  # may span nodes


def test_an_autoscaling_cluster_can_skip_the_check(monkeypatch):
    monkeypatch.setenv(SKIP_ENV, "1")
    check_fits("big", {**GROUP, "num_replicas": 30}, NODES)
