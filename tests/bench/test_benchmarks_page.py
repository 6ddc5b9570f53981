"""docs/benchmarks.md is what benchmarks/report.py makes of the committed results: a results
file added or changed without the page regenerated, or a page edited by hand, fails here. The
charts are left out (binary, and drawn only where the report runs); their links are checked."""

from pathlib import Path

from reporting import common, page

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_page_is_what_the_committed_results_make(monkeypatch):
    monkeypatch.setitem(common.CHARTS, "draw", False)
    assert page.PAGE.read_text() == page.build(), (
        "docs/benchmarks.md is stale: run python benchmarks/report.py"
    )


def test_every_chart_the_page_links_is_committed(monkeypatch):
    monkeypatch.setitem(common.CHARTS, "draw", False)
    text = page.build()
    links = [part.split(")", 1)[0] for part in text.split("](img/")[1:]]
    assert links
    missing = [name for name in links if not (ROOT / "docs" / "img" / name).exists()]
    assert not missing


def test_the_check_does_not_write_charts(monkeypatch, tmp_path):
    monkeypatch.setitem(common.CHARTS, "dir", tmp_path)
    assert page.main(["--check"]) == 0
    assert not list(tmp_path.iterdir())
