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
def record_result():
    """``record_result(key, value)``: a measured figure into the results file that
    docs/reliability.md's figures are generated from (``python docs/reliability.py``)."""
    import json
    import os
    from pathlib import Path

    path = Path(
        os.environ.get(RESULTS_ENV)
        or Path(__file__).parents[1] / "docs" / "results" / "reliability.json"
    )

    def record(key: str, value) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = json.loads(path.read_text()) if path.exists() else {}
        data[key] = value
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")

    return record
