"""Fixtures every suite shares. Ray is started one way only, by ``ray_session``: a test (or a
module, with ``pytestmark = pytest.mark.usefixtures("ray_session")``) that needs a cluster asks
for it, and the tests that need none run without one (tests/unit runs none at all). Suites
with clusters of another shape start them with the same helper, ``support.ray_cluster``."""

import pytest

ECHO_PLUGIN = "relayllm.testing.echo"


@pytest.fixture
def echo_backend():
    """The echo backend registered in this process for one test, then unregistered, so a test
    that lists the installed backends sees the same list whatever ran before it."""
    from relayllm.plugin import manager
    from relayllm.testing import enable_echo_backend

    if manager.MANAGER.manager.get_plugin(ECHO_PLUGIN) is not None:
        yield  # ray_session registered it for the whole run
        return
    enable_echo_backend()
    try:
        yield
    finally:
        manager.MANAGER.unregister(ECHO_PLUGIN)


@pytest.fixture(scope="module")
def echo(request, ray_session):
    """The module's echo deployment (a real Serve deployment), deployed once for the module
    and shut down after it: the ``DeploymentConfig`` fields in the module's ``ECHO`` dict
    (``name`` at least); ``ECHO = support.SHARED_ECHO``, the session's, is left running. Yields its
    ``DeploymentRef``. A deployment of another scope or on another cluster uses the same
    ``support.echo_deployment`` in a fixture of its own."""
    from support import SHARED_ECHO, echo_deployment

    fields = getattr(request.module, "ECHO", None)
    assert fields, f"{request.module.__name__} asks for `echo`: give it an ECHO dict (its name)"
    if fields == SHARED_ECHO:
        import relayllm

        yield relayllm.deploy(relayllm.DeploymentConfig(backend="echo", **fields))
        return
    with echo_deployment(**fields) as ref:
        yield ref


@pytest.fixture(autouse=True)
def _data_context_restored():
    """A test may ask Ray Data for input order (``preserve_order``, a process-wide setting);
    the setting goes back to what it was after the test, so no later test depends on which
    ran before it."""
    import sys

    def current() -> bool | None:
        data = sys.modules.get("ray.data")
        return data.DataContext.get_current().execution_options.preserve_order if data else None

    before = current()
    yield
    data = sys.modules.get("ray.data")
    if data is not None and current() != before:
        default = data.ExecutionOptions().preserve_order
        options = data.DataContext.get_current().execution_options
        options.preserve_order = default if before is None else before


@pytest.fixture(scope="session")
def ray_session():
    """One real local Ray cluster (2 CPUs, like the machine) for a whole test run, with the
    echo backend registered in this process (support.ray_cluster: never a cluster found
    running on the machine)."""
    import ray
    from support import ray_cluster

    from relayllm.testing import enable_echo_backend

    enable_echo_backend()
    with ray_cluster():
        yield ray


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


def pytest_runtest_logreport(report):
    """A failure's message and traceback are printed as soon as the test fails, not only in the
    end-of-run summary: a process that dies later (Ray's core worker ends the process when a
    thread a failed test left running touches Ray after the cluster shut down) still leaves
    the failing test's name and message in the log."""
    if report.failed and report.when in ("setup", "call", "teardown"):
        import sys

        sys.stderr.write(f"\n{'_' * 20} FAILED {report.nodeid} ({report.when}) {'_' * 20}\n")
        sys.stderr.write(f"{report.longreprtext}\n")
        sys.stderr.flush()
