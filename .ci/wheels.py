"""Packaging check (``tox -e package``): build every package's wheel and sdist, install core
and the OpenAI adapter from the built wheels (not the source tree) into this environment, and
run the checks a user's first commands make. Exits non-zero on the first failure."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "relayllm": "packages/core",
    "relayllm_openai": "packages/adapter-openai",
    "relayllm_vllm": "packages/adapter-vllm",
    "relayllm_sglang": "packages/adapter-sglang",
}
INSTALLED = ["relayllm", "relayllm_openai"]  # light enough for CI; the others are built only


def run(*args: str, cwd: Path | None = None) -> str:
    print("+", " ".join(args), flush=True)
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"failed ({done.returncode}): {' '.join(args)}\n{done.stdout}\n{done.stderr}")
    return done.stdout


def check_wheel(wheel: Path, module: str) -> None:
    """Complete metadata: a version, a license, a readme, and core's py.typed marker."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    for field in ("Version: 0.", "License", "Requires-Python: >=3.11", "Description-Content-Type"):
        if field not in meta:
            sys.exit(f"{wheel.name}: METADATA has no {field!r}")
    if module == "relayllm" and "relayllm/py.typed" not in names:
        sys.exit(f"{wheel.name}: no py.typed")


def main() -> None:
    dist = Path(tempfile.mkdtemp(prefix="relayllm-dist-"))
    wheels = {}
    for module, path in PACKAGES.items():
        run(sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(dist), path)
        (wheel,) = dist.glob(f"{module}-*.whl")
        if not list(dist.glob(f"{module}-*.tar.gz")):
            sys.exit(f"no sdist for {module}")
        check_wheel(wheel, module)
        wheels[module] = wheel
    run(sys.executable, "-m", "pip", "install", *(str(wheels[m]) for m in INSTALLED))
    # Imported from the installed wheels, not the source tree.
    where = run(sys.executable, "-c", "import relayllm, relayllm_openai; print(relayllm.__file__)")
    if str(ROOT / "packages") in where:
        sys.exit(f"relayllm imported from the source tree: {where}")
    light = "import sys, relayllm; assert 'ray' not in sys.modules, 'import relayllm loaded Ray'"
    run(sys.executable, "-c", light)
    run(sys.executable, "-m", "relayllm.cli", "--help")
    backends = run(sys.executable, "-m", "relayllm.cli", "backends")
    if "openai" not in backends:
        sys.exit(f"relayllm backends does not list the installed openai adapter:\n{backends}")
    print(f"packaging ok: {', '.join(w.name for w in wheels.values())}")


if __name__ == "__main__":
    main()
