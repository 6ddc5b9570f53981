"""Which Serve replica, Ray node and address the calling process is: what a replica's
``info()`` reports and what the echo backend stamps on its answers. None outside Ray (a unit
test calling the classes directly)."""

from __future__ import annotations


def replica_id() -> str | None:
    try:
        from ray import serve

        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # not inside a replica
        return None


def node_id() -> str | None:
    try:
        import ray

        return ray.get_runtime_context().get_node_id()
    except Exception:
        return None


def node_ip() -> str | None:
    try:
        import ray

        return str(ray.util.get_node_ip_address())
    except Exception:
        return None


__all__ = ["node_id", "node_ip", "replica_id"]
