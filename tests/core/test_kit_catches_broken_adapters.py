"""The conformance kit's own test: it fails each deliberately broken adapter on the check
written for its defect, for that defect (the failure's message is checked): one adapter per
sampling parameter and optional feature the row protocol promises, each ignoring just that
one, and noisy ones whose greedy answers differ between identical calls, which must not pass
on noise. It passes the correct one (every check run, none skipped), and holds kit subclasses
to their declarations (how the engine refuses a row, how its engine is stopped, why it never
samples, which template kwargs it reads).

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
pytestmark = pytest.mark.timeout(1800)

CONFTEST = """
import pytest


@pytest.fixture(scope="session", autouse=True)
def _registered():
    from relayllm.plugin import manager
    from broken_adapters import backends

    manager.MANAGER.register(backends, "broken_adapters.backends")
    yield


@pytest.fixture(scope="session", autouse=True)
def _one_cluster():
    # One cluster for every adapter of the run, started before the first kit class asks for
    # one (its fixture finds it), by the suite's Ray start helper.
    from support import ray_cluster

    with ray_cluster():
        yield
"""

CLASS = """

class Test_{ident}(BackendConformanceTests):
    backend = {name!r}
    context_length = 50
    engine_down_within_s = 5.0  # the echo-style engine reports a stop at once
    chat_template_kwargs_probe = {{"shout": True}}  # the "template" writes every kwarg

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


class Test_greedy_only_declared(BackendConformanceTests):
    backend = "always-greedy"
    greedy_only = "the kit's own test of the declaration"


class Test_greedy_only_but_samples(BackendConformanceTests):
    backend = "correct"
    greedy_only = "the kit's own test of the declaration"


class Test_template_probe_undeclared(BackendConformanceTests):
    backend = "correct"


class Test_template_untestable(BackendConformanceTests):
    backend = "correct"
    chat_template_kwargs_untestable = "the kit's own test of the declaration"
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
    "Test_greedy_only_declared::test_temperature_one_varies_without_seed": ("skipped", None),
    "Test_greedy_only_but_samples::test_temperature_one_varies_without_seed": (
        "failure",
        "greedy_only is declared, but temperature 0 and temperature 1 got different answers",
    ),
    "Test_template_probe_undeclared::test_chat_template_kwargs": (
        "failure",
        "declare chat_template_kwargs_probe = {...}",
    ),
    "Test_template_untestable::test_chat_template_kwargs": ("skipped", None),
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
#: Standard tests no broken adapter here targets: what they check an echo-style adapter cannot
#: get wrong alone (core's bookkeeping, or a distribution installed in the environment).
NO_BROKEN_ADAPTER = {
    "test_backend_discovered_through_entry_point",
    "test_import_stays_light",
    "test_tasks_for_options",
    "test_unsupported_sampling_param_policy",
    "test_health_and_info",
    "test_chat",
    "test_completion",
    "test_two_sequential_processors_share_one_deployment",
    "test_undeploy",
}


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
    for name, broken in BROKEN.items():
        if broken.check:
            selected.append(f"test_adapters.py::Test_{_ident(name)}::{broken.check}")
            selected.append(f"test_adapters.py::Test_{_ident(name)}::test_no_silent_overrides")
    report = root / "report.xml"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(HERE), str(HERE.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
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
        timeout=1600,
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
    # Passed, not skipped: it declares every feature, so every check runs.
    outcomes, done, _ = kit_run
    mine = {k: v for k, v in outcomes.items() if k.startswith("Test_correct::")}
    ran = {k.split("::")[1] for k in mine}
    assert ran == {*STANDARD_TESTS, "test_no_silent_overrides"}, (ran, done.stdout[-3000:])
    assert all(v == "passed" for v in mine.values()), (mine, done.stdout[-3000:])


@pytest.mark.parametrize("name", [n for n, broken in BROKEN.items() if broken.check])
def test_broken_adapter_fails_its_check(kit_run, name):
    outcomes, done, messages = kit_run
    _, target, reason = BROKEN[name]
    test = f"Test_{_ident(name)}::{target}"
    assert outcomes.get(test) == "failure", (
        f"the kit did not fail the {name!r} adapter on {target}: "
        f"{outcomes.get(test)}\n{done.stdout[-3000:]}"
    )
    # It failed for its defect (not for another check's reason or a crash)...
    assert reason and reason in messages.get(test, ""), (
        f"{name!r} failed {target}, but not for its defect ({reason!r}): {messages.get(test)}"
    )
    # ...and not for a broken override: the guard passes.
    assert outcomes.get(f"Test_{_ident(name)}::test_no_silent_overrides") == "passed"


def test_every_check_has_a_broken_adapter():
    # In particular one per sampling parameter and optional feature the row protocol promises.
    targets = {broken.check for broken in BROKEN.values()}
    missing = set(STANDARD_TESTS) - NO_BROKEN_ADAPTER - targets
    assert not missing, f"kit checks no broken adapter fails: {sorted(missing)}"


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
