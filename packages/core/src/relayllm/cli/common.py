"""What every subcommand shares: the cluster options, error handling, tables, progress."""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from relayllm.errors import ConfigError, RelayLLMError

F = TypeVar("F", bound=Callable[..., Any])

#: Exit codes: bad input found before anything ran; a failure while running.
EXIT_BAD_INPUT = 2
EXIT_FAILED = 1


def address_option(func: F) -> F:
    return click.option(
        "--address",
        envvar="RAY_ADDRESS",
        metavar="ADDRESS",
        help="Ray cluster to use (host:port or ray://...); default: $RAY_ADDRESS, "
        "else a running local cluster, else a new one for this command.",
    )(func)


def verbose_option(func: F) -> F:
    return click.option(
        "-v", "--verbose", is_flag=True, help="Show Ray's and the engines' own logs."
    )(func)


def fail(message: str, code: int = EXIT_BAD_INPUT) -> None:
    click.echo(f"relayllm: error: {message}", err=True)
    sys.exit(code)


def handle_errors(func: F) -> F:
    """Turn relayllm's errors into a message and an exit code instead of a traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except ConfigError as exc:
            fail(str(exc), EXIT_BAD_INPUT)
        except RelayLLMError as exc:
            fail(str(exc), EXIT_FAILED)
        except KeyboardInterrupt:
            fail("interrupted", 130)

    return wrapper  # type: ignore[return-value]


def connect(address: str | None, verbose: bool, *, existing_cluster: bool = False) -> None:
    """Connect to Ray and start Serve. ``existing_cluster``: fail instead of starting a
    throw-away local cluster (long-lived deployments need one that outlives this command)."""
    import ray

    from relayllm.cluster import connect as connect_cluster

    address = address or os.environ.get("RAY_ADDRESS") or ("auto" if existing_cluster else None)
    if not verbose:
        os.environ.setdefault("RELAYLLM_QUIET_WORKERS", "1")
    if not ray.is_initialized():
        try:
            # The namespace relayllm.cluster uses; initialised here to choose the log level.
            ray.init(
                address=address,
                namespace="relayllm",
                log_to_driver=verbose,
                logging_level=logging.INFO if verbose else logging.WARNING,
            )
        except ConnectionError as exc:
            if type(exc.__cause__).__name__ == "AuthenticationError":
                raise ConfigError(
                    f"the Ray cluster at {address} uses token authentication: set "
                    f"RAY_AUTH_MODE=token (Ray reads the token from ~/.ray/auth_token or "
                    f"RAY_AUTH_TOKEN)"
                ) from None
            raise ConfigError(
                f"no Ray cluster to connect to ({exc}). Start one with `ray start --head` and "
                f"pass --address HOST:PORT or set RAY_ADDRESS."
            ) from None
    if not verbose:
        _quiet_console_logs()
    connect_cluster(address if address != "auto" else None)
    from ray.data import DataContext

    context = DataContext.get_current()
    # On a terminal: a tqdm bar per operator, i.e. per step (prepare[step], the stage,
    # finish[step]), drawn in this process (Ray's own bars travel through the worker log
    # forwarding that quiet mode turns off). Elsewhere Ray Data logs the same counts every 10 s.
    context.use_ray_tqdm = False
    context.execution_options.verbose_progress = True


def _quiet_console_logs() -> None:
    """Ray Data and Serve log every dataset start and Serve start at INFO on the console; keep
    warnings there (their log files still get everything), and Ray Data's per-operator
    progress lines -- ``Map(finish[answer])->Map(prepare[shorter]): 120/400`` -- which it
    logs every 10 s when the output is not a terminal (on a terminal it draws bars)."""
    import ray.data  # noqa: F401  (configures the ray.data logger on import)
    import ray.serve  # noqa: F401

    for name in ("ray", "ray.data", "ray.serve"):
        logger = logging.getLogger(name)
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                if name == "ray.data":
                    handler.addFilter(_warnings_and_progress)
                else:
                    handler.setLevel(logging.WARNING)
        if name == "ray.serve":
            logger.setLevel(logging.WARNING)


_PROGRESS_LINE = re.compile(r"^\S.*: \d+/(\d+|\?)$")


def _warnings_and_progress(record: logging.LogRecord) -> bool:
    if record.levelno >= logging.WARNING:
        return True
    return record.name.startswith("ray.data._internal.progress") and bool(_PROGRESS_LINE.match(record.getMessage()))


def check_writable(path: str) -> None:
    """Fail before anything runs if ``path`` cannot be written."""
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) or not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise ConfigError(f"cannot write {path}: its directory does not exist or is not writable")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[int] = ()) -> str:
    """A plain text table; columns whose index is in ``right`` are right-aligned."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(parts).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
