"""The up-front supported-versions check: what it says, and that the CLI says it first."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import ClassVar

from relayllm import Backend, versions


class _Pinned(Backend):
    name = "pinned"
    install_hint = "pip install relayllm-pinned"
    supported_versions: ClassVar[dict[str, str]] = {"pluggy": "0.0.*", "surely-absent-xyz": "1"}


def test_patterns_match_a_series_and_ignore_local_suffixes():
    assert versions.matches("2.60.1", "2.60.*")
    assert versions.matches("0.32.0+cpu", "0.32.0")
    assert not versions.matches("2.61.0", "2.60.*")


def test_a_window_of_releases_is_alternatives():
    window = "0.32.0|0.33.*"
    assert versions.matches("0.32.0", window) and versions.matches("0.33.1+cu130", window)
    assert not versions.matches("0.32.1", window) and not versions.matches("0.34.0", window)
    assert versions.describe(window) == "0.32.0 or 0.33.*"
    assert versions.describe("1|2|3") == "1, 2 or 3" and versions.describe("2.60.*") == "2.60.*"


def test_an_unsupported_engine_release_says_what_to_install():
    (problem,) = versions.unsupported([_Pinned])
    assert "backend 'pinned' supports pluggy 0.0.*, found " in problem
    assert "pip install relayllm-pinned" in problem  # absent distributions are not flagged


def test_this_environment_is_supported():
    assert versions.unsupported() == []
    assert versions.supported([_Pinned])["ray"] == versions.RAY_VERSIONS


def test_the_cli_warns_on_import_before_any_command_runs(tmp_path):
    plugin = tmp_path / "pinned_plugin.py"
    plugin.write_text(
        "from typing import ClassVar\n"
        "import relayllm\n"
        "class Pinned(relayllm.Backend):\n"
        "    name = 'pinned'\n"
        "    contract_version = 3\n"
        "    install_hint = 'pip install relayllm-pinned'\n"
        "    supported_versions: ClassVar[dict[str, str]] = {'pluggy': '0.0.*'}\n"
        "@relayllm.hookimpl\n"
        "def relayllm_register_backends(registry):\n"
        "    registry.add(Pinned)\n",
        encoding="utf-8",
    )
    env = {
        **os.environ,
        "RELAYLLM_EXTRA_PLUGINS": "pinned_plugin",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run(
        [sys.executable, "-m", "relayllm.cli", "--help"], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    assert "relayllm: warning: backend 'pinned' supports pluggy 0.0.*" in out.stderr
    assert "pip install relayllm-pinned" in out.stderr
