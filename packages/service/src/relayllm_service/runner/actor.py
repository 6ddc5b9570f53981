"""The runner's detached Ray actor: started, or found running with the same settings; stopped."""

from __future__ import annotations

import logging
import time
from typing import Any

from relayllm.compat import HEAD_RESOURCE
from relayllm_service.runner.loop import BatchRunner, runner_fields
from relayllm_service.settings import ServiceSettings

logger = logging.getLogger(__name__)

#: The runner's actor is named in this namespace, whatever namespace its starter has.
RUNNER_NAMESPACE = "relayllm"


def find_runner(name: str) -> Any | None:
    """The runner actor named ``name`` if it runs, else None."""
    import ray

    try:
        return ray.get_actor(name, namespace=RUNNER_NAMESPACE)
    except ValueError:
        return None


def stop_runner(name: str, *, timeout_s: float = 30.0) -> bool:
    """Kill the runner ``name`` for good (no restart) and wait until its name is free; False
    when none ran. Its batches stay claimed until their lease runs out, then the next runner
    on the state takes them over."""
    import ray

    actor = find_runner(name)
    if actor is None:
        return False
    ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + timeout_s
    while find_runner(name) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    return True


def start_runner(settings: ServiceSettings, *, replace: bool = False) -> Any:
    """The runner of ``settings.state_dir``: found by name if it runs with the same settings,
    else started (a detached actor, on the head node unless ``settings.node_resources`` says
    otherwise, that Ray restarts whenever its process dies). A running one with other
    settings, or any with ``replace``, is stopped first."""
    import ray

    running = find_runner(settings.runner_name)
    if running is not None:
        try:
            same = ray.get(running.settings_json.remote(), timeout=30) == runner_fields(settings)
        except Exception:  # restarting, or an older runner without settings_json
            logger.warning("the batch runner did not tell its settings", exc_info=True)
            same = False
        if replace or not same:
            logger.info("replacing the batch runner %s", settings.runner_name)
            stop_runner(settings.runner_name)
    actor: Any = ray.remote(BatchRunner)
    return actor.options(
        name=settings.runner_name,
        namespace=RUNNER_NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        max_restarts=-1,
        max_concurrency=4,  # wake() and pid() answer while nothing else blocks
        num_cpus=0,
        resources=settings.node_resources or HEAD_RESOURCE,
    ).remote(settings)


__all__ = ["RUNNER_NAMESPACE", "find_runner", "start_runner", "stop_runner"]
