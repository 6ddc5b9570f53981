"""What ``relayllm batches`` and ``relayllm files`` share: the service's URL and key as options
(or environment variables), the ``openai`` client they make, the ``--json`` flag, times and
errors shown the way an operator reads them.

The commands talk to a running batch service (``relayllm serve``) over HTTP with the real
``openai`` client, as any other client does: no Ray connection, nothing started. A project's
key shows that project's batches and files; the admin key (``RELAYLLM_ADMIN_KEY`` where the
service runs) shows every project's, with a ``project`` column.
"""

from __future__ import annotations

import datetime
import functools
import json
from collections.abc import Callable
from typing import Any, TypeVar

import click

from relayllm import env
from relayllm.cli.common import EXIT_BAD_INPUT, EXIT_FAILED, fail

F = TypeVar("F", bound=Callable[..., Any])

#: The base URL ``relayllm serve`` prints by default (the gateway's own server).
DEFAULT_BASE_URL = "http://127.0.0.1:8001/v1"
#: Where the URL and the key come from when not given: relayllm's variable, else OpenAI's.
BASE_URL_ENVS = [env.BASE_URL.name, "OPENAI_BASE_URL"]
API_KEY_ENVS = [env.API_KEY.name, "OPENAI_API_KEY"]


def service_options(func: F) -> F:
    """``--base-url``, ``--api-key`` and ``--json``."""
    func = click.option("--json", "as_json", is_flag=True, help="Print OpenAI's objects as JSON.")(
        func
    )
    func = click.option(
        "--api-key",
        envvar=API_KEY_ENVS,
        metavar="KEY",
        help="A project's key (its batches and files) or the admin key (every project's); "
        "default: $RELAYLLM_API_KEY, else $OPENAI_API_KEY. Prefer the variable: a command "
        "line is visible to other users of the machine.",
    )(func)
    return click.option(
        "--base-url",
        envvar=BASE_URL_ENVS,
        default=DEFAULT_BASE_URL,
        show_default=True,
        metavar="URL",
        help="The service's base URL, as `relayllm serve` prints it (also $RELAYLLM_BASE_URL, "
        "else $OPENAI_BASE_URL).",
    )(func)


def client(base_url: str, api_key: str | None) -> Any:
    """The ``openai`` client of the service (no retries: an operator sees a failure at once)."""
    if not api_key:
        fail(
            f"no API key for the batch service at {base_url}: pass a project's key or the admin "
            "key with --api-key, or set $RELAYLLM_API_KEY",
            EXIT_BAD_INPUT,
        )
    try:
        import openai
    except ImportError:
        fail(
            "the operator commands use the openai package: pip install 'relayllm[http]'",
            EXIT_BAD_INPUT,
        )
    return openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)


def service_errors(func: F) -> F:
    """The ``openai`` client's errors as one line naming the URL, without the key."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import openai

        url = kwargs.get("base_url") or DEFAULT_BASE_URL
        try:
            return func(*args, **kwargs)
        except openai.APIConnectionError as exc:
            cause = _root_cause(exc)
            fail(
                f"cannot reach the batch service at {url}: {cause} (is `relayllm serve` "
                "running there? --base-url or $RELAYLLM_BASE_URL names another)",
                EXIT_FAILED,
            )
        except openai.AuthenticationError:
            fail(
                f"the batch service at {url} refused the API key (401); pass a "
                "project's key or the admin key with --api-key or $RELAYLLM_API_KEY",
                EXIT_FAILED,
            )
        except openai.APIStatusError as exc:
            code = EXIT_FAILED if exc.status_code >= 500 else EXIT_BAD_INPUT
            fail(f"the batch service at {url} answered {exc.status_code}: {_message(exc)}", code)

    return wrapper  # type: ignore[return-value]


def _message(exc: Any) -> str:
    body = exc.body
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])
    return str(exc.message)


def _root_cause(exc: BaseException) -> str:
    """What the connection failed on ("[Errno 111] Connection refused"), not openai's
    "Connection error."."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return str(exc) or type(exc).__name__


def when(seconds: int | None) -> str:
    """A Unix time as UTC, to the second ("-": not yet)."""
    if seconds is None:
        return "-"
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def dump(objects: Any) -> None:
    """One object, or a list of them, as JSON (every field OpenAI's object has, and the
    ``project`` the admin key is told)."""
    if isinstance(objects, list):
        data: Any = [item.model_dump(mode="json") for item in objects]
    else:
        data = objects.model_dump(mode="json")
    click.echo(json.dumps(data, indent=2))


def first(pages: Any, limit: int) -> list[Any]:
    """The first ``limit`` items of a cursor page and the pages after it."""
    items = []
    for item in pages:
        items.append(item)
        if len(items) >= limit:
            break
    return items


def project_of(item: Any) -> str | None:
    """The project the service names for the admin key (None for a project's own key)."""
    extra = getattr(item, "model_extra", None) or {}
    value = extra.get("project")
    return None if value is None else str(value)


__all__ = [
    "API_KEY_ENVS",
    "BASE_URL_ENVS",
    "DEFAULT_BASE_URL",
    "client",
    "dump",
    "first",
    "project_of",
    "service_errors",
    "service_options",
    "when",
]
