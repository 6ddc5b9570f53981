"""The Ray Data hook behind ``relayllm run``'s progress bars (imported only once Ray runs).

An ``ExecutionCallback`` (a private hook of Ray Data, reached through :mod:`relayllm.compat`)
is called on every turn of the executor loop; it hands the executor's counts to the active
display. It lives in a module of its own so the class pickles by reference: the
``DataContext`` that holds it travels to Ray's workers with every task.
"""

from __future__ import annotations

from typing import Any

from relayllm.compat import execution_callback_class

#: The displays this process feeds (at most one at a time; ``cli/progress.py`` adds them).
ACTIVE: list[Any] = []


class ProgressCallback(execution_callback_class()):  # type: ignore[misc]
    def on_execution_step(self, executor: Any) -> None:
        if ACTIVE:
            try:
                ACTIVE[-1].update_from_executor(executor)
            except Exception:  # a progress display never fails a run
                pass
