"""What a run shows as it goes: the base that both runs' displays (a pipeline's and a batch
file's) extend, and the one way an old name of theirs is still found for a release."""

from __future__ import annotations

import contextlib
import warnings
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from relayllm.deployments import DeploymentConfig


class Progress:
    """The default shows nothing and connects with :func:`relayllm.cluster.connect`; a display
    (the command line's) overrides these."""

    def connect(self, address: str | None) -> None:
        """Called once everything that can be checked before the cluster is checked."""
        from relayllm.cluster import connect

        connect(address)

    def deploying(self, config: DeploymentConfig, running: bool) -> AbstractContextManager[Any]:
        """Held while ``config`` is deployed (``running``: reused, already up)."""
        return contextlib.nullcontext()


def renamed(
    old: str,
    new: str,
    value: Any,
    *,
    category: type[Warning] = DeprecationWarning,
    stacklevel: int = 3,
) -> Any:
    """``value``, with a warning that ``old`` is ``new``'s name until the next release (for a
    module's ``__getattr__`` and a renamed keyword argument)."""
    warnings.warn(
        f"{old} is renamed {new}; the old name goes in the next release",
        category,
        stacklevel=stacklevel,
    )
    return value
