"""Connecting to Ray and starting Serve: on demand, once, against a local or existing cluster."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator

from relayllm.errors import ConfigError

ADDRESS_ENV = "RAY_ADDRESS"
#: Ray's setting of its workers' nice value (Ray's default 15 makes every worker, an engine's
#: replica and its engine processes included, yield the CPU to any other process).
NICENESS_ENV = "RAY_worker_niceness"


def connect(
    address: str | None = None,
    *,
    quiet: bool | None = None,
    existing_cluster: bool = False,
    start_serve: bool = True,
) -> str:
    """Connect to Ray (``address`` or ``RAY_ADDRESS``; else a running local cluster or a new
    one) and make sure Serve runs, without an HTTP proxy -- relayllm talks through handles.
    Returns the address of the cluster connected to.

    ``quiet`` (default: as :func:`relayllm.configure_logging` chose) keeps the workers' and
    engines' output in Ray's session logs instead of forwarding it here; ``quiet=True`` also
    leaves out Ray's own INFO lines.
    ``existing_cluster``: fail instead of starting a new local cluster. A cluster that cannot
    be reached raises :class:`~relayllm.ConfigError` saying what to do.
    ``start_serve=False``: for what only reads (a listing): Serve is not started on a cluster
    where it does not run.

    A cluster started with ``ray start`` (Ray 2.60) uses token authentication, and Ray sends
    the token only when ``RAY_AUTH_MODE=token`` or when it found the cluster itself (None or
    ``auto``), then whether the cluster takes tokens or not. relayllm finds that cluster first
    and joins it by its address, and for every existing cluster sends the token it has at
    hand only if the cluster takes tokens."""
    import ray
    from ray import serve

    from relayllm import compat
    from relayllm.logs import announce, is_verbose, quiet_ray_loggers

    if not ray.is_initialized():
        verbose = is_verbose() if quiet is None else not quiet
        said = announce()
        if said:  # a library's one line: where its host's console noise went
            print(said, file=sys.stderr, flush=True)
        quiet_ray_loggers()  # before init: Ray logs its token-authentication notice there
        address = address or os.environ.get(ADDRESS_ENV) or ("auto" if existing_cluster else None)
        try:
            if address in (None, "auto"):  # the cluster Ray would find, joined by its address
                address = compat.found_cluster(address)
            if address and address != "local":
                compat.send_ray_token_if_any(address)
            with _workers_at_normal_priority():
                ray.init(
                    address=address,
                    namespace="relayllm",
                    log_to_driver=verbose,
                    # Ray's INFO lines go to the log file; quiet=True (the CLI) drops them too.
                    logging_level=logging.WARNING if quiet else logging.INFO,
                    configure_logging=True,
                    # A local cluster started here has no dashboard: nothing in relayllm reads
                    # it, and its processes hold ~0.4 GiB (measured on the demo pipeline:
                    # docs/experiments/demo-memory.md).
                    # A cluster started with `ray start` keeps its own (ignored when connecting).
                    include_dashboard=False,
                )
        except ConnectionError as exc:
            raise ConfigError(connection_advice(address, exc)) from None
    quiet_ray_loggers()
    if start_serve:
        serve.start(proxy_location="Disabled")
        quiet_ray_loggers()  # Serve sets its logger up on start
    try:
        return str(ray.get_runtime_context().gcs_address)
    except Exception:  # a Ray Client connection (ray://) may not say
        return str(address or "")


@contextlib.contextmanager
def _workers_at_normal_priority() -> Iterator[None]:
    """While ``ray.init`` runs: a local cluster it starts runs its workers at nice 0, unless
    the user set ``RAY_worker_niceness``. Ray's default (15) is for machines where workers
    are background work; the workers of a cluster relayllm starts are the job -- the engine's
    replica and the engine's own processes (children of the replica) among them -- and at
    nice 15 they yield the CPU to every other process on the machine, where vLLM's own
    runner, say, competes as an equal (docs/experiments/batch-vs-vllm-run-batch.md). Only a raylet
    started by this call reads the setting (it inherits the environment); connecting to a
    running cluster leaves its workers as they are."""
    if NICENESS_ENV in os.environ:
        yield
        return
    os.environ[NICENESS_ENV] = "0"
    try:
        yield
    finally:
        os.environ.pop(NICENESS_ENV, None)


def ensure_http_proxy(host: str, port: int) -> None:
    """Make sure Serve's HTTP proxy listens on ``host:port`` (a deployment's HTTP front).

    Serve fixes its proxy when it starts, for the whole cluster, and :func:`connect` starts it
    without one. While no Serve application runs, Serve is restarted with a proxy (nothing is
    lost); otherwise a missing or differently bound proxy is an error that says what to do."""
    from ray import serve

    from relayllm import compat

    running, bound_host, bound_port = compat.serve_proxy()
    if running and (bound_host, bound_port) == (host, port):
        return
    apps = sorted(serve.status().applications)
    if running:
        raise ConfigError(
            f"Serve's HTTP proxy on this cluster listens on {bound_host}:{bound_port} (one "
            f"proxy per cluster); set the deployment's http.host/http.port to those instead "
            f"of {host}:{port}"
        )
    if apps:
        raise ConfigError(
            "Serve runs on this cluster without an HTTP proxy and applications are running "
            f"({', '.join(apps)}), so it cannot be restarted with one. Deploy the deployments "
            "with an http section first, or shut the others down (relayllm shutdown), or "
            f"start Serve with its proxy: serve start --proxy-location HeadOnly "
            f"--http-host {host} --http-port {port}"
        )
    serve.shutdown()
    try:
        serve.start(proxy_location="HeadOnly", http_options={"host": host, "port": port})
    except Exception as exc:
        raise ConfigError(
            f"Serve's HTTP proxy could not start on {host}:{port} ({exc}); is the port in use? "
            "Pick another http.port"
        ) from exc


def connection_advice(address: str | None, exc: BaseException) -> str:
    """What to do when ``ray.init`` cannot connect: the token advice for an authenticated
    cluster (Ray 2.60 clusters use tokens; a driver sends one only with RAY_AUTH_MODE=token)."""
    text = f"{exc} {exc.__cause__ or ''}".lower()
    auth = type(exc.__cause__).__name__ == "AuthenticationError" or any(
        word in text for word in ("authentication", "auth token", "unauthenticated")
    )
    sending = os.environ.get("RAY_AUTH_MODE", "").lower() == "token"
    if auth or (address and address != "auto" and _cluster_answers(address)):
        if sending:  # relayllm sent the token it found: not this cluster's
            return (
                f"the Ray cluster at {address} refused this machine's Ray token: copy the "
                f"cluster's token (`ray get-auth-token` on its head node) to ~/.ray/auth_token "
                f"or set RAY_AUTH_TOKEN"
            )
        return (
            f"the Ray cluster at {address} uses token authentication and no token was found "
            f"here: copy the cluster's token (`ray get-auth-token` on its head node) to "
            f"~/.ray/auth_token or set RAY_AUTH_TOKEN (relayllm then sends it)"
        )
    return (
        f"no Ray cluster to connect to ({exc}). Start one with `ray start --head` and "
        f"pass --address HOST:PORT or set RAY_ADDRESS."
    )


def _cluster_answers(address: str) -> bool:
    """Something listens on ``address`` yet refused us: with Ray 2.60's token authentication
    that is the reason, though Ray's own error does not always say so."""
    import socket

    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=2):
            return True
    except (OSError, ValueError):
        return False


__all__ = ["ADDRESS_ENV", "connect", "connection_advice"]
