"""The benchmark scripts that start their own processes and clusters, run as a user runs them
at toy size on the echo backend, their results file read back: ``relayllm batch`` against the
processor path and the Batch API service against ``relayllm batch``. Each script checks its own
output as it runs (every ``custom_id`` once, each a success); here the results it writes must
hold what docs/benchmarks.md reads from them. No warm-up runs (``--warmup-lines 0``): no
figure is read at this size, and each warm-up is two more driver processes.
Results go to a temporary folder (``BENCHMARK_RESULTS_DIR``), never to the committed ones."""

import json
import os
import subprocess
import sys

from support import REPO


def run(tmp_path, script: str, *args: str) -> dict:
    """The script run as a user runs it; the results file it wrote, read back."""
    env = {**os.environ, "BENCHMARK_RESULTS_DIR": str(tmp_path), "RELAYLLM_ECHO_BACKEND": "1"}
    env.pop("RAY_ADDRESS", None)  # each script starts its own cluster
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / f"{script}.py"), *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / f"{script}.json").read_text())
    assert results["command"] == " ".join(["python", f"benchmarks/{script}.py", *args])
    return results


def test_batch_file_at_toy_size(tmp_path):
    results = run(tmp_path, "batch_file", "--sizes", "100", "--warmup-lines", "0")
    [size] = results["sizes"]
    assert size["rows"] == 100
    summary = size["summary"]
    for name in ("relayllm batch", "processor path"):
        assert summary[name]["runs"] == 1 and summary[name]["rows_per_s"] > 0, summary
        assert summary[name]["driver_peak_rss_mib"] > 0, summary
    ratio = summary["relayllm batch"]["rows_per_s"] / summary["processor path"]["rows_per_s"]
    assert summary["ratio relayllm batch / processor path"] == ratio


def test_batch_service_at_toy_size(tmp_path):
    args = ("--sizes", "100", "--repeats", "1", "--warmup-lines", "0")
    results = run(tmp_path, "batch_service", *args)
    [size] = results["sizes"]
    assert size["rows"] == 100
    service = size["samples"]["service"][0]
    assert set(service["phases_s"]) == {"upload_s", "batch_s", "download_s"}, service
    # The page's memory table reads these roles; a process renamed would drop its column.
    assert {"gateway replica", "batch runner", "echo replica"} <= set(service["peak_rss_mib"])
    assert size["summary"]["ratios by round"] == [
        service["lines_per_s"] / size["samples"]["relayllm batch"][0]["lines_per_s"]
    ]
