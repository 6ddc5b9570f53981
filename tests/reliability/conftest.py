import pytest


@pytest.fixture(scope="session", autouse=True)
def _ray(ray_session):
    yield ray_session
