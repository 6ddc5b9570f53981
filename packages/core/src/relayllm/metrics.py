"""Deprecated: moved to :mod:`relayllm.serving.metrics` (goes in 0.3); kept so adapters that import
it keep working."""

from __future__ import annotations

import warnings

from relayllm.backend import AdapterContractWarning
from relayllm.serving.metrics import *  # noqa: F403
from relayllm.serving.metrics import __all__ as __all__

warnings.warn(
    "relayllm.metrics moved to relayllm.serving.metrics; the old path goes in relayllm 0.3",
    AdapterContractWarning,
    stacklevel=2,
)
