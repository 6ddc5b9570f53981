"""The core's cluster suite. No fixture here starts Ray for every test: a module whose tests need
the cluster asks for ``ray_session`` (tests/conftest.py); the tests that need none are in
tests/unit."""
