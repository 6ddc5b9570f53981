"""The contract with Ray's private APIs (relayllm.compat) that can be checked without a cluster:
the names exist in the installed Ray (the ones that need Serve running:
tests/core/test_compat_on_ray.py)."""

from __future__ import annotations

import inspect

from relayllm import compat, versions


def test_serve_run_without_blocking_exists():
    from ray.serve.api import _run

    params = inspect.signature(_run).parameters
    assert {"name", "route_prefix", "_blocking"} <= set(params), (
        "ray.serve.api._run changed; relayllm.compat.run_application needs updating"
    )


def test_execution_callback_hook_exists():
    base = compat.execution_callback_class()
    assert callable(getattr(base, "on_execution_step", None)), (
        "Ray Data's ExecutionCallback changed; relayllm's progress bars need updating"
    )


def test_the_replica_fan_out_names_exist():
    """compat.running_replicas / call_replica: the controller's replica list and a call to
    one replica actor, as Serve's router sends it (run against a cluster in
    tests/core/test_control_on_ray.py)."""
    from ray.serve._private.common import RequestMetadata
    from ray.serve._private.controller import ServeController
    from ray.serve._private.replica import ReplicaActor
    from ray.serve.schema import ReplicaDetails

    assert callable(getattr(ServeController, "get_deployment_details", None))
    assert callable(getattr(ReplicaActor, "handle_request", None))
    fields = RequestMetadata.__dataclass_fields__
    assert {"request_id", "internal_request_id", "call_method", "app_name"} <= set(fields)
    assert {"actor_name", "state", "replica_id"} <= set(ReplicaDetails.model_fields)


def test_the_token_probe_names_exist():
    """compat.cluster_takes_no_token: a GCS call made without a token (answered: the cluster
    takes no tokens; run against clusters in tests/core/test_compat_on_ray.py and the cluster
    tier)."""
    from ray._private.authentication import authentication_token_setup as setup
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    assert setup.AUTH_MODE_ENV_VAR == "RAY_AUTH_MODE"
    assert callable(getattr(gcs_service_pb2_grpc.NodeInfoGcsServiceServicer, "GetClusterId", None))
    assert "GetClusterIdRequest" in gcs_service_pb2.DESCRIPTOR.message_types_by_name


def test_the_lookup_of_a_cluster_on_this_machine_exists():
    """compat.found_cluster: the cluster Ray's ray.init() would find for no address or
    "auto", found as Ray finds it (run against a cluster in the cluster tier)."""
    from ray._private import services

    params = list(inspect.signature(services.canonicalize_bootstrap_address).parameters)
    assert params[0] == "addr" and "temp_dir" in params, (
        "ray._private.services.canonicalize_bootstrap_address changed; "
        "relayllm.compat.found_cluster needs updating"
    )


def test_every_private_api_is_listed_and_ray_is_a_supported_release():
    assert len(compat.PRIVATE_APIS) == 16
    installed = versions.installed("ray")
    assert installed and versions.matches(installed, versions.RAY_VERSIONS), (
        f"Ray {installed} is not the release relayllm.compat is written for "
        f"({versions.RAY_VERSIONS}): check every private API above, then move the pin"
    )
