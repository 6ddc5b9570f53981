r"""The batch service's errors. Those a client is refused with are :class:`Refusal`\ s, whose
class says the HTTP status and OpenAI's code the gateway answers with (the one refusal path of
:mod:`relayllm.http.errors`); each message is safe to show a client (no key, no other
project's data, no server path). The others are the runners' and a 500 to a client."""

from __future__ import annotations

from relayllm.errors import RelayLLMError
from relayllm.http import errors as http_errors
from relayllm.http.errors import Refusal


class ServiceError(RelayLLMError):
    """Base class of the batch service's errors."""


class NotFoundError(ServiceError, Refusal, LookupError):
    """No such file or batch in this project: the same answer whether the id does not exist or
    belongs to another project, so a client cannot probe for others' ids (HTTP 404)."""

    status = 404
    code = "not_found"


class InvalidRequestError(ServiceError, Refusal, ValueError):
    """A request the service refuses as asked: a bad parameter, an unsupported endpoint (400)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class TooLargeError(InvalidRequestError):
    """An upload over the size limit; nothing of it is kept (HTTP 413)."""

    status = 413
    code = "file_too_large"


class IllegalTransitionError(ServiceError, Refusal):
    """A batch status change OpenAI's life cycle does not allow (cancelling a completed batch
    is a 400 ``invalid_state`` to a client, a ``BadRequestError`` in the openai client; for a
    runner it means the batch moved on without it)."""

    code = "invalid_state"


class StaleClaimError(ServiceError):
    """A runner wrote with a claim number a newer claim has replaced: nothing was written, and
    the runner must stop (another runner owns the batch now)."""


class ClaimHeldError(ServiceError):
    """Another runner holds the batch and is alive (its lease has not run out): not taken."""


class UnauthorizedError(ServiceError, http_errors.UnauthorizedError):
    """No API key, or one no project has (HTTP 401, as every server of the HTTP layer
    answers it). Never carries the key."""


__all__ = [
    "ClaimHeldError",
    "IllegalTransitionError",
    "InvalidRequestError",
    "NotFoundError",
    "ServiceError",
    "StaleClaimError",
    "TooLargeError",
    "UnauthorizedError",
]
