"""The plugin host: one NAME for the hook markers, the manager and the entry-point group.

Shaped after tox 4's ``tox.plugin``: adapters import :data:`hookimpl` from here (re-exported as
``relayllm.hookimpl``) and expose a module under the entry-point group ``relayllm``.
"""

from __future__ import annotations

import pluggy

NAME = "relayllm"  #: marker project name, plugin manager name and entry-point group

hookspec = pluggy.HookspecMarker(NAME)
hookimpl = pluggy.HookimplMarker(NAME)

#: The adapter contract this relayllm implements (``Backend.contract_version``). A change an
#: adapter could notice raises it, with an entry in core's CHANGELOG and one release in which
#: the previous version keeps working with a deprecation warning.
CONTRACT_VERSION = 3
#: The oldest contract still accepted (through the wrapper of :mod:`relayllm.plugin.legacy`);
#: older or newer adapters are refused when they register.
OLDEST_CONTRACT_VERSION = 2

__all__ = ["CONTRACT_VERSION", "NAME", "OLDEST_CONTRACT_VERSION", "hookimpl", "hookspec"]
