"""What the vLLM test modules share: the one deployment every engine test uses.

Engine starts are what cost time here (a minute and a half each on 2 cores), so
``test_e2e.py`` starts this deployment and ``test_kit.py``'s conformance class finds it
running under the same name and config (``relayllm.deploy`` reuses it) and shuts it down in
its last test. Run alone, each module starts it itself.
"""

from __future__ import annotations

import socket
from typing import Any


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


#: The demo model, with a short context so a "too long" prompt is cheap to build.
OPTIONS: dict[str, Any] = {"model": "demo", "max_model_len": 512}
#: The conformance kit names its deployment "kit-<backend>"; the e2e tests use the same name.
DEPLOYMENT_NAME = "kit-vllm"
#: Serve's HTTP proxy for the run (conftest starts Serve with it): the shared deployment also
#: serves the OpenAI-compatible HTTP front, tested in test_e2e.py on the same engine.
HTTP_PORT = _free_port()
DEPLOYMENT_FIELDS: dict[str, Any] = {
    "startup_timeout_s": 1200,
    "http": {"route_prefix": "/kit-vllm", "port": HTTP_PORT},
}


def shared_config():
    import relayllm

    return relayllm.DeploymentConfig(
        name=DEPLOYMENT_NAME, backend="vllm", options=OPTIONS, **DEPLOYMENT_FIELDS
    )
