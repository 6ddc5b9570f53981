"""Where a test lives, as a maintainer looks for it: the unit tier mirrors the package's modules
(``tests/unit/core/test_<module>.py``); the tiers that need a cluster or an engine name their
files after what they run (``test_<topic>_on_ray.py`` on a local cluster with echo,
``test_<topic>_vllm.py`` on an adapter's engine, ``..._across_nodes.py`` on several nodes). No
file name is used twice under ``tests/``: a name found in a failure says which file it is."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]


def test_no_test_file_name_is_used_twice():
    files = [p for p in TESTS.rglob("test_*.py") if ".tox" not in p.parts]
    counts = Counter(p.name for p in files)
    repeated = {
        name: sorted(str(p.parent.relative_to(TESTS)) for p in files if p.name == name)
        for name, count in counts.items()
        if count > 1
    }
    assert repeated == {}, f"test file names used in several folders: {repeated}"
