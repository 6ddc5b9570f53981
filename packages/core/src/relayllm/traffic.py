"""Deprecated: moved to :mod:`relayllm.serving.traffic` (goes in 0.3); kept so adapters that import
it keep working."""

from __future__ import annotations

import warnings

from relayllm.backend import AdapterContractWarning
from relayllm.serving.traffic import *  # noqa: F403
from relayllm.serving.traffic import __all__ as __all__

warnings.warn(
    "relayllm.traffic moved to relayllm.serving.traffic; the old path goes in relayllm 0.3",
    AdapterContractWarning,
    stacklevel=2,
)
