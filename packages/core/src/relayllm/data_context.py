"""The one place relayllm changes Ray Data's ``DataContext``.

The context is process-global, and a dataset keeps the copy taken when it was created, so
every setting relayllm needs is made here, by name, and nowhere else.
"""

from __future__ import annotations

from typing import Any


def keep_input_order(context: Any = None) -> None:
    """Rows come out in input order (``preserve_order``) on ``context`` -- a dataset's own
    copy, ``dataset.context`` -- or else on the current one. Set it before a dataset exists:
    a read of small tasks otherwise finishes blocks out of order."""
    if context is None:
        from ray.data import DataContext

        context = DataContext.get_current()
    context.execution_options.preserve_order = True


def use_progress(callback_class: type | None, *, ray_bars: bool) -> None:
    """Count rows with ``callback_class`` (an ``ExecutionCallback``; added once) and show Ray
    Data's own per-operator progress bars only if ``ray_bars``."""
    from ray.data import DataContext

    context = DataContext.get_current()
    context.enable_progress_bars = ray_bars
    if callback_class is not None and callback_class not in (
        context.custom_execution_callback_classes
    ):
        context.custom_execution_callback_classes.append(callback_class)


__all__ = ["keep_input_order", "use_progress"]
