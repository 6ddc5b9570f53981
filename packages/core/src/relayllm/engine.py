"""Deprecated: 0.1.0's module of ``BatchDeployment``, now :mod:`relayllm.serving.replica`
(goes in 0.3); kept so adapters that import it keep working."""

from __future__ import annotations

import warnings

from relayllm.backend import AdapterContractWarning
from relayllm.serving.replica import *  # noqa: F403
from relayllm.serving.replica import __all__ as __all__

warnings.warn(
    "relayllm.engine moved to relayllm.serving.replica; the old path goes in relayllm 0.3",
    AdapterContractWarning,
    stacklevel=2,
)
