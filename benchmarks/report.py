"""Regenerate docs/benchmarks.md and its charts (docs/img/) from benchmarks/results/*.json.

    pip install -e 'packages/core[bench]'     # matplotlib
    python benchmarks/report.py               # the page and its charts
    python benchmarks/report.py --check       # exit 1 if the committed page is stale

The work is in the ``reporting`` package beside this script: one module per question, its
prose in ``reporting/templates``. Nothing here runs a benchmark.
"""

import sys

from reporting.page import main  # the script's folder is on sys.path

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
