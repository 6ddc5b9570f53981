"""The Ray Data hook behind ``relayllm run``'s progress bars (imported only once Ray runs).

An ``ExecutionCallback`` (a private hook of Ray Data 2.60; Ray is pinned to 2.60.*) is called
on every turn of the executor loop; it hands the executor's counts to the active display.
It lives in a module of its own so the class pickles by reference: the ``DataContext`` that
holds it travels to Ray's workers with every task.
"""

from __future__ import annotations

from typing import Any

from ray.data._internal.execution.execution_callback import ExecutionCallback


class ProgressCallback(ExecutionCallback):
    def on_execution_step(self, executor: Any) -> None:
        from relayllm.cli.progress import ACTIVE

        if ACTIVE:
            try:
                ACTIVE[-1].update_from_executor(executor)
            except Exception:  # a progress display never fails a run
                pass
