"""docs/architecture.md names every module of core: a new module without a row fails here."""

from __future__ import annotations

from pathlib import Path

from support import REPO

import relayllm

SOURCE = Path(relayllm.__file__).parent
DOC = REPO / "docs" / "architecture.md"


def test_every_core_module_has_a_row_in_the_architecture_page():
    text = DOC.read_text(encoding="utf-8")
    missing = [
        str(path.relative_to(SOURCE))
        for path in sorted(SOURCE.rglob("*.py"))
        if f"`{path.relative_to(SOURCE)}`" not in text
    ]
    assert not missing, f"modules with no row in {DOC.name}: {missing}"
