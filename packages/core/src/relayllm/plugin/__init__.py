"""The plugin host: one NAME for the hook markers, the manager and the entry-point group.

Shaped after tox 4's ``tox.plugin``: adapters import :data:`hookimpl` from here (re-exported as
``relayllm.hookimpl``) and expose a module under the entry-point group ``relayllm``.
"""

from __future__ import annotations

import pluggy

NAME = "relayllm"  #: marker project name, plugin manager name and entry-point group

hookspec = pluggy.HookspecMarker(NAME)
hookimpl = pluggy.HookimplMarker(NAME)

__all__ = ["NAME", "hookimpl", "hookspec"]
