"""docs/reliability.md shows what its committed source, docs/results/reliability.json, says:
the page's table is generated from that file (``python docs/reliability.py``), and a change
to either without the other is caught here rather than by a reader. No cluster is needed."""

import importlib.util

from support import REPO

ROOT = REPO


def _generator():
    spec = importlib.util.spec_from_file_location(
        "reliability_page", ROOT / "docs" / "reliability.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_page_is_what_its_results_file_makes():
    generator = _generator()
    assert generator.PAGE.read_text() == generator.page(), (
        "docs/reliability.md differs from docs/results/reliability.json: "
        "run python docs/reliability.py"
    )


def test_a_fault_without_a_recorded_figure_says_so(tmp_path):
    generator = _generator()
    empty = tmp_path / "none.json"
    assert "not recorded yet" in generator.page(results_path=empty)
