"""Ray's private APIs relayllm uses, in one place, each behind a small function.

Ray is pinned to ``2.60.*``; these names may change in any other release. The contract test
(``tests/core/test_compat_on_ray.py``) checks every one of them against the installed Ray, so an
upgrade fails there, loudly and by name, instead of deep inside a run. Nothing here imports
Ray at module level.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: What each function below relies on (the contract test checks these exist).
PRIVATE_APIS = (
    "ray.serve.api._run(app, name=, route_prefix=, _blocking=)",
    "ray.serve.handle.DeploymentHandle._init(_run_router_in_separate_loop=)",
    "DeploymentHandle.options(_by_reference=)",
    "ray.serve.context._get_global_client()._controller.get_proxy_location()",
    "ray.data.Dataset._logical_plan.dag.ray_remote_args",
    "ray.data._internal.execution.execution_callback.ExecutionCallback",
    "ray.serve.context._check_cached_client_alive() / _get_global_client()._controller",
    "ServeController.get_deployment_details(app, deployment).replicas (actor_name, state)",
    "ReplicaActor.handle_request(pickled RequestMetadata(call_method=, app_name=), *args)",
    "ray._private.authentication.authentication_token_setup"
    ".maybe_enable_token_auth_if_token_available(warn_if_disabled=) / AUTH_MODE_ENV_VAR",
    "ray.core.generated.gcs_service_pb2_grpc.NodeInfoGcsServiceStub.GetClusterId (no token)",
    "ray._private.services.canonicalize_bootstrap_address(address) (None or 'auto': found)",
    "ray._private.worker.print_to_stdstream(data, ignore_prefix) / print_worker_logs",
    "DeploymentHandle._router._asyncio_router.request_router",
    "RequestRouter._fulfill_next_pending_request(replica, request_metadata) and "
    "_get_pending_request_matching_internal_request_id (serving/router.py overrides them)",
    "the custom resource node:__internal_head__, which only the head node has",
)

#: Ray's resource that only the head node has. What must outlive any worker node -- a
#: deployment's control state, the Batch API's runner and gateway -- asks for a sliver of it:
#: a worker node may be preempted, the head holds the cluster itself.
HEAD_RESOURCE = {"node:__internal_head__": 0.001}


def run_application(app: Any, name: str, route_prefix: str | None = None) -> None:
    """Submit a Serve application and return at once. ``serve.run()`` waits with no time
    limit; submitting without blocking lets ``deploy()`` bound the start-up and report the
    replica's own failure message. ``route_prefix``: the path Serve's HTTP proxy routes to
    the application (None: reached through handles only)."""
    from ray.serve.api import _run

    _run(app, name=name, route_prefix=route_prefix, _blocking=False)


def serve_proxy() -> tuple[bool, str, int]:
    """Whether the running Serve has an HTTP proxy, and the host and port it binds."""
    import ray
    from ray.serve.context import _get_global_client

    client: Any = _get_global_client()
    location = ray.get(client._controller.get_proxy_location.remote())
    config = client.http_config
    disabled = location is None or str(getattr(location, "value", location)) in (
        "Disabled",
        "NoServer",
    )
    return not disabled, str(config.host), int(config.port)


def handle_on_this_loop(deployment_name: str, app_name: str) -> Any:
    """A deployment handle of our own (not Serve's per-process cached one) whose router runs
    on the calling event loop: no hop to Serve's router thread and back per call."""
    from ray.serve.handle import DeploymentHandle

    handle: Any = DeploymentHandle(deployment_name, app_name)
    handle._init(_run_router_in_separate_loop=False)
    return handle


def grpc_transport(handle: Any) -> Any:
    """``handle`` calling its replica over Serve's gRPC transport instead of actor calls."""
    return handle.options(_by_reference=False)


def request_router(handle: Any) -> Any:
    """The Serve request router behind ``handle`` (the deployment's ``request_router_config``
    class), None until the handle has learnt the deployment's config from Serve's controller."""
    inner = getattr(getattr(handle, "_router", None), "_asyncio_router", None)
    return None if inner is None else inner.request_router


def set_task_num_cpus(dataset: Any, num_cpus: float) -> Any:
    """Set the CPUs of the tasks of the last operator of ``dataset`` (for operators whose
    method takes no ``ray_remote_args``, like ``repartition``); returns ``dataset``."""
    dataset._logical_plan.dag.ray_remote_args["num_cpus"] = num_cpus
    return dataset


def live_serve_controller() -> str | None:
    """The id of the Serve controller this process talks to (None: Serve is not running).
    A cached client whose controller died -- Serve shut down and started again -- is dropped
    first: Serve keeps one per process, and processes that outlive a run (the stage as
    tasks) would otherwise keep calling the dead controller."""
    from ray.serve import context

    context._check_cached_client_alive()
    client: Any = context._get_global_client(raise_if_no_controller_running=False)
    return None if client is None else str(client._controller._actor_id.hex())


def running_replicas(app_name: str, deployment_name: str) -> list[tuple[str, str]]:
    """(replica id, actor name) of every RUNNING replica of a deployment, from Serve's
    controller: a handle reaches one replica of its choosing, a control call must reach each."""
    import ray
    from ray.serve.context import _get_global_client

    client: Any = _get_global_client()
    details = ray.get(client._controller.get_deployment_details.remote(app_name, deployment_name))
    return [
        (str(r.replica_id), str(r.actor_name))
        for r in details.replicas
        if str(getattr(r.state, "value", r.state)) == "RUNNING"
    ]


def call_replica(actor_name: str, app_name: str, method: str, *args: Any) -> Any:
    """Call ``method`` of the deployment on the replica actor ``actor_name`` (an ObjectRef;
    None when that actor is gone),
    as Serve's router does, but on that replica: Serve's slots and queue are not involved, so
    a control call reaches a replica whose slots are all held by paused batch calls."""
    import pickle
    import uuid

    import ray
    from ray.serve._private.common import RequestMetadata

    try:
        actor = ray.get_actor(actor_name, namespace="serve")
    except ValueError:  # it died since Serve's controller listed it
        return None
    metadata = RequestMetadata(
        request_id=uuid.uuid4().hex,
        internal_request_id=uuid.uuid4().hex,
        call_method=method,
        app_name=app_name,
    )
    return actor.handle_request.remote(pickle.dumps(metadata), *args)


def send_ray_token_if_any(address: str | None = None) -> bool:
    """Turn token authentication on for this process (and its children) when
    ``RAY_AUTH_MODE`` is unset and a token is at hand (``RAY_AUTH_TOKEN``,
    ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``): Ray's own rule for ``address="auto"``,
    which it skips for an explicit address. Returns whether tokens are sent. (Ray's notice
    that "token authentication is enabled for this Ray cluster" is meant for a cluster's
    start: not said.)

    Not for a cluster at ``address`` that takes calls without a token
    (:func:`cluster_takes_no_token`): a driver with token authentication on refuses the
    cluster's own calls into it (Ray logs "Missing authorization header in request!"), so
    the connection seems fine and every Serve call waits for an answer that never comes."""
    import logging
    import os

    from ray._private.authentication import authentication_token_setup as setup

    if setup.AUTH_MODE_ENV_VAR not in os.environ and address and cluster_takes_no_token(address):
        return False
    notices = logging.getLogger(setup.__name__)
    was_disabled, notices.disabled = notices.disabled, True
    try:
        return bool(setup.maybe_enable_token_auth_if_token_available(warn_if_disabled=False))
    finally:
        notices.disabled = was_disabled


def found_cluster(address: str | None) -> str | None:
    """The cluster ``ray.init(address=address)`` would join for ``address`` None (the one
    ``ray start`` left on this machine) or ``"auto"`` (that one, else any running here), as
    ``HOST:PORT``, found as Ray finds it; None: none, so ``ray.init`` would start one. Raises
    :class:`ConnectionError` for ``"auto"`` with none, as Ray does.

    Joining by the address found keeps Ray from turning token authentication on for a
    cluster it found itself whenever a token is at hand (its rule for None and ``"auto"``):
    :func:`send_ray_token_if_any` decides instead, as for any address."""
    from ray._private import services

    # Annotated as str, but None is Ray's own "no address" there too.
    found = services.canonicalize_bootstrap_address(address)  # type: ignore[arg-type]
    return None if found is None else str(found)


def cluster_takes_no_token(address: str, timeout_s: float = 5.0) -> bool:
    """Whether the cluster at ``address`` (its GCS, ``HOST:PORT``) answers a call that
    carries no token, so it does not use token authentication. False when that cannot be
    told (a Ray Client address, nothing listening, no answer in ``timeout_s``): the token
    at hand is sent, as Ray would."""
    if "://" in address:
        return False
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        request = gcs_service_pb2.GetClusterIdRequest()  # type: ignore[attr-defined]
        try:
            stub.GetClusterId(request, timeout=timeout_s)
        except grpc.RpcError:  # UNAUTHENTICATED, or no answer: not known to be open
            return False
    return True


def route_ray_error_lines(target: Callable[[], Any]) -> None:
    """Ray's driver prints the errors Ray publishes for its job (a task of Serve's controller
    that failed while it shut down, a worker that died) on stdout, whatever ``log_to_driver``
    says, in between a command's own output. Each such line goes to the stream ``target()``
    returns instead, formatted as Ray formats it (None: printed as Ray prints it). Installed
    once per process; the listener thread looks the function up on every message."""
    from ray._private import worker

    if getattr(worker.print_to_stdstream, "__wrapped__", None) is not None:
        worker.print_to_stdstream.__dict__["target"] = target
        return
    original = worker.print_to_stdstream

    def print_to_stdstream(data: dict[str, Any], ignore_prefix: bool) -> None:
        stream = print_to_stdstream.__dict__["target"]()
        if stream is None or data.get("pid") != "raylet":
            original(data, ignore_prefix)
            return
        worker.print_worker_logs(data, stream, ignore_prefix)

    print_to_stdstream.__dict__.update(target=target, __wrapped__=original)
    worker.print_to_stdstream = print_to_stdstream


def execution_callback_class() -> type:
    """Ray Data's ``ExecutionCallback``: a hook called on every turn of the executor loop."""
    from ray.data._internal.execution.execution_callback import ExecutionCallback

    return ExecutionCallback


__all__ = [
    "HEAD_RESOURCE",
    "PRIVATE_APIS",
    "call_replica",
    "execution_callback_class",
    "found_cluster",
    "grpc_transport",
    "handle_on_this_loop",
    "live_serve_controller",
    "request_router",
    "route_ray_error_lines",
    "run_application",
    "running_replicas",
    "cluster_takes_no_token",
    "send_ray_token_if_any",
    "serve_proxy",
    "set_task_num_cpus",
]
