"""The echo deployment the benchmark smoke tests share (benchmarks/overhead.py's)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import overhead


@pytest.fixture(scope="module")
def echo(ray_session):
    ray_session.data.DataContext.get_current().enable_progress_bars = False
    overhead.deploy_echo()
    yield
    import relayllm

    relayllm.shutdown(overhead.DEPLOYMENT)
