"""The core does not contain or import the Batch API service: the service is a package of its
own (relayllm-service) whose commands reach ``relayllm`` through the command hook; without it,
its commands say which package to install."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import relayllm

SOURCE = Path(relayllm.__file__).parent
SERVICE_COMMANDS = ["serve", "unserve", "batches", "files", "usage"]


def test_no_core_module_imports_the_service():
    importing = []
    for path in sorted(SOURCE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            if any(n.split(".")[0] == "relayllm_service" for n in names):
                importing.append(str(path.relative_to(SOURCE)))
    assert importing == []
    assert not (SOURCE / "batch" / "service").exists()


def _relayllm(*args: str, block: str = "") -> subprocess.CompletedProcess[str]:
    env = {"PATH": "", "RELAYLLM_BLOCK_PLUGINS": block, "RAY_USAGE_STATS_ENABLED": "0"}
    code = "import sys; from relayllm.cli import main; sys.exit(main())"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_without_the_service_its_commands_say_which_package_to_install():
    for command in SERVICE_COMMANDS:
        done = _relayllm(command, "examples/echo.yaml", block="service")
        assert done.returncode == 2, (command, done.stderr)
        assert "relayllm-service" in done.stderr and "./packages/service" in done.stderr, (
            command,
            done.stderr,
        )


def test_with_the_service_installed_its_commands_are_the_services():
    for command in SERVICE_COMMANDS:
        done = _relayllm(command, "--help")
        assert done.returncode == 0, (command, done.stderr)
        assert "needs the service package" not in done.stdout, command
    assert "--state-dir" in _relayllm("serve", "--help").stdout
