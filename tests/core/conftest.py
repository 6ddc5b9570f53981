import pytest

from relayllm.testing import enable_echo_backend


@pytest.fixture(scope="session", autouse=True)
def ray_session():
    """One real local Ray cluster (2 CPUs, like the machine) for the whole core test run."""
    import ray

    enable_echo_backend()
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    from ray import serve

    serve.shutdown()
    ray.shutdown()
