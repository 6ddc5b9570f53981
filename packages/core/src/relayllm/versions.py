"""The releases this relayllm supports, and an up-front check of what is installed.

Core supports one Ray series (:data:`RAY_VERSIONS`, its pin: :mod:`relayllm.compat` uses
private APIs of it); each backend names the engine releases it supports in
``Backend.supported_versions``. :func:`unsupported` compares them with the installed
distributions from package metadata alone (nothing is imported), so the CLI runs it on import
and ``relayllm backends``/``status`` show it -- before any engine starts.
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from relayllm.backend import Backend

#: The Ray releases this relayllm supports (``ray[data,serve]`` in core's pyproject.toml).
RAY_VERSIONS = "2.60.*"
#: What to install when Ray differs.
RAY_INSTALL = "pip install 'ray[data,serve]==2.60.*'"


def matches(version: str, pattern: str) -> bool:
    """``"2.60.1"`` matches ``"2.60.*"``; a local suffix (``0.32.0+cpu``) is ignored; ``|``
    separates alternatives (a window of releases: ``"0.32.0|0.33.0"``)."""
    base = version.split("+", 1)[0]
    for alternative in pattern.split("|"):
        regex = re.escape(alternative.strip()).replace(r"\*", r"[\w.]*")
        if re.fullmatch(regex, base) is not None:
            return True
    return False


def describe(pattern: str) -> str:
    """A pattern as a message says it: ``"0.32.0|0.33.0"`` is ``"0.32.0 or 0.33.0"``."""
    alternatives = [a.strip() for a in pattern.split("|")]
    if len(alternatives) == 1:
        return alternatives[0]
    return ", ".join(alternatives[:-1]) + " or " + alternatives[-1]


def installed(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def supported(backends: Iterable[type[Backend]] = ()) -> dict[str, str]:
    """Distribution -> supported version pattern: Ray's, then each backend's engines'."""
    table = {"ray": RAY_VERSIONS}
    for backend in backends:
        table.update(backend.supported_versions)
    return table


def unsupported(backends: Iterable[type[Backend]] = ()) -> list[str]:
    """One message per installed distribution outside what this release supports, saying what
    to install; empty when everything fits. Absent engines are the backend's ``requires``
    check's business."""
    problems = []
    found = installed("ray")
    if found is not None and not matches(found, RAY_VERSIONS):
        problems.append(
            f"relayllm supports ray {RAY_VERSIONS}, found {found}: {RAY_INSTALL} installs it"
        )
    for backend in backends:
        for dist, pattern in backend.supported_versions.items():
            found = installed(dist)
            if found is not None and not matches(found, pattern):
                hint = f": {backend.install_hint} installs it" if backend.install_hint else ""
                problems.append(
                    f"backend {backend.name!r} supports {dist} {describe(pattern)}, "
                    f"found {found}{hint}"
                )
    return problems


__all__ = [
    "RAY_INSTALL",
    "RAY_VERSIONS",
    "describe",
    "installed",
    "matches",
    "supported",
    "unsupported",
]
