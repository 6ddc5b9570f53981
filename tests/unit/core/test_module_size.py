"""No module of the packages is longer than a reader can hold in their head (400 lines).

The modules still over the limit are listed with the seam they split along. The list may only
shrink: a module on it that is now short enough fails here until its entry goes."""

from __future__ import annotations

from support import REPO

LIMIT = 400

#: Modules over the limit, each with the split that takes it under.
ALLOWED: dict[str, str] = {}


def _lengths() -> dict[str, int]:
    packages = REPO / "packages"
    return {
        str(path.relative_to(packages)): len(path.read_text(encoding="utf-8").splitlines())
        for path in sorted(packages.glob("*/src/**/*.py"))
    }


def test_no_module_is_over_the_limit_unless_listed():
    over = {name: n for name, n in _lengths().items() if n > LIMIT and name not in ALLOWED}
    assert not over, f"modules over {LIMIT} lines: {over}; split them along their seams"


def test_the_list_of_long_modules_only_shrinks():
    lengths = _lengths()
    stale = [name for name in ALLOWED if lengths.get(name, 0) <= LIMIT]
    assert not stale, f"now {LIMIT} lines or fewer (or gone): take them off ALLOWED: {stale}"
