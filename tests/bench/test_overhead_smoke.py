"""Smoke version of benchmarks/overhead.py for CI: small N, one run each. It asserts only that
the benchmark completes and that relayllm's stage moves rows faster than ray.data.llm's Serve
stage on the same echo deployment (the real figures come from the full benchmark)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import overhead

ROWS = 2000


def test_relayllm_stage_is_faster_than_ray_data_llm_on_the_same_deployment(echo):
    ds = overhead.dataset(ROWS, blocks=4)
    ours = overhead.measure(overhead.run_relayllm, ds, ROWS)
    theirs = overhead.measure(overhead.run_ray_data_llm, ds, ROWS)
    print(
        f"\noverhead smoke, {ROWS} rows: relayllm {ours['rows_per_s']:,.0f} rows/s, "
        f"ray.data.llm {theirs['rows_per_s']:,.0f} rows/s"
    )
    assert ours["rows_per_s"] > theirs["rows_per_s"]
