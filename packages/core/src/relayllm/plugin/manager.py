"""Loading plugins: entry points of group ``relayllm``, with switches to turn them off.

Environment switches (read each time a manager loads):

- ``RELAYLLM_DISABLE_PLUGIN_AUTOLOAD=1`` -- do not load entry points at all (only plugins
  registered in code or named by the next switch).
- ``RELAYLLM_BLOCK_PLUGINS=name1,name2`` -- skip these plugin (entry-point) names.
- ``RELAYLLM_EXTRA_PLUGINS=module,module:attribute,...`` -- also register these plugins, which
  no package declares as an entry point: test backends for a subprocess such as the CLI under
  test. Only what is listed is imported.
- ``RELAYLLM_ECHO_BACKEND=1`` -- shorthand for listing ``relayllm.testing.echo`` there.

Hooks are called through pluggy (``hook.relayllm_register_backends(registry=...)``); the
registry asks :meth:`PluginManager.origin_of` which plugin's hook is adding a backend.
"""

from __future__ import annotations

import importlib
import threading
from types import FrameType, ModuleType
from typing import Any

import pluggy

from relayllm import env
from relayllm.backend import BackendOrigin, BackendRegistry
from relayllm.errors import ConfigError
from relayllm.plugin import NAME, spec

#: The plugin ``RELAYLLM_ECHO_BACKEND=1`` adds to the extra plugins.
ECHO_PLUGIN = "relayllm.testing.echo"


class PluginManager:
    """Wraps pluggy's manager; builds the :class:`BackendRegistry` from all plugins."""

    def __init__(self) -> None:
        self.manager = pluggy.PluginManager(NAME)
        self.manager.add_hookspecs(spec)
        self._registry: BackendRegistry | None = None
        self._loaded = False
        self._lock = threading.RLock()

    @property
    def hook(self) -> Any:
        """pluggy's hook caller, with every plugin loaded."""
        self.load()
        return self.manager.hook

    def load(self) -> None:
        with self._lock:
            if self._loaded:
                return
            for name in env.BLOCK_PLUGINS.get():
                self.manager.set_blocked(name)
            if not env.DISABLE_PLUGIN_AUTOLOAD.get():
                self.manager.load_setuptools_entrypoints(NAME)
            for target in extra_plugins():
                self._register(_import_plugin(target), target)
            self.manager.check_pending()
            self._loaded = True

    def register(self, plugin: ModuleType | object, name: str | None = None) -> None:
        """Register a plugin object in code (tests, notebooks); resets the backend registry."""
        with self._lock:
            self._register(plugin, name)

    def unregister(self, name: str) -> None:
        """Remove a plugin registered in code by ``name``; resets the backend registry."""
        with self._lock:
            self.manager.unregister(name=name)
            self._registry = None

    def _register(self, plugin: ModuleType | object, name: str | None) -> None:
        fresh_name = name is None or self.manager.get_plugin(name) is None
        if fresh_name and not self.manager.is_registered(plugin):
            self.manager.register(plugin, name=name)
        self.manager.check_pending()
        self._registry = None

    def registry(self) -> BackendRegistry:
        self.load()
        with self._lock:
            if self._registry is None:
                registry = BackendRegistry(locate=self.origin_of)
                self.manager.hook.relayllm_register_backends(registry=registry)
                self._registry = registry
            return self._registry

    def origin_of(self, frame: FrameType) -> BackendOrigin | None:
        """The plugin whose hook runs in ``frame`` (a module plugin's function, or a method
        of a plugin object), with its distribution if an entry point brought it in."""
        module = frame.f_globals.get("__name__")
        instance = frame.f_locals.get("self")
        for name, plugin in self.manager.list_name_plugin():
            if plugin is None:  # blocked
                continue
            if plugin is instance or (isinstance(plugin, ModuleType) and plugin.__name__ == module):
                dist = self._distribution(plugin)
                return BackendOrigin(name, *dist) if dist else BackendOrigin(name)
        return None

    def _distribution(self, plugin: object) -> tuple[str, str] | None:
        for dist_plugin, dist in self.manager.list_plugin_distinfo():
            if dist_plugin is plugin:
                return dist.project_name, dist.version
        return None

    def distribution_of(self, backend_name: str) -> tuple[str, str] | None:
        """(distribution, version) that registered ``backend_name``, if it came from one."""
        origin = self.registry().origin(backend_name)
        if origin is None or origin.distribution is None or origin.version is None:
            return None
        return origin.distribution, origin.version


def extra_plugins() -> list[str]:
    """The plugins ``RELAYLLM_EXTRA_PLUGINS`` (and ``RELAYLLM_ECHO_BACKEND=1``) name."""
    extra = env.EXTRA_PLUGINS.get()
    if env.ECHO_BACKEND.get() and ECHO_PLUGIN not in extra:
        extra.append(ECHO_PLUGIN)
    return extra


def _import_plugin(target: str) -> object:
    module_name, _, attribute = target.partition(":")
    try:
        plugin: object = importlib.import_module(module_name)
        for part in filter(None, attribute.split(".")):
            plugin = getattr(plugin, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"{env.EXTRA_PLUGINS.name} names {target!r}, which cannot be loaded ({exc}); give "
            f"'module' or 'module:attribute' of an importable plugin, or unset it"
        ) from exc
    return plugin


MANAGER = PluginManager()


def get_registry() -> BackendRegistry:
    """The registry of every installed backend (loads entry points on first use)."""
    return MANAGER.registry()


def get_manager() -> PluginManager:
    """The process's plugin manager (the one :func:`reset` replaces)."""
    return MANAGER


def reset() -> None:
    """Forget loaded plugins so the next call re-reads entry points and switches (tests)."""
    global MANAGER
    MANAGER = PluginManager()


__all__ = [
    "ECHO_PLUGIN",
    "MANAGER",
    "PluginManager",
    "extra_plugins",
    "get_manager",
    "get_registry",
    "reset",
]
