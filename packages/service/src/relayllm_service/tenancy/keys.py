"""API keys to projects: who is asking, so each request sees only its project's files and
batches.

Keys come from ``RELAYLLM_API_KEYS`` (entries ``PROJECT=KEY`` separated by commas or new
lines) and/or a keys file (``RELAYLLM_API_KEYS_FILE``, or the path given: one ``PROJECT=KEY``
per line, ``#`` comments and blank lines skipped). A project may have several keys (one per
person or service, each revocable alone); a key belongs to one project. The admin key
(``RELAYLLM_ADMIN_KEY``) belongs to none: it is the operator's, who reads, cancels and deletes
every project's batches and files (the operator CLI, the console) but creates nothing.

A :class:`KeyMap` keeps only SHA-256 digests of the keys, so no key is in its memory to leak
through a repr, a log line, a traceback or a pickle (Serve ships a gateway's arguments to its
replicas by pickling them). Errors name the source and the entry's position, never its text:
a malformed entry may well be a key written the wrong way round.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping

from relayllm import env
from relayllm.errors import ConfigError
from relayllm.http import errors as http_errors
from relayllm.http.auth import bearer_key
from relayllm_service.errors import UnauthorizedError

#: The project the admin key answers to: no project may be named so (project names are
#: letters, digits, '_', '.' and '-').
ADMIN = "*"
#: Shorter keys are refused: a guessable key is every project's files.
MIN_KEY_LENGTH = 16
_PROJECT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_HOW = "give each entry as PROJECT=KEY"


def _digest(key: str) -> bytes:
    # A dict lookup by digest compares digests, not keys: its timing tells nothing of a key.
    return hashlib.sha256(key.encode("utf-8")).digest()


def looks_like_key(name: str) -> bool:
    """A name that is likely a key: ``sk-``/``sk_`` prefixed, or long with upper case, lower
    case and digits mixed (what a random token looks like; project names rarely do)."""
    if name.lower().startswith(("sk-", "sk_")):
        return True
    return (
        len(name) >= 24
        and any(c.isupper() for c in name)
        and any(c.islower() for c in name)
        and any(c.isdigit() for c in name)
    )


class KeyMap:
    """Which project each API key belongs to (``anonymous``: the project of requests without
    a key, for a server without keys; None refuses them; ``admin``: the operator's key, whose
    project is :data:`ADMIN`): the batch service's :class:`relayllm.http.auth.KeyProvider`."""

    __slots__ = ("_admin", "_anonymous", "_projects")

    def __init__(
        self,
        pairs: Iterable[tuple[str, str]] = (),
        anonymous: str | None = None,
        admin: str | None = None,
    ):
        self._projects: dict[bytes, str] = {}
        self._anonymous = anonymous
        self._admin: bytes | None = None
        for number, (project, key) in enumerate(pairs, start=1):
            self._add(project, key, f"entry {number}")
        if admin is not None:
            self.set_admin(admin, "the admin key")

    def set_admin(self, key: str, where: str) -> None:
        """The operator's key (``where`` names its source in errors, never its text)."""
        _check_key(key, where)
        if _digest(key) in self._projects:
            raise ConfigError(f"{where} is also a project's key; give the admin a key of its own")
        self._admin = _digest(key)

    @property
    def has_admin(self) -> bool:
        return self._admin is not None

    def _add(self, project: str, key: str, where: str) -> None:
        if not _PROJECT.fullmatch(project):
            raise ConfigError(
                f"{where}: the project name must be 1-64 letters, digits, '_', '.' or '-' "
                f"(starting with a letter or digit); {_HOW}"
            )
        if looks_like_key(project):
            raise ConfigError(
                f"{where}: the project name looks like an API key (is the entry written "
                f"KEY=PROJECT?); {_HOW}"
            )
        _check_key(key, where)
        digest = _digest(key)
        if digest == self._admin:
            raise ConfigError(f"{where}: the key is the admin key; give the project its own")
        owner = self._projects.setdefault(digest, project)
        if owner != project:
            raise ConfigError(
                f"{where}: the same key is given to projects {owner!r} and {project!r}; "
                f"a key belongs to one project"
            )

    @classmethod
    def parse(cls, text: str, source: str, anonymous: str | None = None) -> KeyMap:
        """Entries ``PROJECT=KEY`` separated by new lines or commas; ``source`` names the
        text in errors (``RELAYLLM_API_KEYS``, a file's path)."""
        keys = cls(anonymous=anonymous)
        keys._read(text, source)
        return keys

    def _read(self, text: str, source: str) -> None:
        number = 0
        for line_number, line in enumerate(text.splitlines(), start=1):
            if line.strip().startswith("#"):
                continue  # a comment, commas and all
            for entry in line.split(","):
                entry = entry.strip()
                if not entry:
                    continue
                number += 1
                where = f"{source} line {line_number}, entry {number}"
                project, sep, key = entry.partition("=")
                if not sep:
                    raise ConfigError(f"{where}: no '='; {_HOW}")
                self._add(project.strip(), key.strip(), where)

    def merged(self, text: str, source: str) -> KeyMap:
        """A copy with the entries of ``text`` added (a keys file read again: projects.py)."""
        keys = KeyMap(anonymous=self._anonymous)
        keys._projects, keys._admin = dict(self._projects), self._admin
        keys._read(text, source)
        return keys

    def has_key_id(self, project: str, key_id: str) -> bool:
        """Whether a key of ``project`` (the admin's for :data:`ADMIN`) has this
        :func:`key_id`: a console session signed in with a key lasts as long as the key."""
        if project == ADMIN:
            return self._admin is not None and self._admin.hex()[:16] == key_id
        return any(p == project and d.hex()[:16] == key_id for d, p in self._projects.items())

    @property
    def projects(self) -> frozenset[str]:
        return frozenset(self._projects.values())

    def __len__(self) -> int:
        return len(self._projects)

    @property
    def fingerprint(self) -> str:
        """A digest of the whole map (digests, projects, the anonymous project): equal maps,
        equal fingerprints; it tells whether a running gateway has these keys, and no key."""
        whole = hashlib.sha256()
        for digest, project in sorted(self._projects.items()):
            whole.update(digest + project.encode("utf-8") + b"\n")
        whole.update(f"anonymous={self._anonymous!r}".encode())
        whole.update(b"admin=" + (self._admin or b""))
        return whole.hexdigest()

    def __repr__(self) -> str:
        anonymous = f", anonymous={self._anonymous!r}" if self._anonymous else ""
        admin = ", admin key" if self._admin else ""
        return f"KeyMap({len(self)} keys, projects={sorted(self.projects)}{anonymous}{admin})"

    __str__ = __repr__

    def project_for(self, key: str | None) -> str:
        """The project of ``key``; :class:`UnauthorizedError` for a key no project has, or
        for no key when requests without one are refused."""
        if not key:
            if self._anonymous is not None:
                return self._anonymous
            raise UnauthorizedError(
                "no API key: send it as 'Authorization: Bearer KEY' (the openai client's api_key)"
            )
        digest = _digest(key)
        project = self._projects.get(digest)
        if project is None:
            if digest == self._admin:
                return ADMIN
            raise UnauthorizedError("the API key is not valid")
        return project

    def project_for_header(self, authorization: str | None) -> str:
        """The project of an ``Authorization: Bearer KEY`` header's value."""
        try:
            key = bearer_key(authorization)
        except http_errors.UnauthorizedError as exc:  # as the service's own, same message
            raise UnauthorizedError(str(exc)) from None
        return self.project_for(key)


