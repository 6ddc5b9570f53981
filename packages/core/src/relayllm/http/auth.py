"""Bearer key -> project: who is asking. One header format and two providers: a deployment's
front has one key (:class:`SingleKey`, from ``http.api_key_env`` / ``http.admin_key_env``), the
batch service a key per project (:class:`relayllm_service.tenancy.keys.KeyMap`). A route set
asks its provider for the project of a request's ``Authorization`` header and never sees a key
otherwise; a refusal is :class:`~relayllm.http.errors.UnauthorizedError`, a 401."""

from __future__ import annotations

import hmac
import os
from typing import TYPE_CHECKING, Protocol

from relayllm.errors import ConfigError
from relayllm.http.errors import UnauthorizedError

if TYPE_CHECKING:
    from starlette.requests import Request

#: The project of a request to a server with one key (a deployment's front).
DEFAULT_PROJECT = "default"
HOW = "send it as 'Authorization: Bearer KEY'"


class KeyProvider(Protocol):
    """Whose key a request carries."""

    def project_for_header(self, authorization: str | None) -> str:
        """The project of an ``Authorization`` header's value (None: no header); raises
        :class:`UnauthorizedError`."""
        ...


def bearer_key(authorization: str | None) -> str | None:
    """The key of ``Authorization: Bearer KEY`` (None for no header or no key); any other
    scheme is refused."""
    if not authorization or not authorization.strip():
        return None
    scheme, _, key = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        raise UnauthorizedError("the Authorization header must be 'Bearer KEY'")
    return key.strip() or None


def project_of(request: Request, keys: KeyProvider) -> str:
    return keys.project_for_header(request.headers.get("authorization"))


class SingleKey:
    """One key for every client (None: no key asked, any header passes); the project is
    always :data:`DEFAULT_PROJECT`. Only the key's bytes are kept, compared in constant time:
    the time taken does not tell how much of a guess was right."""

    __slots__ = ("_key",)

    def __init__(self, key: str | None) -> None:
        self._key = key.encode() if key else None

    @property
    def required(self) -> bool:
        return self._key is not None

    @classmethod
    def from_env(cls, env: str | None, field: str, unset: str) -> SingleKey:
        """The key in the variable ``env`` names (no key when no variable is named); a named
        variable that is not set fails the replica's start, naming the field."""
        if not env:
            return cls(None)
        key = os.environ.get(env)
        if not key:
            raise ConfigError(
                f"http.{field} is {env!r}, but that environment variable is not set where the "
                "replica runs; set it in the environment the Ray cluster was started with (or "
                f"remove {field} {unset})"
            )
        return cls(key)

    def project_for_header(self, authorization: str | None) -> str:
        if self._key is None:
            return DEFAULT_PROJECT
        wrong = UnauthorizedError(f"missing or wrong API key: {HOW}")
        try:
            given = bearer_key(authorization)
        except UnauthorizedError:
            raise wrong from None
        if given is None or not hmac.compare_digest(given.encode(), self._key):
            raise wrong
        return DEFAULT_PROJECT

    def __repr__(self) -> str:  # never the key
        return f"SingleKey(required={self.required})"


__all__ = ["DEFAULT_PROJECT", "KeyProvider", "SingleKey", "bearer_key", "project_of"]
