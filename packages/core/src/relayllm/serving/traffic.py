"""Traffic classes: rows from processors are batch work, HTTP requests are interactive.

A request's ``priority`` follows vLLM's convention (lower runs first), so it reaches an engine
that schedules by priority unchanged. Defaults: interactive ahead of batch; a processor sets
its own (``ProcessorConfig.priority``), a row its own (``sampling_params.priority``), an HTTP
request its own (the body's ``priority``, as vLLM's server takes it).
"""

from __future__ import annotations

from typing import Literal

TrafficClass = Literal["interactive", "batch"]
TRAFFIC_CLASSES: tuple[TrafficClass, ...] = ("interactive", "batch")
#: What HTTP requests get unless they say otherwise.
INTERACTIVE_PRIORITY = 0
#: What processor rows get unless the processor or the row says otherwise.
BATCH_PRIORITY = 10

__all__ = ["BATCH_PRIORITY", "INTERACTIVE_PRIORITY", "TRAFFIC_CLASSES", "TrafficClass"]
