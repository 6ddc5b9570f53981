import pytest


@pytest.fixture(scope="session")
def ray_session():
    """One real local Ray cluster (2 CPUs, like the machine) for a whole test run, with the
    echo backend registered in this process."""
    import ray

    from relayllm.testing import enable_echo_backend

    enable_echo_backend()
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    from ray import serve

    serve.shutdown()
    ray.shutdown()


RESULTS_ENV = "RELAYLLM_RESULTS_FILE"


@pytest.fixture(scope="session")
def record_result(tmp_path_factory):
    """``record_result(key, value)``: a measured figure into a results file.

    By default the file is a temporary one: a test run never changes a tracked file, so an
    unrelated commit cannot carry new figures that docs/reliability.md does not show. To record
    the figures the page is generated from, name the file:
    ``RELAYLLM_RESULTS_FILE=docs/results/reliability.json pytest tests/reliability``, then
    ``python docs/reliability.py``."""
    import json
    import os
    from pathlib import Path

    named = os.environ.get(RESULTS_ENV)
    path = Path(named) if named else tmp_path_factory.mktemp("results") / "reliability.json"

    def record(key: str, value) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = json.loads(path.read_text()) if path.exists() else {}
        data[key] = value
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")

    return record
