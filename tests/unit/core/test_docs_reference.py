"""The generated reference pages (docs/reference/) match the models and commands they come from:
a field, a description or an option changed without regenerating fails here."""

from __future__ import annotations

import json
import subprocess
import sys

from support import REPO

ROOT = REPO
GENERATOR = ROOT / "docs" / "gen_reference.py"


def generate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(GENERATOR), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_committed_reference_pages_are_up_to_date():
    done = generate("--check")
    assert done.returncode == 0, (
        f"{done.stderr[-4000:]}\nthe reference pages are stale: run python docs/gen_reference.py"
    )


def test_check_fails_on_a_stale_page(tmp_path):
    assert generate("--out", str(tmp_path)).returncode == 0
    page = tmp_path / "configuration.md"
    assert "| `batch_size` |" in page.read_text(encoding="utf-8")
    page.write_text(page.read_text(encoding="utf-8").replace("`batch_size`", "`batch`"))
    done = generate("--check", "--out", str(tmp_path))
    assert done.returncode == 1
    assert "configuration.md" in done.stderr and "cli.md" not in done.stderr


def test_check_fails_on_an_openapi_description_that_misses_an_operation(tmp_path):
    assert generate("--out", str(tmp_path)).returncode == 0
    spec_file = tmp_path / "openapi.json"
    spec = json.loads(spec_file.read_text(encoding="utf-8"))
    assert {"get", "post"} <= set(spec["paths"]["/v1/batches"])
    del spec["paths"]["/v1/batches"]["get"]
    spec_file.write_text(json.dumps(spec, indent=1), encoding="utf-8")
    done = generate("--check", "--out", str(tmp_path))
    assert done.returncode == 1
    assert "openapi.json" in done.stderr and "configuration.md" not in done.stderr


def test_an_openapi_description_made_with_another_openai_is_stale_only_if_routes_differ(tmp_path):
    """A new openai or pydantic release changes the schemas the description takes from them:
    the check then holds the committed file to the routes, parameters and statuses alone."""
    assert generate("--out", str(tmp_path)).returncode == 0
    spec_file = tmp_path / "openapi.json"
    spec = json.loads(spec_file.read_text(encoding="utf-8"))
    spec["info"]["x-generated-with"]["openai"] = "0.0.1"
    spec["components"]["schemas"]["Batch"]["title"] = "made by another openai"
    spec_file.write_text(json.dumps(spec, indent=1), encoding="utf-8")
    assert generate("--check", "--out", str(tmp_path)).returncode == 0
    limit = spec["paths"]["/v1/batches"]["get"]["parameters"][1]
    assert limit["name"] == "limit"
    limit["schema"]["maximum"] = 1000
    spec_file.write_text(json.dumps(spec, indent=1), encoding="utf-8")
    done = generate("--check", "--out", str(tmp_path))
    assert done.returncode == 1 and "openapi.json" in done.stderr


def test_the_openapi_description_has_an_operation_for_every_route_the_gateway_serves():
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import gen_openapi
    finally:
        sys.path.remove(str(ROOT / "docs"))
    spec = gen_openapi.build()
    described = {(path, method) for path, item in spec["paths"].items() for method in item}
    served = set(gen_openapi.served_routes())
    assert ("/v1/batches/{batch_id}/cancel", "post") in served
    assert ("/v1/organization/usage/completions", "get") in served
    assert described == served
