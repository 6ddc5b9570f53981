"""An engine release's source for an adapter's API contract test: the pinned wheel, read as is.

CI has no GPU and often not the engine an adapter drives, yet the adapter reaches into that
engine's internals, which move between releases. The contract test fetches the pinned release's
wheel once (``pip download --no-deps``: never installed, never imported) and looks up every name
the adapter uses in its source::

    from relayllm.testing.source import SourceTree, pinned_wheel

    source = SourceTree(pinned_wheel("vllm", "0.32.0"))
    assert "generate" in source.members("vllm.v1.engine.async_llm", "AsyncLLM")

The reader itself is :mod:`relayllm.adapters.source` (an adapter's deploy-time checks read the
installed release with it too); this module adds where the test wheels are kept.
"""

from __future__ import annotations

import os
from pathlib import Path

from relayllm import env
from relayllm.adapters.source import (
    Signature,
    SourceLayoutError,
    SourceTree,
    WheelFetchError,
    fetch_wheel,
    function_signature,
)


def wheel_cache() -> Path:
    """Where fetched wheels are kept across runs, so CI downloads each release once."""
    base = env.TEST_CACHE.get() or os.environ.get("XDG_CACHE_HOME")
    return Path(base or Path.home() / ".cache") / "relayllm" / "wheels"


def pinned_wheel(distribution: str, version: str, *, timeout: float = 1800) -> Path:
    """The wheel of ``distribution==version`` from :func:`wheel_cache`, fetched on first use."""
    return fetch_wheel(distribution, version, wheel_cache(), timeout=timeout)


__all__ = [
    "Signature",
    "SourceLayoutError",
    "SourceTree",
    "WheelFetchError",
    "function_signature",
    "pinned_wheel",
    "wheel_cache",
]
