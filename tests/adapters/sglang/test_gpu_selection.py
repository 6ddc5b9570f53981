"""`pytest -m gpu` (what `tox -e sglang-gpu` runs) selects every engine check of the kit, and the
CPU run keeps the engine-free ones: collected in a subprocess, as that environment collects."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from relayllm.testing.contract import BackendContractTests, standard_tests
from relayllm.testing.kit import ENGINE_CHECKS

HERE = Path(__file__).parent


def _collected(marker: str) -> set[str]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-m",
            marker,
            str(HERE / "test_conformance.py"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=HERE.parents[2],
    )
    assert done.returncode in (0, 5), done.stdout[-3000:] + done.stderr[-3000:]
    return {
        line.split("::")[-1]
        for line in done.stdout.splitlines()
        if "::TestSGLangConformance::" in line
    }


def test_gpu_marker_selects_every_engine_check():
    selected = _collected("gpu")
    # The declaration-first checks (refusal, engine down) included: they ask for the
    # deployment only after reading the subclass's declarations.
    wanted = set(ENGINE_CHECKS)
    assert selected == wanted, f"missing {wanted - selected}, extra {selected - wanted}"


def test_cpu_run_keeps_the_engine_free_checks():
    selected = _collected("not gpu")
    assert selected == {*standard_tests(BackendContractTests), "test_no_silent_overrides"}
