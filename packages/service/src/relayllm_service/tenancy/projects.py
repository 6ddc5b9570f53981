"""Projects managed while the service runs: the keys file and the quotas file are read again
whenever they change, so adding a project, disabling or rotating its key, and changing its
quota or weight take effect on the running gateways and runner, without a restart.

Each use looks at the file (one ``stat``; a file changed in the last :data:`FRESH_S` seconds is
read again at every use, whatever the filesystem's clock resolution), so a rotated-out key is
refused from the first request after the file is saved. A file that no longer parses (a bad
entry, half a write) leaves the last good contents in force and logs why, naming the file and
the entry, never a key: a typo must not lock every project out, nor let a removed key back in
on a later fix. A file that cannot be read at all (moved, its node's disk not here) likewise.

The keys of ``RELAYLLM_API_KEYS`` and the admin key stay as the service started with them:
only the files are managed this way.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

from relayllm import env
from relayllm.errors import ConfigError
from relayllm_service.tenancy.keys import KeyMap, environment_keys, load_keys
from relayllm_service.tenancy.quotas import Quota, read_quotas

logger = logging.getLogger(__name__)

#: A file modified less than this long ago is read again at each use (two saves within one
#: tick of a coarse filesystem clock, same size, look alike to ``stat``).
FRESH_S = 2.0

T = TypeVar("T")


class WatchedFile(Generic[T]):
    """A value parsed from a file, parsed again when the file changes (see the module)."""

    def __init__(self, path: str, value: T, kind: str) -> None:
        self.path = os.path.abspath(path)
        self.kind = kind  # "keys" or "quotas": names the file in the log
        self._value = value
        self._seen: tuple[int, int, int, int] | None = _signature(self.path)
        self._text_digest: bytes | None = None
        self._complained: str | None = None

    def parse(self, text: str) -> T:
        raise NotImplementedError

    @property
    def value(self) -> T:
        """The file's value now: re-parsed if it changed, else the last one."""
        seen = _signature(self.path)
        if seen is None:
            self._complain(f"the {self.kind} file {self.path!r} cannot be read; kept as it was")
            return self._value
        fresh = time.time() - seen[1] / 1e9 < FRESH_S
        if seen == self._seen and not fresh:
            return self._value
        self._seen = seen
        try:
            with open(self.path, encoding="utf-8") as handle:
                text = handle.read()
        except (OSError, UnicodeDecodeError):
            self._complain(f"the {self.kind} file {self.path!r} cannot be read; kept as it was")
            return self._value
        digest = hashlib.sha256(text.encode("utf-8")).digest()
        if digest == self._text_digest:
            return self._value
        try:
            value = self.parse(text)
        except ConfigError as exc:  # names the file and the entry, never a key's text
            self._text_digest = digest  # logged once, until the file changes again
            self._complain(f"{exc}; the {self.kind} as they were stay in force")
            return self._value
        self._text_digest, self._value, self._complained = digest, value, None
        logger.info("the %s file %s was read again", self.kind, self.path)
        return self._value

    def _complain(self, message: str) -> None:
        if message != self._complained:
            logger.error("%s", message)
            self._complained = message

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state["_complained"] = None
        return state


class LiveKeys(WatchedFile[KeyMap]):
    """The service's keys (:class:`relayllm.http.auth.KeyProvider`): those the service started
    with from the environment (``base``) and the keys file's, read again when it changes."""

    def __init__(self, base: KeyMap, path: str, current: KeyMap) -> None:
        self.base = base
        super().__init__(path, current, "keys")

    def parse(self, text: str) -> KeyMap:
        return self.base.merged(text, self.path)

    def project_for(self, key: str | None) -> str:
        return self.value.project_for(key)

    def project_for_header(self, authorization: str | None) -> str:
        return self.value.project_for_header(authorization)

    def has_key_id(self, project: str, key_id: str) -> bool:
        return self.value.has_key_id(project, key_id)

    @property
    def projects(self) -> frozenset[str]:
        return self.value.projects

    @property
    def has_admin(self) -> bool:
        return self.value.has_admin

    def __len__(self) -> int:
        return len(self.value)

    @property
    def fingerprint(self) -> str:
        """The environment's keys and the file's path (not its contents, which change while
        the gateway runs and are read by it): a gateway serving again with the same file is
        the same gateway."""
        return hashlib.sha256(f"{self.base.fingerprint}|{self.path}".encode()).hexdigest()

    def __repr__(self) -> str:
        return f"LiveKeys({self.path!r}, {self.value!r})"

    __str__ = __repr__


class LiveQuotas(WatchedFile[dict[str, Quota]]):
    """The quotas and weights of the quotas file, read again when it changes."""

    def parse(self, text: str) -> dict[str, Quota]:
        return read_quotas(self.path, text)


def quotas_now(path: str | None, quotas: dict[str, Quota]) -> Callable[[], dict[str, Quota]]:
    """The quotas at each call: the file's at ``path`` read again when it changes, else
    ``quotas`` as given."""
    if path is None:
        return lambda: quotas
    watched = LiveQuotas(path, quotas, "quotas")
    return lambda: watched.value


def service_keys(
    environ: Mapping[str, str] | None = None,
    path: str | None = None,
    anonymous: str | None = None,
) -> KeyMap | LiveKeys:
    """The service's keys as :func:`~relayllm_service.tenancy.keys.load_keys` reads them (every
    check made now, before the cluster), kept live when a keys file gives some."""
    path = path or env.API_KEYS_FILE.get(environ)
    current = load_keys(environ, path, anonymous)
    if path is None:
        return current
    return LiveKeys(environment_keys(environ, anonymous), path, current)


def _signature(path: str) -> tuple[int, int, int, int] | None:
    """What ``stat`` says of a change: inode (a file replaced), mtime, ctime and size."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return (found.st_ino, found.st_mtime_ns, found.st_ctime_ns, found.st_size)


#: What the gateway and the console take as keys.
Keys = KeyMap | LiveKeys

__all__ = [
    "FRESH_S",
    "Keys",
    "LiveKeys",
    "LiveQuotas",
    "WatchedFile",
    "quotas_now",
    "service_keys",
]
