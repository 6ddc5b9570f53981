"""What every subcommand shares: the cluster options, error handling, tables, progress."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from relayllm.cli.progress import Console
from relayllm.errors import ConfigError, RelayLLMError, describe_exception

F = TypeVar("F", bound=Callable[..., Any])

#: Exit codes: bad input found before anything ran; a failure while running.
EXIT_BAD_INPUT = 2
EXIT_FAILED = 1


def address_option(func: F) -> F:
    """``--address`` of a command that runs a job: without one it may start a cluster."""
    return click.option(
        "--address",
        envvar="RAY_ADDRESS",
        metavar="ADDRESS",
        help="Ray cluster to use (host:port or ray://...); default: $RAY_ADDRESS, "
        "else a running local cluster, else a new one for this command.",
    )(func)


def attach_address_option(func: F) -> F:
    """``--address`` of a command that acts on long-lived deployments: it never starts a
    cluster (one it started would end with it)."""
    return click.option(
        "--address",
        envvar="RAY_ADDRESS",
        metavar="ADDRESS",
        help="Ray cluster to use (host:port or ray://...); default: $RAY_ADDRESS, else the "
        "cluster running on this machine (`ray start --head`), named when found. Token "
        "authentication is handled: the token at hand (~/.ray/auth_token, $RAY_AUTH_TOKEN) "
        "is sent to a cluster that uses tokens.",
    )(func)


def verbose_option(func: F) -> F:
    return click.option(
        "-v", "--verbose", is_flag=True, help="Show Ray's and the engines' own logs."
    )(func)


def warn_unsupported_versions() -> list[str]:
    """Say (once per process, on stderr) which installed Ray or engine release this relayllm
    does not support and what to install -- before any engine starts. Returns the problems."""
    from relayllm import versions
    from relayllm.plugin.manager import get_registry

    try:
        backends = list(get_registry())
    except Exception:  # broken plugins: the command that needs them says so; Ray still counts
        backends = []
    problems = versions.unsupported(backends)
    if not _said_versions:
        _said_versions.append(True)
        for problem in problems:
            click.echo(f"relayllm: warning: {problem}", err=True)
    return problems


_said_versions: list[bool] = []


def fail(message: str, code: int = EXIT_BAD_INPUT) -> None:
    click.echo(f"relayllm: error: {message}", err=True)
    sys.exit(code)


def handle_errors(func: F) -> F:
    """Turn errors into a message and an exit code instead of a traceback: relayllm's own say
    what to do; anything else (Ray's, an engine's) is shown in short, its traceback goes to
    the log file (on the console with --verbose)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except ConfigError as exc:
            fail(str(exc), EXIT_BAD_INPUT)
        except RelayLLMError as exc:
            fail(str(exc), EXIT_FAILED)
        except click.ClickException:  # a usage error: click says it (exit 2, with the usage)
            raise
        except KeyboardInterrupt:
            fail(
                "interrupted; the rows already written stay (a .jsonl output: run again with "
                "--resume)",
                130,
            )
        except Exception as exc:
            fail(unexpected(exc, kwargs.get("verbose", False)), EXIT_FAILED)

    return wrapper  # type: ignore[return-value]


def unexpected(exc: BaseException, verbose: bool) -> str:
    """A short account of an error relayllm did not foresee; the traceback to the log."""
    import traceback

    from relayllm import logs

    details = "".join(traceback.format_exception(exc))
    path = logs.log_file() if not verbose else None
    if verbose or path is None:
        sys.stderr.write(details)
        where = "the traceback is above"
    else:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(details)
        where = f"the traceback is in {path}"
    text = describe_exception(exc).splitlines()[0]  # "Type: the first line"
    if len(text) > 300:
        text = text[:297] + "..."
    return f"{text} ({where})"


def not_running_advice(name: str, running: list[str], address: str | None) -> str:
    """A CLI user's advice for a deployment name that is not running where we looked."""
    where = f"the Ray cluster at {address}" if address else "this Ray cluster"
    listed = ", ".join(running) if running else "none"
    return (
        f"no relayllm deployment named {name!r} is running on {where} (running: {listed}). "
        f"Start it with `relayllm deploy PIPELINE.yaml --address HOST:PORT` (a pipeline file "
        f"that declares it), or give this command --config PIPELINE.yaml to start it for "
        f"this run; if it runs on another cluster, pass that cluster's --address HOST:PORT "
        f"(or set RAY_ADDRESS)."
    )


def connect(
    address: str | None,
    verbose: bool,
    *,
    existing_cluster: bool = False,
    start_serve: bool = True,
    console: Console | None = None,
) -> str:
    """The CLI's way to :func:`relayllm.cluster.connect`: logs set up for a command (quiet
    unless ``verbose``), a phase line while connecting and one naming the cluster connected
    to, relayllm's progress bars instead of Ray Data's. ``existing_cluster``: fail instead of
    starting a throw-away local cluster (long-lived deployments need one that outlives this
    command); without an address that is whichever cluster Ray finds running on this machine,
    so the line says so. ``start_serve=False``: a command that only reads (``status``)
    changes nothing on the cluster. Returns the cluster's address."""
    import time

    import ray

    from relayllm import cluster, logs
    from relayllm.cli.progress import elapsed, install_callback

    console = console or Console()
    address = address or os.environ.get(cluster.ADDRESS_ENV)
    logs.configure_logging(verbose=verbose)
    logs.send_stderr_to_log()
    said = logs.announce("--verbose")
    if said:
        console.say(said.removeprefix("relayllm: "))
    found_here = address in (None, "auto")  # "auto": the cluster running on this machine
    if not found_here:
        where = f"the Ray cluster at {address}"
    elif existing_cluster or address == "auto":
        where = "a running Ray cluster"
    else:
        where = "Ray (a running local cluster, else a new one)"
    options = {"existing_cluster": existing_cluster, "start_serve": start_serve}
    if ray.is_initialized():
        found = cluster.connect(address, quiet=not verbose, **options)
    else:
        start = time.monotonic()
        with console.phase(f"connecting to {where}"):
            found = cluster.connect(address, quiet=not verbose, **options)
        which = f"the Ray cluster at {found if found_here else address}"
        if found_here and (existing_cluster or address == "auto"):
            which += ", found running on this machine (--address picks another)"
        console.say(f"connected to {which} in {elapsed(time.monotonic() - start)}")
    # relayllm draws one bar per step (cli/progress.py) instead of Ray Data's per-operator
    # ones; with --verbose Ray Data's own progress stays on as well.
    install_callback(ray_bars=verbose)
    logs.quiet_ray_loggers()
    return found


def check_writable(path: str) -> None:
    """Fail before anything runs if ``path`` cannot be written."""
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) or not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise ConfigError(f"cannot write {path}: its directory does not exist or is not writable")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[int] = ()) -> str:
    """A plain text table; columns whose index is in ``right`` are right-aligned."""
    cells = [[str(h) for h in headers]] + [
        ["" if c is None else str(c) for c in row] for row in rows
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        parts = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=False))
        ]
        lines.append("  ".join(parts).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
