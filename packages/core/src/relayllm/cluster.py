"""Connecting to Ray and starting Serve: on demand, once, against a local or existing cluster."""

from __future__ import annotations

import os

ADDRESS_ENV = "RAY_ADDRESS"


def connect(address: str | None = None) -> None:
    """Connect to Ray (``address`` or ``RAY_ADDRESS``; else a running local cluster or a new
    one) and make sure Serve runs, without an HTTP proxy -- relayllm talks through handles."""
    import ray
    from ray import serve

    if not ray.is_initialized():
        ray.init(
            address=address or os.environ.get(ADDRESS_ENV) or None,
            namespace="relayllm",
            log_to_driver=os.environ.get("RELAYLLM_QUIET_WORKERS", "") == "",
            configure_logging=True,
        )
    serve.start(proxy_location="Disabled")
