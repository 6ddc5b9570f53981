"""Loading plugins: entry points of group ``relayllm``, with switches to turn them off.

Environment switches (read each time the manager loads):

- ``RELAYLLM_DISABLE_PLUGIN_AUTOLOAD=1`` -- do not load entry points at all (only plugins
  registered in code, e.g. the echo backend from :mod:`relayllm.testing`).
- ``RELAYLLM_BLOCK_PLUGINS=name1,name2`` -- skip these entry-point names.
- ``RELAYLLM_ECHO_BACKEND=1`` -- also register the echo test backend (for subprocesses such as
  the CLI under test; Python code calls :func:`relayllm.testing.enable_echo_backend`).
"""

from __future__ import annotations

import os
import threading
from types import ModuleType

import pluggy

from relayllm.backend import BackendRegistry
from relayllm.plugin import NAME, spec

DISABLE_AUTOLOAD_ENV = "RELAYLLM_DISABLE_PLUGIN_AUTOLOAD"
BLOCK_PLUGINS_ENV = "RELAYLLM_BLOCK_PLUGINS"
ECHO_BACKEND_ENV = "RELAYLLM_ECHO_BACKEND"

_TRUE = {"1", "true", "yes", "on"}


class PluginManager:
    """Wraps pluggy's manager; builds the :class:`BackendRegistry` from all plugins."""

    def __init__(self) -> None:
        self.manager = pluggy.PluginManager(NAME)
        self.manager.add_hookspecs(spec)
        self._registry: BackendRegistry | None = None
        self._loaded = False
        self._lock = threading.Lock()

    def load(self) -> None:
        with self._lock:
            if self._loaded:
                return
            for name in _blocked():
                self.manager.set_blocked(name)
            if os.environ.get(DISABLE_AUTOLOAD_ENV, "").lower() not in _TRUE:
                self.manager.load_setuptools_entrypoints(NAME)
            if os.environ.get(ECHO_BACKEND_ENV, "").lower() in _TRUE:
                from relayllm.testing import echo

                self._register(echo, "relayllm.testing.echo")
            self.manager.check_pending()
            self._loaded = True

    def register(self, plugin: ModuleType | object, name: str | None = None) -> None:
        """Register a plugin object in code (tests, notebooks); resets the backend registry."""
        with self._lock:
            self._register(plugin, name)

    def _register(self, plugin: ModuleType | object, name: str | None) -> None:
        if name is None or self.manager.get_plugin(name) is None:
            if not self.manager.is_registered(plugin):
                self.manager.register(plugin, name=name)
        self.manager.check_pending()
        self._registry = None

    def registry(self) -> BackendRegistry:
        self.load()
        with self._lock:
            if self._registry is None:
                registry = BackendRegistry()
                for impl in self.manager.hook.relayllm_register_backends.get_hookimpls():
                    registry._current_plugin = self._plugin_label(impl.plugin_name)
                    impl.function(registry=registry)
                registry._current_plugin = None
                self._registry = registry
            return self._registry

    def _plugin_label(self, plugin_name: str) -> str:
        for dist_plugin, dist in self.manager.list_plugin_distinfo():
            if self.manager.get_name(dist_plugin) == plugin_name:
                return f"{plugin_name} ({dist.project_name} {dist.version})"
        return plugin_name

    def distribution_of(self, backend_name: str) -> tuple[str, str] | None:
        """(distribution, version) that registered ``backend_name``, if it came from one."""
        registry = self.registry()
        origin = registry.origin(backend_name)
        for dist_plugin, dist in self.manager.list_plugin_distinfo():
            if origin and origin.startswith(f"{self.manager.get_name(dist_plugin)} "):
                return dist.project_name, dist.version
        return None


def _blocked() -> list[str]:
    return [n.strip() for n in os.environ.get(BLOCK_PLUGINS_ENV, "").split(",") if n.strip()]


MANAGER = PluginManager()


def get_registry() -> BackendRegistry:
    """The registry of every installed backend (loads entry points on first use)."""
    return MANAGER.registry()


def reset() -> None:
    """Forget loaded plugins so the next call re-reads entry points and switches (tests)."""
    global MANAGER
    MANAGER = PluginManager()


__all__ = [
    "BLOCK_PLUGINS_ENV",
    "DISABLE_AUTOLOAD_ENV",
    "ECHO_BACKEND_ENV",
    "MANAGER",
    "PluginManager",
    "get_registry",
    "reset",
]
