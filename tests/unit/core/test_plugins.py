"""The plugin host: discovery, duplicates, switches, and the errors users read."""

import importlib.metadata
import json
import os
import subprocess
import sys

import pluggy
import pytest

import relayllm
from relayllm.backend import Backend, BackendOrigin, BackendRegistry
from relayllm.plugin import manager

# Registered for each test and removed after it (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("echo_backend")


class _Alpha(Backend):
    name = "alpha"
    contract_version = 3


class _AlsoAlpha(Backend):
    name = "alpha"
    contract_version = 3


def _run(code: str, **env: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env}
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


LIST_BACKENDS = (
    "import json; from relayllm.plugin.manager import get_registry; "
    "print(json.dumps(get_registry().names()))"
)


def test_duplicate_backend_names_raise_naming_both_plugins():
    registry = BackendRegistry()
    registry.add(_Alpha, origin=BackendOrigin("first-plugin", "dist-a", "1.0"))
    with pytest.raises(relayllm.DuplicateBackendError) as err:
        registry.add(_AlsoAlpha, origin=BackendOrigin("second-plugin", "dist-b", "2.0"))
    assert "first-plugin (dist-a 1.0)" in str(err.value) and "second-plugin" in str(err.value)


def test_duplicate_through_the_hook_names_both_plugins():
    class Twin:
        @relayllm.hookimpl
        def relayllm_register_backends(self, registry):
            registry.add(_AlsoAlpha)

    class Original:
        @relayllm.hookimpl
        def relayllm_register_backends(self, registry):
            registry.add(_Alpha)

    pm = manager.PluginManager()
    pm._loaded = True  # no entry points: only the two plugins below
    pm.register(Original(), "original-plugin")
    pm.register(Twin(), "twin-plugin")
    with pytest.raises(
        relayllm.DuplicateBackendError,
        match="original-plugin.*twin-plugin|twin-plugin.*original-plugin",
    ):
        pm.registry()


def test_entry_points_are_discovered():
    assert "shout" in _run(LIST_BACKENDS)


def test_autoload_can_be_disabled():
    assert "shout" not in _run(LIST_BACKENDS, RELAYLLM_DISABLE_PLUGIN_AUTOLOAD="1")


def test_named_plugins_can_be_blocked():
    assert "shout" not in _run(LIST_BACKENDS, RELAYLLM_BLOCK_PLUGINS="other, shout")


def test_echo_backend_is_registered_only_when_asked_for():
    assert "echo" not in _run(LIST_BACKENDS)
    assert "echo" in _run(LIST_BACKENDS, RELAYLLM_ECHO_BACKEND="1")


def test_extra_plugins_load_only_what_the_allow_list_names():
    assert "echo" in _run(LIST_BACKENDS, RELAYLLM_EXTRA_PLUGINS="relayllm.testing.echo")
    assert "echo" in _run(LIST_BACKENDS, RELAYLLM_EXTRA_PLUGINS="relayllm.testing:echo")
    out = subprocess.run(
        [sys.executable, "-c", LIST_BACKENDS],
        capture_output=True,
        text=True,
        env={**os.environ, "RELAYLLM_EXTRA_PLUGINS": "no_such_module_xyz"},
    )
    assert out.returncode != 0 and "RELAYLLM_EXTRA_PLUGINS names 'no_such_module_xyz'" in out.stderr


def test_the_plugin_manager_does_not_import_the_test_kit():
    code = (
        "import json, sys; from relayllm.plugin.manager import get_registry; get_registry(); "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('relayllm.testing'))))"
    )
    assert _run(code) == []


def test_origins_are_structured_plugin_distribution_and_version():
    code = (
        "import json; from relayllm.plugin.manager import get_registry; r = get_registry(); "
        "print(json.dumps({n: vars(r.origin(n)) for n in r.names()}))"
    )
    origins = _run(code, RELAYLLM_ECHO_BACKEND="1")
    assert origins["shout"] == {
        "plugin": "shout",
        "distribution": "relayllm-shout",
        "version": importlib.metadata.version("relayllm-shout"),
    }
    assert origins["echo"] == {
        "plugin": "relayllm.testing.echo",
        "distribution": None,
        "version": None,
    }


def test_hooks_are_called_through_pluggy_and_each_backend_knows_its_plugin():
    class One:
        @relayllm.hookimpl
        def relayllm_register_backends(self, registry):
            registry.add(_Alpha)

    calls = []
    pm = manager.PluginManager()
    pm._loaded = True
    pm.register(One(), "one-plugin")
    pm.manager.add_hookcall_monitoring(
        lambda name, impls, kwargs: calls.append(name), lambda *a: None
    )
    registry = pm.registry()
    assert calls == ["relayllm_register_backends"]  # one call of pluggy's hook, not by hand
    assert registry.origin("alpha") == BackendOrigin("one-plugin")


def test_plugins_add_commands_to_the_cli():
    import click

    class Commands:
        @relayllm.hookimpl
        def relayllm_register_commands(self, cli):
            @cli.command()
            def hello():
                """Say hello."""
                click.echo("hello from a plugin")

    group = click.Group("relayllm")
    pm = manager.PluginManager()
    pm._loaded = True
    pm.register(Commands(), "commands-plugin")
    pm.hook.relayllm_register_commands(cli=group)
    from click.testing import CliRunner

    assert CliRunner().invoke(group, ["hello"]).output == "hello from a plugin\n"


def test_misspelled_hook_is_rejected_by_check_pending():
    class Typo:
        @relayllm.hookimpl
        def relayllm_register_backend(self, registry):  # missing the final "s"
            pass

    pm = manager.PluginManager()
    pm._loaded = True
    with pytest.raises(pluggy.PluginValidationError, match="relayllm_register_backend"):
        pm.register(Typo(), "typo-plugin")


def test_unknown_backend_lists_installed_ones_and_the_pip_command():
    with pytest.raises(relayllm.UnknownBackendError) as err:
        manager.get_registry().get("vllm-typo")
    assert "echo" in str(err.value) and "shout" in str(err.value)
    with pytest.raises(
        relayllm.UnknownBackendError, match="pip install './packages/adapter-sglang\\[engine\\]'"
    ):
        BackendRegistry().get("sglang")


def test_missing_engine_package_names_the_pip_command():
    class NeedsEngine(Backend):
        name = "needs-engine"
        requires = ("surely_not_an_installed_module_xyz",)
        install_hint = "pip install relayllm-needs-engine"

    with pytest.raises(relayllm.MissingDependencyError, match="pip install relayllm-needs-engine"):
        NeedsEngine.check_requirements()


def test_import_relayllm_loads_no_engine_and_not_ray():
    code = (
        "import json, sys, relayllm, relayllm.testing; "
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'ray', 'vllm', 'sglang', 'torch', 'openai', 'transformers'})))"
    )
    assert _run(code) == []


def test_a_plugin_that_fails_to_load_does_not_break_the_cli_help():
    out = subprocess.run(
        [sys.executable, "-m", "relayllm.cli", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "RELAYLLM_EXTRA_PLUGINS": "no_such_module_xyz"},
    )
    assert out.returncode == 0 and out.stdout.startswith("Usage: relayllm"), out.stderr
    assert "relayllm: warning: plugins not loaded" in out.stderr
    assert "no_such_module_xyz" in out.stderr
