"""docs/benchmarks.md from the committed results in benchmarks/results/*.json.

One module per question computes its figures from its results files and fills the prose of
``templates/<question>.md``; ``page.py`` puts the questions together. Nothing here runs a
benchmark: the page shows what the result files say, so a page that differs from what this
package makes of them is stale (tests/bench/test_benchmarks_page.py).
"""
