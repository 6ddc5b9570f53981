"""A name imports from the module that owns it: no module but a package's ``__init__`` and the
namespaces that are facades on purpose lists in its ``__all__`` a name it imported from another
relayllm module (an old path kept alive after a move)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGES = Path(__file__).resolve().parents[3] / "packages"
#: Namespaces whose point is to gather names: the adapter SDK's commands, the kit's source
#: helpers, and the deprecated path of the commands (until adapter contract 4).
FACADES = {"relayllm.adapters.commands", "relayllm.testing.source", "relayllm.cli.kit"}


def _module(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGES).parts[2:]).removesuffix(".py")


def re_exports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("relayllm")
        for alias in node.names
    }
    listed = [
        element.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(getattr(t, "id", "") == "__all__" for t in node.targets)
        for element in getattr(node.value, "elts", [])
        if isinstance(element, ast.Constant)
    ]
    return [name for name in listed if name in imported]


def test_no_module_re_exports_a_name_it_does_not_own():
    modules = [p for p in PACKAGES.glob("*/src/**/*.py") if p.name != "__init__.py"]
    assert len(modules) > 100
    found = {
        _module(path): names
        for path in modules
        if _module(path) not in FACADES and (names := re_exports(path))
    }
    assert not found, f"import these from the module that owns them: {found}"


def test_the_check_sees_a_re_export(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('from relayllm.configbase import ConfigModel\n__all__ = ["ConfigModel"]\n')
    assert re_exports(module) == ["ConfigModel"]
