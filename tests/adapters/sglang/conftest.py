"""Shared pieces of the SGLang adapter tests: the pinned sglang source and the `gpu` marker.

CPU (``tox -e sglang``): options, translation and the API contract against the real wheel's
source; tests that need the engine skip with a reason (see sglang_support.py).
GPU (``tox -e sglang-gpu``, which sets RELAYLLM_REQUIRE_GPU=1): the engine tests run, and a
missing GPU fails instead of skipping.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

from relayllm.testing.kit import ENGINE_CHECKS, BackendConformanceTests
from relayllm.testing.source import SourceTree, pinned_wheel
from relayllm_sglang import SGLANG_VERSION

sys.path.insert(0, str(Path(__file__).parent))  # sglang_support


def pytest_collection_modifyitems(config, items):
    # Tests that need a running engine carry the `gpu` marker, so `pytest -m gpu` selects
    # exactly them: every engine check of the kit (some check a subclass's declarations
    # before they ask for the deployment, so its fixture does not tell) and every other test
    # that asks for a deployment. The engine-free kit tests stay in the CPU run.
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents and _needs_engine(item):
            item.add_marker(pytest.mark.gpu)


def _needs_engine(item: pytest.Item) -> bool:
    cls = getattr(item, "cls", None)
    if cls is not None and issubclass(cls, BackendConformanceTests):
        return getattr(item, "originalname", item.name) in ENGINE_CHECKS
    return "deployment" in getattr(item, "fixturenames", ())


# -- the pinned release's source -------------------------------------------------------------


def pinned_version() -> str:
    """The sglang version the ``engine`` extra pins, from the installed package metadata."""
    for requirement in importlib.metadata.requires("relayllm-sglang") or []:
        match = re.match(r"^sglang\s*==\s*([\w.]+)\s*;.*extra\s*==\s*['\"]engine['\"]", requirement)
        if match:
            return match.group(1)
    raise AssertionError("relayllm-sglang declares no pinned sglang in its 'engine' extra")


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
    """The pinned release's wheel (~40 MB), fetched once into the user's cache dir."""
    return pinned_wheel("sglang", sglang_version, timeout=900)


@pytest.fixture(scope="session")
def sglang_source(sglang_version, sglang_wheel) -> SourceTree:
    """The source of the pinned sglang release, read from its wheel (never imported)."""
    return SourceTree(sglang_wheel)
