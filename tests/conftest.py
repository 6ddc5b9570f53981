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
