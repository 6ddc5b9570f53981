"""The conformance kit's own test: it fails each deliberately broken adapter on the check
written for its defect (one adapter per sampling parameter the row protocol promises, each
ignoring just that one), passes the correct one, and holds kit subclasses to their
declarations (how the engine refuses a row, how its engine is stopped).

The kit runs as an adapter author runs it -- pytest on a test module of kit subclasses -- in
a subprocess (one Ray cluster for every adapter there), and this test reads the outcome of
each test from the JUnit report. The broken adapters are in ``broken_adapters/backends.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))  # broken_adapters: imported here and (PYTHONPATH) by the kit run

from broken_adapters.backends import BROKEN  # noqa: E402

from relayllm.testing.kit import STANDARD_TESTS  # noqa: E402

# The whole kit runs once, in a subprocess, inside the first test: longer than one test's
# default limit.
pytestmark = pytest.mark.timeout(1500)

CONFTEST = """
import pytest


@pytest.fixture(scope="session", autouse=True)
def _registered():
    from relayllm.plugin import manager
    from broken_adapters import backends

    manager.MANAGER.register(backends, "broken_adapters.backends")
    yield
"""

CLASS = """

class Test_{ident}(BackendConformanceTests):
    backend = {name!r}
    context_length = 50
    engine_down_within_s = 5.0  # the echo-style engine reports a stop at once

    def stop_engine(self, ref):
        ref.handle().stop_engine.remote().result(timeout_s=60)
"""

#: Kit subclasses of the correct adapter that declare (or fail to declare) what the kit cannot
#: find out itself, appended to the adapters' module.
DECLARATIONS = """

class Test_engine_down_undeclared(BackendConformanceTests):
    backend = "correct"
    context_length = 50


class Test_engine_down_declared(BackendConformanceTests):
    backend = "correct"
    context_length = 50
    engine_down_untestable = "the kit's own test of the declaration"


class Test_refusal_undeclared(BackendConformanceTests):
    backend = "correct"
    engine_down_untestable = "the kit's own test of the declaration"


class Test_refuses_no_rows(BackendConformanceTests):
    backend = "correct"
    refuses_no_rows = "the kit's own test of the declaration"
    engine_down_untestable = "the kit's own test of the declaration"
"""
#: test id -> (outcome, a fragment of the failure message: what to add)
DECLARED = {
    "Test_engine_down_undeclared::test_health_reports_engine_down": (
        "failure",
        "or declare engine_down_untestable = ",
    ),
    "Test_engine_down_declared::test_health_reports_engine_down": ("skipped", None),
    "Test_refusal_undeclared::test_engine_refusal_fails_only_that_row": (
        "failure",
        "set refuses_no_rows = ",
    ),
    "Test_refuses_no_rows::test_engine_refusal_fails_only_that_row": ("skipped", None),
}

GUARD_CASES = """
import pytest

from relayllm.testing import BackendConformanceTests


class TestOverriddenWithoutXfail(BackendConformanceTests):
    backend = "correct"

    def test_max_tokens_honoured(self, deployment):
        pass


class TestXfailNotStrict(BackendConformanceTests):
    backend = "correct"

    @pytest.mark.xfail(reason="not strict")
    def test_max_tokens_honoured(self, deployment):
        pass


class TestDeleted(BackendConformanceTests):
    backend = "correct"
    test_max_tokens_honoured = None
"""

CLASS_SKIP = """
import pytest

from relayllm.testing import BackendConformanceTests


@pytest.mark.skip(reason="not today")
class TestSkippedWholesale(BackendConformanceTests):
    backend = "correct"
