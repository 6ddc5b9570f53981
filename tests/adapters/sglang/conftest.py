"""Shared pieces of the SGLang adapter tests: the pinned sglang source and the `gpu` marker.

CPU (``tox -e sglang``): options, translation and the API contract against the real wheel's
source; tests that need the engine skip with a reason (see :mod:`relayllm_sglang.testing`).
GPU (``tox -e sglang-gpu``, which sets RELAYLLM_REQUIRE_GPU=1): the engine tests run, and a
missing GPU fails instead of skipping.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from relayllm_sglang import SGLANG_VERSION
from relayllm_sglang.source import SourceTree


def pytest_collection_modifyitems(config, items):
    # Tests that need a running engine carry the `gpu` marker, so `pytest -m gpu` selects
    # exactly them; the engine-free kit tests stay in the CPU run.
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents and "deployment" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.gpu)


# -- the pinned release's source -------------------------------------------------------------


def pinned_version() -> str:
    """The sglang version the ``engine`` extra pins, from the installed package metadata."""
    for requirement in importlib.metadata.requires("relayllm-sglang") or []:
        match = re.match(r"^sglang\s*==\s*([\w.]+)\s*;.*extra\s*==\s*['\"]engine['\"]", requirement)
        if match:
            return match.group(1)
    raise AssertionError("relayllm-sglang declares no pinned sglang in its 'engine' extra")


def _cache_dir() -> Path:
    base = (
        os.environ.get("RELAYLLM_TEST_CACHE")
        or os.environ.get("XDG_CACHE_HOME")
        or Path.home() / ".cache"
    )
    return Path(base) / "relayllm" / "wheels"


def download_wheel(version: str) -> Path:
    """``pip download --no-deps sglang==version`` (a ~40 MB wheel), kept in a cache dir."""
    cache = _cache_dir()
    cached = sorted(cache.glob(f"sglang-{version}-*.whl"))
    if cached:
        return cached[0]
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--disable-pip-version-check",
                "-q",
                "-d",
                tmp,
                f"sglang=={version}",
            ],
            check=True,
            timeout=900,
        )
        (wheel,) = Path(tmp).glob("sglang-*.whl")
        final = cache / wheel.name
        shutil.move(str(wheel), final)  # whole files only: a cut download never lands here
    return final


@pytest.fixture(scope="session")
def sglang_version() -> str:
    version = pinned_version()
    assert version == SGLANG_VERSION, (
        f"the 'engine' extra pins sglang=={version} but relayllm_sglang.SGLANG_VERSION is "
        f"{SGLANG_VERSION}"
    )
    return version


@pytest.fixture(scope="session")
def sglang_wheel(sglang_version) -> Path:
    return download_wheel(sglang_version)


@pytest.fixture(scope="session")
def sglang_source(sglang_version, sglang_wheel) -> SourceTree:
    """The source of the pinned sglang release, read from its wheel (never imported)."""
    return SourceTree.wheel(sglang_wheel)