def key_id(key: str) -> str:
    """A short name of a key (its digest's first 8 bytes in hex): what a console session keeps
    to check that the key it signed in with is still valid, never the key."""
    return _digest(key).hex()[:16]


def environment_keys(
    environ: Mapping[str, str] | None = None, anonymous: str | None = None
) -> KeyMap:
    """The keys of ``RELAYLLM_API_KEYS`` and the admin key of ``RELAYLLM_ADMIN_KEY`` (no
    file, no check that any key is given)."""
    keys = KeyMap(anonymous=anonymous)
    admin = env.ADMIN_KEY.get(environ)
    if admin:
        keys.set_admin(admin, env.ADMIN_KEY.name)
    text = env.API_KEYS.raw(environ)
    if text.strip():
        keys._read(text, env.API_KEYS.name)
    return keys


def load_keys(
    environ: Mapping[str, str] | None = None,
    path: str | None = None,
    anonymous: str | None = None,
) -> KeyMap:
    """The keys of ``RELAYLLM_API_KEYS`` and of the keys file (``path``, else
    ``RELAYLLM_API_KEYS_FILE``), merged, and the admin key of ``RELAYLLM_ADMIN_KEY``. No
    project key at all is a ConfigError unless ``anonymous`` names the project of keyless
    requests (a server for one trusted user)."""
    keys = environment_keys(environ, anonymous)
    path = path or env.API_KEYS_FILE.get(environ)
    if path:
        content, problem = _read_file(path)
        if content is None:
            raise ConfigError(problem)  # outside the except: no __context__ holds the bytes
        keys._read(content, path)
    if not len(keys) and anonymous is None:
        raise ConfigError(
            f"no API keys: set {env.API_KEYS.name} (PROJECT=KEY,...) or "
            f"{env.API_KEYS_FILE.name} (a file of PROJECT=KEY lines)"
        )
    return keys


def _check_key(key: str, where: str) -> None:
    if len(key) < MIN_KEY_LENGTH or any(c.isspace() for c in key):
        raise ConfigError(
            f"{where}: a key must be at least {MIN_KEY_LENGTH} characters without spaces "
            f"(make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )


def _read_file(path: str) -> tuple[str | None, str]:
    """The keys file's text, or None and why not (never the decode error itself: it carries
    the file's bytes, keys and all)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read(), ""
    except OSError as exc:
        return None, f"cannot read the API keys file {path!r}: {exc.strerror or exc}"
    except UnicodeDecodeError:
        return None, f"the API keys file {path!r} is not UTF-8 text"


__all__ = [
    "ADMIN",
    "MIN_KEY_LENGTH",
    "KeyMap",
    "environment_keys",
    "key_id",
    "load_keys",
]