"""


GUARD = ("TestOverriddenWithoutXfail", "TestXfailNotStrict", "TestDeleted")


def _ident(name: str) -> str:
    return name.replace("-", "_")


@pytest.fixture(scope="module")
def kit_run(tmp_path_factory):
    """Run the kit once: every test for the correct adapter, the target check (plus the
    guard) for each broken one, the declaration cases and the guard cases: the outcome of
    each test by id, the run, and each failure's message by test id."""
    root = tmp_path_factory.mktemp("kit-run")
    (root / "conftest.py").write_text(CONFTEST)
    module = (
        "from relayllm.testing import BackendConformanceTests\n"
        + "".join(CLASS.format(ident=_ident(name), name=name) for name in BROKEN)
        + DECLARATIONS
    )
    (root / "test_adapters.py").write_text(module)
    (root / "test_guard_cases.py").write_text(GUARD_CASES)
    (root / "test_class_skip.py").write_text(CLASS_SKIP)
    selected = ["test_adapters.py::Test_correct"]
    selected += [f"test_guard_cases.py::{case}::test_no_silent_overrides" for case in GUARD]
    selected += [f"test_adapters.py::{test}" for test in DECLARED]
    for name, (_, target) in BROKEN.items():
        if target:
            selected.append(f"test_adapters.py::Test_{_ident(name)}::{target}")
            selected.append(f"test_adapters.py::Test_{_ident(name)}::test_no_silent_overrides")
    report = root / "report.xml"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *selected,
            "test_class_skip.py",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "--continue-on-collection-errors",
            "-q",
            "-rfExX",
            "--rootdir",
            str(root),
            f"--junitxml={report}",
            "-W",
            "error::pytest.PytestRemovedIn10Warning",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        found = [child for child in case if child.tag in ("failure", "error", "skipped")]
        key = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
        outcomes[key] = found[0].tag if found else "passed"
        if found:
            messages[key] = found[0].get("message", "") or ""
        if found and found[0].tag == "skipped":
            kind = found[0].get("type", "") or ""
            outcomes[key] = "xfailed" if "xfail" in kind else "skipped"
    return outcomes, done, messages


def test_correct_adapter_passes_every_check(kit_run):
    outcomes, done, _ = kit_run
    mine = {k: v for k, v in outcomes.items() if k.startswith("Test_correct::")}
    ran = {k.split("::")[1] for k in mine}
    assert ran == {*STANDARD_TESTS, "test_no_silent_overrides"}, (ran, done.stdout[-3000:])
    assert all(v == "passed" for v in mine.values()), (mine, done.stdout[-3000:])


@pytest.mark.parametrize("name", [n for n, (_, target) in BROKEN.items() if target])
def test_broken_adapter_fails_its_check(kit_run, name):
    outcomes, done, _ = kit_run
    target = BROKEN[name][1]
    ident = _ident(name)
    assert outcomes.get(f"Test_{ident}::{target}") == "failure", (
        f"the kit did not fail the {name!r} adapter on {target}: "
        f"{outcomes.get(f'Test_{ident}::{target}')}\n{done.stdout[-3000:]}"
    )
    # The failure is the defect's, not a broken override: the guard passes.
    assert outcomes.get(f"Test_{ident}::test_no_silent_overrides") == "passed"


@pytest.mark.parametrize("test", list(DECLARED))
def test_kit_holds_subclasses_to_their_declarations(kit_run, test):
    outcomes, done, messages = kit_run
    outcome, fragment = DECLARED[test]
    assert outcomes.get(test) == outcome, (outcomes.get(test), done.stdout[-3000:])
    if fragment:
        assert fragment in messages.get(test, ""), messages.get(test)


@pytest.mark.parametrize("case", GUARD)
def test_guard_fails_silent_overrides(kit_run, case):
    outcomes, done, _ = kit_run
    assert outcomes.get(f"{case}::test_no_silent_overrides") == "failure", (
        outcomes,
        done.stdout[-3000:],
    )


def test_class_level_skip_fails_the_run(kit_run):
    outcomes, done, _ = kit_run
    assert done.returncode != 0
    assert "class-level pytest.mark.skip would skip every conformance check" in done.stdout, (
        done.stdout[-3000:]
    )
    assert not any(
        k.startswith("TestSkippedWholesale::") and v == "skipped" for k, v in outcomes.items()
    )
