"""The generated reference pages (docs/reference/) match the models and commands they come from:
a field, a description or an option changed without regenerating fails here."""

from __future__ import annotations

import subprocess
import sys

from support import REPO

ROOT = REPO
GENERATOR = ROOT / "docs" / "gen_reference.py"


def generate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(GENERATOR), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_committed_reference_pages_are_up_to_date():
    done = generate("--check")
    assert done.returncode == 0, (
        f"{done.stderr[-4000:]}\nthe reference pages are stale: run python docs/gen_reference.py"
    )


def test_check_fails_on_a_stale_page(tmp_path):
    assert generate("--out", str(tmp_path)).returncode == 0
    page = tmp_path / "configuration.md"
    assert "| `batch_size` |" in page.read_text(encoding="utf-8")
    page.write_text(page.read_text(encoding="utf-8").replace("`batch_size`", "`batch`"))
    done = generate("--check", "--out", str(tmp_path))
    assert done.returncode == 1
    assert "configuration.md" in done.stderr and "cli.md" not in done.stderr
