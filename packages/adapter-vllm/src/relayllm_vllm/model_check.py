"""Is the ``model`` (and ``tokenizer``) there? Checked in the driver before any engine starts.

Without this check a path that does not exist fails half a minute later inside the replica
with a traceback about repository ids, and a hub id with no network behind it is retried by
the engine for minutes. A local path must exist; a hub id must be in the local Hugging Face
cache, or the hub must be reachable (and not switched off with ``HF_HUB_OFFLINE``).

Checked where the command runs: on a multi-node cluster whose nodes hold the model where the
driver does not, set ``RELAYLLM_SKIP_MODEL_CHECK=1``.
"""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

from relayllm.adapters import ConfigError, env
from relayllm_vllm.demo import DEMO_MODEL

_SKIP_HINT = (
    "(if it is there on the cluster's nodes but not where this command runs, set "
    f"{env.SKIP_MODEL_CHECK.name}=1)"
)


def check_model(field: str, model: str | None) -> None:
    """Raise a ConfigError naming ``options.<field>`` when ``model`` cannot be loaded."""
    try:
        _check(field, model)
    except ConfigError as exc:
        exc.option = field  # a pipeline file's error then points at the option's line
        raise


def _check(field: str, model: str | None) -> None:
    if not model or model == DEMO_MODEL or env.SKIP_MODEL_CHECK.get():
        return
    if os.path.exists(os.path.expanduser(model)):
        return
    if _looks_like_path(model):
        raise ConfigError(
            f"invalid options for backend 'vllm': {field}: the path {model!r} does "
            f"not exist {_SKIP_HINT}"
        )
    if _in_hf_cache(model):
        return
    if _offline():
        raise ConfigError(
            f"invalid options for backend 'vllm': {field}: {model!r} is not in the local Hugging "
            f"Face cache and HF_HUB_OFFLINE is set, so it cannot be downloaded. Download it "
            f"where there is a network (`hf download {model}`), or give a local path "
            f"{_SKIP_HINT}"
        )
    endpoint = _hub_endpoint()
    if not _reachable(endpoint):
        raise ConfigError(
            f"invalid options for backend 'vllm': {field}: {model!r} is not in the local Hugging "
            f"Face cache and the hub ({endpoint}) cannot be reached from here. Check the network "
            f"(or HF_ENDPOINT), download the model first, or give a local path {_SKIP_HINT}"
        )


def _looks_like_path(model: str) -> bool:
    """A hub id is ``name`` or ``org/name``; anything else is meant as a path."""
    return (
        model.startswith(("/", ".", "~"))
        or model.count("/") > 1
        or model.endswith("/")
        or os.sep != "/"
        and os.sep in model
    )


def _offline() -> bool:
    return any(
        os.environ.get(name, "").lower() in ("1", "true", "yes", "on")
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def _in_hf_cache(model: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # no hub library: nothing to look in; let the engine decide
        return True
    found = try_to_load_from_cache(model, "config.json")
    return isinstance(found, str)


def _hub_endpoint() -> str:
    try:
        from huggingface_hub import constants

        return constants.ENDPOINT
    except ImportError:
        return os.environ.get("HF_ENDPOINT", "")


def _reachable(endpoint: str, timeout_s: float = 3.0) -> bool:
    """A TCP connection to the hub within a few seconds (no request is sent)."""
    url = urlparse(endpoint)
    if not url.hostname:
        return True
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout_s):
            return True
    except OSError:
        return False
