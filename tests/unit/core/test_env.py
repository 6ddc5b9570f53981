"""The environment registry (relayllm.env) lists exactly the RELAYLLM_* variables the packages
read: a variable added to the code without a line there, or left there after the code stopped
reading it, fails here."""

from __future__ import annotations

import re
from pathlib import Path

from relayllm import env

PACKAGES = Path(__file__).resolve().parents[3] / "packages"
#: A quoted RELAYLLM_* name in the source: a variable the code reads (``os.environ.get(...)``,
#: a constant or a list it reads through) -- unless the file defines a Python name of that
#: spelling (a name listed in ``__all__``).
QUOTED = re.compile(r"[\"'](RELAYLLM_[A-Z0-9_]+)[\"']")


def _read_in_code() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGES.glob("*/src/**/*.py")):
        if path.name == "env.py" and path.parent.name == "relayllm":
            continue
        text = path.read_text(encoding="utf-8")
        for name in QUOTED.findall(text):
            if re.search(rf"^{name}\b\s*[:=]", text, re.M):  # a Python name, not a variable
                continue
            found.setdefault(name, set()).add(str(path.relative_to(PACKAGES)))
    return found


def test_every_variable_the_code_reads_is_in_the_registry_and_no_other():
    read = _read_in_code()
    assert read, "the scan found no variable at all: the pattern is wrong"
    unlisted = {name: sorted(where) for name, where in read.items() if name not in env.BY_NAME}
    assert not unlisted, f"read but not in relayllm.env.VARIABLES: {unlisted}"
    stale = sorted(set(env.BY_NAME) - set(read))
    assert not stale, f"in relayllm.env.VARIABLES but read nowhere: {stale}"


def test_each_entry_says_its_default_and_meaning_once():
    names = [v.name for v in env.VARIABLES]
    assert len(names) == len(set(names))
    for variable in env.VARIABLES:
        assert variable.default and variable.meaning.endswith("."), variable
        assert variable.package in (
            "core",
            "relayllm-vllm",
            "relayllm-sglang",
            "relayllm-openai",
            "relayllm-service",
        )


def test_an_adapters_variable_is_read_in_that_adapters_package():
    read = _read_in_code()
    for variable in env.VARIABLES:
        folders = {where.split("/")[0] for where in read[variable.name]}
        expected = "core" if variable.package == "core" else variable.package.split("-", 1)[1]
        assert any(f == expected or f == f"adapter-{expected}" for f in folders), (
            variable.name,
            folders,
        )
