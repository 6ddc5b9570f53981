"""docs/architecture.md names every module of core and of the batch service: a new module
without a row fails here."""

from __future__ import annotations

from pathlib import Path

from support import REPO

import relayllm
import relayllm_service

SOURCE = Path(relayllm.__file__).parent
SERVICE = Path(relayllm_service.__file__).parent
DOC = REPO / "docs" / "architecture.md"


def test_every_core_module_has_a_row_in_the_architecture_page():
    text = DOC.read_text(encoding="utf-8")
    missing = [
        str(path.relative_to(SOURCE))
        for path in sorted(SOURCE.rglob("*.py"))
        if f"`{path.relative_to(SOURCE)}`" not in text
    ]
    assert not missing, f"modules with no row in {DOC.name}: {missing}"


def test_every_service_module_has_a_row_in_the_architecture_page():
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## Modules of the batch service") :]
    section = section[: section.index("\n## ", 1)]
    missing = [
        str(path.relative_to(SERVICE))
        for path in sorted(SERVICE.rglob("*.py"))
        if f"`{path.relative_to(SERVICE)}`" not in section and path.name != "__init__.py"
    ]
    assert not missing, f"service modules with no row in {DOC.name}: {missing}"
