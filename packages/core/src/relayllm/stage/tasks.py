"""The stage as Ray Data tasks (``ProcessorConfig.compute == "tasks"``).

Ray keeps a task's worker process for the next task, so what an actor builds anew for every
run -- a process, its imports (ray.serve), the handle's router -- is built once per process
and kept here. A Ray Data run then starts no actor: for a 64-row pass that is most of the
time relayllm adds (docs/benchmarks.md, "What one small pass costs"). Stages are kept per
application of a processor to a dataset (``run_id``), so each run checks its deployment
once, as an actor would; handles are kept per deployment and Serve controller
(:data:`relayllm.stage.transport.HandlesKey`), on one event loop per process.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict

import pyarrow as pa

from relayllm import compat
from relayllm.config import ProcessorConfig, RowFn
from relayllm.stage.udf import ServeStage

#: Stages kept per worker process (the runs applied most recently).
KEPT_STAGES = 8

_stages: OrderedDict[str, ServeStage] = OrderedDict()  # run_id -> its stage
_loop: asyncio.AbstractEventLoop | None = None
_lock = threading.Lock()


def serve_stage(
    batch: pa.Table,
    *,
    run_id: str,
    config: ProcessorConfig,
    processor_id: str,
    preprocess: RowFn | None = None,
    postprocess: RowFn | None = None,
    deployment_seen: bool = False,
) -> pa.Table:
    """``map_batches`` UDF (a task): the run's stage, kept by this process, on its loop."""
    with _lock:
        stage = _stages.get(run_id)
        if stage is None:
            # Once per run, not per batch: a controller that Serve started again since this
            # process's last run is found here. Built off the loop: its deployment checks wait
            # on Serve synchronously.
            controller = compat.live_serve_controller()
            stage = ServeStage(
                config,
                processor_id,
                preprocess,
                postprocess,
                run_id=run_id,
                deployment_seen=deployment_seen,
                handles_key=(config.deployment, controller, _deployed_at(config.deployment)),
            )
            _stages[run_id] = stage
            while len(_stages) > KEPT_STAGES:
                _stages.popitem(last=False)
        _stages.move_to_end(run_id)
        loop = _process_loop()
    return asyncio.run_coroutine_threadsafe(stage(batch), loop).result()


def _deployed_at(name: str) -> float | None:
    from ray import serve

    from relayllm.deployments import app_name

    app = serve.status().applications.get(app_name(name))
    return None if app is None else app.last_deployed_time_s


def _process_loop() -> asyncio.AbstractEventLoop:
    """This process's event loop, on a daemon thread: the handles' routers live on it."""
    global _loop
    if _loop is None:
        _loop = asyncio.new_event_loop()
        threading.Thread(target=_loop.run_forever, name="relayllm-stage", daemon=True).start()
    return _loop


__all__ = ["KEPT_STAGES", "serve_stage"]
