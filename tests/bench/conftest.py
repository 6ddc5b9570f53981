"""The benchmarks folder is not a package: its scripts, and the ``reporting`` package beside
them, import one another by name, so the tests here put that folder on the path as a script
run from it would."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
