"""Connecting to Ray and starting Serve: on demand, once, against a local or existing cluster."""

from __future__ import annotations

import os
import sys

ADDRESS_ENV = "RAY_ADDRESS"


def connect(address: str | None = None) -> None:
    """Connect to Ray (``address`` or ``RAY_ADDRESS``; else a running local cluster or a new
    one) and make sure Serve runs, without an HTTP proxy -- relayllm talks through handles.
    Logs follow :func:`relayllm.configure_logging` (quiet unless asked)."""
    import ray
    from ray import serve

    from relayllm.logs import announce, is_verbose, quiet_ray_loggers

    if not ray.is_initialized():
        verbose = is_verbose()
        said = announce()
        if said:  # a library's one line: where its host's console noise went
            print(said, file=sys.stderr, flush=True)
        quiet_ray_loggers()  # before init: Ray logs its token-authentication notice there
        ray.init(
            address=address or os.environ.get(ADDRESS_ENV) or None,
            namespace="relayllm",
            log_to_driver=verbose,
            configure_logging=True,
        )
    quiet_ray_loggers()
    serve.start(proxy_location="Disabled")
    quiet_ray_loggers()  # Serve sets its logger up on start
